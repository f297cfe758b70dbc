"""Tree speculative verification (docs/design.md 3.3): ``tk.tree_speculative_sample`` (SpecInfer
multi-draft recursive rejection sampling) and ``tk.tree_greedy_verify``.

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
from .chain_sample import INDEX_DTYPES, check_sampler_inputs
from .reference import sampling as _ref

for _op in ("tree_speculative_sample", "tree_greedy_verify"):
    register(_op, "reference")(getattr(_ref, _op))
    register_lazy(_op, "triton", "triforce_kernels.triton.sampling")


@register("tree_speculative_sample", "cpu")
@register("tree_speculative_sample", "cuda")
def _native_sample(tree_tokens, parents, draft_probs, target_probs, uniforms):
    return torch.ops.triforce_C.tree_speculative_sample(tree_tokens, parents, draft_probs, target_probs, uniforms)


@register("tree_greedy_verify", "cpu")
@register("tree_greedy_verify", "cuda")
def _native_greedy(tree_tokens, parents, target_logits):
    return torch.ops.triforce_C.tree_greedy_verify(tree_tokens, parents, target_logits)


def _fake_outputs(tree_tokens):
    B, T = tree_tokens.shape
    return (tree_tokens.new_empty((B, T), dtype=torch.int32), tree_tokens.new_empty((B, T), dtype=torch.int64),
            tree_tokens.new_empty((B,), dtype=torch.int32))


@custom_op("triforce::tree_speculative_sample")
def _tree_sample_op(tree_tokens: torch.Tensor, parents: torch.Tensor, draft_probs: torch.Tensor | None,
                    target_probs: torch.Tensor, uniforms: torch.Tensor,
                    backend: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return implementation("tree_speculative_sample", backend)(tree_tokens, parents, draft_probs, target_probs, uniforms)


@_tree_sample_op.register_fake
def _(tree_tokens, parents, draft_probs, target_probs, uniforms, backend):
    return _fake_outputs(tree_tokens)


@custom_op("triforce::tree_greedy_verify")
def _tree_greedy_op(tree_tokens: torch.Tensor, parents: torch.Tensor, target_logits: torch.Tensor,
                    backend: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return implementation("tree_greedy_verify", backend)(tree_tokens, parents, target_logits)


@_tree_greedy_op.register_fake
def _(tree_tokens, parents, target_logits, backend):
    return _fake_outputs(tree_tokens)


def _check_tree(tree_tokens, parents):
    check_tensor("tree_tokens", tree_tokens, ndim=2, dtypes=INDEX_DTYPES)
    B, T = tree_tokens.shape
    if T < 1:
        raise ValueError("tree_tokens must have at least the root node (T >= 1)")
    check_tensor("parents", parents, dtypes=INDEX_DTYPES, device=tree_tokens.device, shape=(B, T))


def tree_speculative_sample(tree_tokens: torch.Tensor, parents: torch.Tensor, draft_probs: torch.Tensor | None,
                            target_probs: torch.Tensor, uniforms: torch.Tensor | None = None,
                            generator: torch.Generator | None = None, *, backend: str | None = None,
                            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Lossless verification of a token tree by recursive rejection sampling (SpecInfer).

    Tree: node 0 is the root (the last accepted token); node t > 0 is a child of ``parents[b, t]``,
    which must be in ``[0, t)`` (topological order; a node whose parent is not is never reached).
    ``target_probs[b, t]`` / ``draft_probs[b, t]`` are the target / draft next-token distributions
    after node t; the children of t were drafted i.i.d. from ``draft_probs[b, t]`` (duplicates
    allowed), or are deterministic (any distinct or repeated tokens) when ``draft_probs`` is None.

    Walk, starting at the root, with ``p`` = target at the current node, ``q`` = its draft, residual
    ``r = p``: for each child c in increasing index order with token x: accept iff
    ``u[c,0] * q(x) < r(x)`` (x outside ``[0, V)``: rejected unread); on rejection
    ``r <- normalize(max(r - q, 0))`` (deterministic: ``q`` one-hot at x, i.e. remove x from r).
    If a child is accepted, move to it and repeat; otherwise emit a sample of ``r`` (inverse CDF
    with ``u[cur,1]``; all-zero ``r`` samples ``p``) and stop. At a leaf this is the bonus token.
    The emitted sequence then has exactly the target's distribution. A chain-shaped tree gives
    exactly :func:`chain_speculative_sample`'s result with the uniforms re-indexed by node.
    Numerics, cleaning of NaN / out-of-range inputs and fallbacks as in
    :func:`chain_speculative_sample`; every emitted id is in ``[0, V)``; no host synchronisation.

    Output length: the accepted depth is data-dependent, so the outputs have the static bound
    ``Dmax + 1 = T`` columns (a T-node tree is at most T - 1 deep), ``-1`` padded; slice to
    ``num_accepted.max() + 1`` if you can afford a host sync.

    Args:
        tree_tokens: int64 / int32 ``[B, T]``; ``tree_tokens[b, 0]`` (the root) is not verified.
        parents: int64 / int32 ``[B, T]``; ``parents[b, 0]`` is ignored (``-1`` by convention).
        draft_probs: float32 ``[B, T, V]`` or ``None`` (deterministic children).
        target_probs: float32 ``[B, T, V]``.
        uniforms: float32 ``[B, T, 2]`` in ``[0, 1)``: ``u[t,0]`` is node t's accept coin (used
            when its parent tests it; ``u[0,0]`` unused), ``u[t,1]`` the final-sample coin used when
            the walk stops at node t. Drawn from ``generator`` when ``None``.
        generator: ``torch.Generator`` on the tensors' device, used only when ``uniforms`` is None.
        backend: ``"reference" | "triton" | "cpu" | "cuda" | None``.

    Returns:
        ``(path, tokens, num_accepted)``: int32 ``[B, T]`` accepted node indices starting with the
        root (``path[b, :num_accepted[b]+1]``), int64 ``[B, T]`` emitted tokens (the accepted
        children's tokens, then the final sample: ``tokens[b, :num_accepted[b]+1]``), both ``-1``
        padded; int32 ``[B]`` number of accepted children.

    Example:
        >>> # root with two i.i.d. children (1, 2) and one grandchild (3) under child 1
        >>> parents = torch.tensor([[-1, 0, 0, 1]])
        >>> path, tokens, n_acc = tk.tree_speculative_sample(tree_tokens, parents, q, p, generator=g)
    """
    _check_tree(tree_tokens, parents)
    T = tree_tokens.shape[1]
    uniforms = check_sampler_inputs(tree_tokens, draft_probs, target_probs, uniforms, generator, T)
    return eager_call(_tree_sample_op, tree_tokens, parents, draft_probs, target_probs, uniforms,
                           resolve("tree_speculative_sample", backend, target_probs.device))


