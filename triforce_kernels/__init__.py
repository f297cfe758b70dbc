"""triforce_kernels: low-level ops for lossless long-context speculative decoding.

Plain tensors in, tensors out, no model state. Every op validates its inputs, picks a backend
(``reference`` / ``triton`` / ``cpu`` / ``cuda``; see :mod:`triforce_kernels._backend`) and runs as
a ``torch.ops.triforce.*`` custom op, so it works under ``torch.compile`` and CUDA graphs.

    import triforce_kernels as tk
    means = tk.chunk_mean_keys(k_cache, chunk_size=8)

``python -m triforce_kernels`` prints the backends available on this machine.
"""
__version__ = "0.1.0"

from ._backend import (  # noqa: F401
    BACKENDS,
    BackendUnavailableError,
    available_backends,
    backend_status,
    op_backends,
)

# ---- retrieval cache (docs/design.md 3.1)
from .chunk_mean_keys import chunk_mean_keys  # noqa: F401
from .score_chunks import score_chunks  # noqa: F401
from .select_chunks import select_chunks  # noqa: F401
from .gather_chunks import gather_chunks  # noqa: F401
from .build_retrieval_cache import build_retrieval_cache  # noqa: F401

# ---- verification attention (docs/design.md 3.2)
from .tree_mask import tree_attention_mask, tree_depths  # noqa: F401
from .verify_attention import verify_attention  # noqa: F401

# ---- accept / reject sampling (docs/design.md 3.3)
from .logits_to_probs import logits_to_probs  # noqa: F401
from .chain_sample import chain_greedy_verify, chain_speculative_sample  # noqa: F401
from .tree_sample import tree_greedy_verify, tree_speculative_sample  # noqa: F401

# ----
