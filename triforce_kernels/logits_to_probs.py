"""``tk.logits_to_probs``: the one logits -> probabilities transform every model level applies
(docs/design.md 3.3).

Backends: ``reference`` only, by design. The op is a copy that maps NaN to -inf, an optional top-k
(one ``topk``), a shift by the row max and a temperature scale (in place), an optional top-p (one
``sort`` + ``cumsum``) and a softmax: about 7 passes over ``[B, V]`` that PyTorch already runs at
memory bandwidth on both CPU and GPU, with no host synchronisation, so a fused kernel would save a few
microseconds per step next to a model forward that reads the whole weight set (at ``[320, 49152]``
on two CPU cores it takes 31 ms; SmolLM2's LM head alone over those rows, 162 ms). The reference is
therefore the production implementation (vectorised, any device).

Files (no triton / C++ backend, see above):
    reference  triforce_kernels/reference/sampling.py (logits_to_probs)
    tests      tests/test_sampling.py (the logits_to_probs section)
"""
import torch

from ._backend import custom_op, eager_call, implementation, register, resolve
from ._validate import check_float_tensor
from .reference.sampling import logits_to_probs as _reference

register("logits_to_probs", "reference")(_reference)


@custom_op("triforce::logits_to_probs")
def _logits_to_probs_op(logits: torch.Tensor, temperature: float, top_k: int, top_p: float,
                        backend: str) -> torch.Tensor:
    return implementation("logits_to_probs", backend)(
        logits, temperature, top_k if top_k > 0 else None, top_p if top_p < 1.0 else None)


@_logits_to_probs_op.register_fake
def _(logits, temperature, top_k, top_p, backend):
    return logits.new_empty(logits.shape, dtype=torch.float32)


def logits_to_probs(logits: torch.Tensor, temperature: float = 1.0, top_k: int | None = None,
                    top_p: float | None = None, *, backend: str | None = None) -> torch.Tensor:
    """Next-token probabilities from logits: temperature, then top-k, then top-p, then softmax.

    * ``temperature == 0``: greedy, a one-hot of the argmax (ties -> lowest index, NaN counts as
      ``-inf``), so sampling from it reproduces greedy decoding exactly.
    * ``top_k``: keep the tokens whose logit is ``>=`` the k-th largest (ties with it are kept).
    * ``top_p``: keep token x iff the probability mass of the tokens *strictly more probable* than x
      is ``< top_p`` (so the most probable token is always kept, and ties are kept or dropped
      together), then renormalise. Applied to the distribution left by top-k.

    The transform is applied identically to every model of a speculative hierarchy, so the drafts'
    and the target's distributions are comparable.

    Special values: a NaN logit counts as ``-inf`` (probability 0), as in the argmax. ``+inf``
    logits share the row's mass equally (the softmax's limit). Any positive temperature and any
    finite logits give a distribution: the logits are shifted by the row max before the division,
    so nothing overflows. A row with no logit above ``-inf`` (all NaN / ``-inf``) yields NaN
    probabilities; the samplers turn such rows into valid ids.

    Args:
        logits: ``[..., V]`` float32 / float16 / bfloat16.
        temperature: finite, ``>= 0``.
        top_k: ``None`` or an int ``>= 1``.
        top_p: ``None`` or a float in ``(0, 1]``.
        backend: ``"reference" | None``.

    Returns:
        float32 ``[..., V]``, rows summing to 1.

    Example:
        >>> probs = tk.logits_to_probs(logits[:, -1], temperature=0.7, top_p=0.9)   # [B, V]
    """
    check_float_tensor("logits", logits)
    if logits.dim() < 1 or logits.shape[-1] < 1:
        raise ValueError(f"logits must have shape [..., V] with V >= 1, got {list(logits.shape)}")
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)):
        raise TypeError(f"temperature must be a float, got {type(temperature).__name__}")
    if not 0 <= temperature < float("inf"):
        raise ValueError(f"temperature must be a finite number >= 0, got {temperature}")
    if top_k is not None:
        if isinstance(top_k, bool) or not isinstance(top_k, int):
            raise TypeError(f"top_k must be an int or None, got {type(top_k).__name__}")
        if top_k < 1:
            raise ValueError(f"top_k must be >= 1, got {top_k}")
    if top_p is not None:
        if isinstance(top_p, bool) or not isinstance(top_p, (int, float)):
            raise TypeError(f"top_p must be a float or None, got {type(top_p).__name__}")
        if not 0 < top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    return eager_call(_logits_to_probs_op, logits, float(temperature), 0 if top_k is None else top_k,
                               1.0 if top_p is None else float(top_p),
                               resolve("logits_to_probs", backend, logits.device))
