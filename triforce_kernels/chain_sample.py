"""Chain speculative verification (docs/design.md 3.3): ``tk.chain_speculative_sample`` (lossless
accept / reject with residual resampling) and ``tk.chain_greedy_verify``.

Files:
    reference  triforce_kernels/reference/sampling.py
    triton     triforce_kernels/triton/sampling.py
    cpu        csrc/include/triforce/sampling.h (kernels), csrc/cpu/sampling.cpp (launchers)
    cuda       csrc/include/triforce/sampling.cuh (kernels), csrc/cuda/sampling.cu (launchers);
               csrc/sampling_checks.h (checks shared by both launchers)
    tests      tests/test_sampling.py, tests/test_sampling_stats.py, csrc/tests/test_sampling.cpp,
               csrc/tests/sampling_check.cu (CUDA compile check)
    benchmark  bench/bench_sampling.py
"""
from __future__ import annotations

import torch

from ._backend import custom_op, eager_call, implementation, register, register_lazy, resolve
from ._validate import FLOAT_DTYPES, check_tensor
from .reference import sampling as _ref

INDEX_DTYPES = (torch.int64, torch.int32)

for _op in ("chain_speculative_sample", "chain_greedy_verify"):
    register(_op, "reference")(getattr(_ref, _op))
    register_lazy(_op, "triton", "triforce_kernels.triton.sampling")


@register("chain_speculative_sample", "cpu")
@register("chain_speculative_sample", "cuda")
def _native_sample(draft_tokens, draft_probs, target_probs, uniforms):
    return torch.ops.triforce_C.chain_speculative_sample(draft_tokens, draft_probs, target_probs, uniforms)


@register("chain_greedy_verify", "cpu")
@register("chain_greedy_verify", "cuda")
def _native_greedy(draft_tokens, target_logits):
    return torch.ops.triforce_C.chain_greedy_verify(draft_tokens, target_logits)


@custom_op("triforce::chain_speculative_sample")
def _chain_sample_op(draft_tokens: torch.Tensor, draft_probs: torch.Tensor | None, target_probs: torch.Tensor,
                     uniforms: torch.Tensor, backend: str) -> tuple[torch.Tensor, torch.Tensor]:
    return implementation("chain_speculative_sample", backend)(draft_tokens, draft_probs, target_probs, uniforms)


@_chain_sample_op.register_fake
def _(draft_tokens, draft_probs, target_probs, uniforms, backend):
    B, n = draft_tokens.shape
    return (draft_tokens.new_empty((B, n + 1), dtype=torch.int64), draft_tokens.new_empty((B,), dtype=torch.int32))


@custom_op("triforce::chain_greedy_verify")
def _chain_greedy_op(draft_tokens: torch.Tensor, target_logits: torch.Tensor,
                     backend: str) -> tuple[torch.Tensor, torch.Tensor]:
    return implementation("chain_greedy_verify", backend)(draft_tokens, target_logits)


@_chain_greedy_op.register_fake
def _(draft_tokens, target_logits, backend):
    B, n = draft_tokens.shape
    return (draft_tokens.new_empty((B, n + 1), dtype=torch.int64), draft_tokens.new_empty((B,), dtype=torch.int32))


def check_sampler_inputs(tokens, draft_probs, target_probs, uniforms, generator, rows):
    """Shared validation of the chain / tree samplers, after the caller has checked ``tokens`` ([B, T]
    int). ``rows``: rows of ``target_probs`` and ``uniforms`` (chain: T + 1; tree: T). Returns the
    uniforms, drawn from ``generator`` when None."""
    B, T = tokens.shape
    dev = tokens.device
    check_tensor("target_probs", target_probs, ndim=3, dtypes=(torch.float32,), device=dev)
    V = target_probs.shape[-1]
    if V < 1:
        raise ValueError("target_probs must have a vocabulary dimension V >= 1")
    check_tensor("target_probs", target_probs, shape=(B, rows, V))
    if draft_probs is not None:
        check_tensor("draft_probs", draft_probs, dtypes=(torch.float32,), device=dev, shape=(B, T, V))
    if uniforms is not None:
        check_tensor("uniforms", uniforms, dtypes=(torch.float32,), device=dev, shape=(B, rows, 2))
    elif generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator or None, got {type(generator).__name__}")
    if uniforms is None:
        uniforms = torch.rand((B, rows, 2), generator=generator, device=dev, dtype=torch.float32)
    return uniforms


