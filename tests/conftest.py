"""Test set-up: Triton in the interpreter when there is no GPU, hypothesis profiles.

Profiles (HYPOTHESIS_PROFILE env var): ``ci`` (default; derandomized, bounded examples, no deadline)
and ``fuzz`` (random, many examples: ``HYPOTHESIS_PROFILE=fuzz pytest tests``; ``TRIFORCE_FUZZ_EXAMPLES``
examples per test, default 2000).
"""
import os

import torch

if not torch.cuda.is_available():
    # Must happen before anything imports triton.
    os.environ.setdefault("TRITON_INTERPRET", "1")

from hypothesis import HealthCheck, settings  # noqa: E402

settings.register_profile(
    "ci",
    derandomize=True,
    max_examples=int(os.environ.get("TRIFORCE_CI_EXAMPLES", "12")),
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
)
settings.register_profile(
    "fuzz",
    max_examples=int(os.environ.get("TRIFORCE_FUZZ_EXAMPLES", "2000")),
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