def tree_greedy_verify(tree_tokens: torch.Tensor, parents: torch.Tensor, target_logits: torch.Tensor, *,
                       backend: str | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Greedy verification of a token tree: from the root, move to the first child (lowest index)
    whose token equals ``argmax target_logits[b, cur]`` (ties -> lowest index, NaN as ``-inf``);
    when none does, emit that argmax and stop.

    Args:
        tree_tokens, parents: as in :func:`tree_speculative_sample`.
        target_logits: float32 / float16 / bfloat16 ``[B, T, V]``.
        backend: ``"reference" | "triton" | "cpu" | "cuda" | None``.

    Returns:
        ``(path, tokens, num_accepted)`` as in :func:`tree_speculative_sample` (``[B, T]`` outputs).

    Example:
        >>> path, tokens, n_acc = tk.tree_greedy_verify(tree_tokens, parents, logits)
    """
    _check_tree(tree_tokens, parents)
    B, T = tree_tokens.shape
    check_tensor("target_logits", target_logits, ndim=3, dtypes=FLOAT_DTYPES, device=tree_tokens.device)
    if target_logits.shape[-1] < 1:
        raise ValueError("target_logits must have a vocabulary dimension V >= 1")
    check_tensor("target_logits", target_logits, shape=(B, T, None))
    return eager_call(_tree_greedy_op, tree_tokens, parents, target_logits, resolve("tree_greedy_verify", backend, target_logits.device))
