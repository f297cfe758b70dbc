"""Benchmarks (``python -m bench.<name>``). Importing ``triforce`` here, before any benchmark imports
torch, gives every benchmark the product's OpenMP setting (``OMP_WAIT_POLICY=PASSIVE`` unless set,
docs/development.md "CPU threads"): kernels and baselines are measured as a ``triforce`` user runs
them, and the kernels' parallel-region threshold matches what the OpenMP runtime does."""
import triforce  # noqa: F401