def chain_speculative_sample(draft_tokens: torch.Tensor, draft_probs: torch.Tensor | None,
                             target_probs: torch.Tensor, uniforms: torch.Tensor | None = None,
                             generator: torch.Generator | None = None, *,
                             backend: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Lossless speculative sampling of a chain of n draft tokens (Leviathan et al. / Chen et al.).

    Per row, for i = 0 .. n-1: accept draft ``x_i`` iff ``u[i,0] * q_i(x_i) < p_i(x_i)`` (exact
    float64 comparison; ``q = 1`` for a deterministic draft), so a token with ``p_i(x_i) = 0`` is
    never accepted, even with ``u = 0``; an id outside ``[0, V)`` is rejected without being read. At
    the first rejection, emit a sample of the residual ``max(p_i - q_i, 0)`` (deterministic draft:
    ``p_i`` without ``x_i``) by inverse CDF with ``u[i,1]``: the smallest x whose cumulative residual
    exceeds ``u[i,1] * total``; an all-zero residual samples ``p_i`` instead. If all n are accepted,
    emit a bonus token sampled from ``p_n`` with ``u[n,1]``. The emitted tokens are then distributed
    exactly as if sampled from the target one by one.

    Robustness: probabilities are cleaned (NaN / negative -> 0, > 1 -> 1) and uniforms clamped into
    ``[0, 1)`` (NaN -> 0); a row whose target is all zero / NaN emits ``min(floor(u * V), V - 1)``.
    Every emitted id is in ``[0, V)``. No host synchronisation (CUDA-graph capturable); one kernel
    launch on GPU. See ``triforce_kernels/reference/sampling.py`` for the float64 numerics.

    Args:
        draft_tokens: int64 / int32 ``[B, n]`` (n may be 0: bonus only).
        draft_probs: float32 ``[B, n, V]`` (``draft_probs[b, i]`` is the distribution ``x_i`` was
            drawn from), or ``None`` for a deterministic (greedy / one-hot) draft.
        target_probs: float32 ``[B, n+1, V]``: ``target_probs[b, i]`` is the target's distribution
            of token i (``i = n``: after the last draft).
        uniforms: float32 ``[B, n+1, 2]`` in ``[0, 1)``: ``u[i,0]`` the accept coin of draft i,
            ``u[i,1]`` the residual coin at position i (``u[n,1]``: the bonus coin); drawn with
            ``torch.rand(..., generator=generator)`` when ``None``.
        generator: ``torch.Generator`` on the tensors' device, used only when ``uniforms`` is None.
        backend: ``"reference" | "triton" | "cpu" | "cuda" | None``.

    Returns:
        ``(tokens, num_accepted)``: int64 ``[B, n+1]`` with the ``num_accepted[b] + 1`` emitted
        tokens first and ``-1`` after them; int32 ``[B]``.

    Example:
        >>> tokens, n_acc = tk.chain_speculative_sample(draft, q, p, generator=g)
        >>> # row b continues with tokens[b, :n_acc[b] + 1]
    """
    check_tensor("draft_tokens", draft_tokens, ndim=2, dtypes=INDEX_DTYPES)
    n = draft_tokens.shape[1]
    uniforms = check_sampler_inputs(draft_tokens, draft_probs, target_probs, uniforms, generator, n + 1)
    return eager_call(_chain_sample_op, draft_tokens, draft_probs, target_probs, uniforms,
                            resolve("chain_speculative_sample", backend, target_probs.device))


def chain_greedy_verify(draft_tokens: torch.Tensor, target_logits: torch.Tensor, *,
                        backend: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy verification of a chain: accept while ``draft_tokens[b, i] == argmax target_logits[b, i]``
    (ties -> lowest index, NaN counts as ``-inf``); emit the argmax at the first mismatch, or the
    bonus argmax ``argmax target_logits[b, n]`` when all n match.

    Args:
        draft_tokens: int64 / int32 ``[B, n]``.
        target_logits: float32 / float16 / bfloat16 ``[B, n+1, V]`` (logits or probabilities).
        backend: ``"reference" | "triton" | "cpu" | "cuda" | None``.

    Returns:
        ``(tokens, num_accepted)``: int64 ``[B, n+1]`` (``-1`` after the emitted ones), int32 ``[B]``.

    Example:
        >>> tokens, n_acc = tk.chain_greedy_verify(draft, logits)   # logits: target forward [B, n+1, V]
    """
    check_tensor("draft_tokens", draft_tokens, ndim=2, dtypes=INDEX_DTYPES)
    B, n = draft_tokens.shape
    check_tensor("target_logits", target_logits, ndim=3, dtypes=FLOAT_DTYPES, device=draft_tokens.device)
    if target_logits.shape[-1] < 1:
        raise ValueError("target_logits must have a vocabulary dimension V >= 1")
    check_tensor("target_logits", target_logits, shape=(B, n + 1, None))
    return eager_call(_chain_greedy_op, draft_tokens, target_logits, resolve("chain_greedy_verify", backend, target_logits.device))
