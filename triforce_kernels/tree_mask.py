"""``tk.tree_attention_mask`` and ``tk.tree_depths``: token-tree metadata for tree verification
(docs/design.md 3.2). Built once per verification step and shared by every layer.

Files (no backends: the vectorised PyTorch here runs on any device):
    reference  triforce_kernels/reference/tree_mask.py
    tests      tests/test_tree_mask.py
"""
from __future__ import annotations

import torch

from ._validate import check_tensor

_INT_DTYPES = (torch.int32, torch.int64)


def _check_shape(parents) -> None:
    check_tensor("parents", parents, ndim=2, dtypes=_INT_DTYPES)
    if parents.shape[1] < 1:
        raise ValueError(f"parents must have at least one node (the root) per row, got shape {list(parents.shape)}")


def _check_tree(parents: torch.Tensor) -> None:
    """The tree invariant. It needs the values, so this is one host synchronisation (a single
    ``.item()``) on GPU tensors: call the helpers once per step."""
    t = torch.arange(parents.shape[1], device=parents.device)
    ok = (parents[:, 0] == -1).all() & ((parents[:, 1:] >= 0) & (parents[:, 1:] < t[1:])).all()
    if not bool(ok.item()):
        raise ValueError("parents must describe a tree in topological order: parents[b, 0] == -1 (the root) "
                         "and 0 <= parents[b, t] < t for t > 0")


def _ancestor_or_self(parents: torch.Tensor) -> torch.Tensor:
    # Reachability by repeated squaring: M = I + A (A[t, parent(t)] = 1); after k squarings M holds
    # every ancestor up to 2^k edges away, and no path is longer than T - 1 edges: ceil(log2 T) steps
    # of a [T, T] batched matmul instead of a T-step sequential walk.
    B, T = parents.shape
    eye = torch.eye(T, device=parents.device, dtype=torch.float32).expand(B, T, T)
    m = eye.clone()
    idx = parents[:, 1:].long().clamp_min(0)
    m[:, 1:].scatter_(2, idx[..., None], 1.0)
    steps = 0
    while (1 << steps) < T:
        m = (torch.bmm(m, m) > 0).to(torch.float32)
        steps += 1
    return m > 0


def _checked_mask(parents: torch.Tensor) -> torch.Tensor:
    _check_tree(parents)
    return _ancestor_or_self(parents)


def tree_attention_mask_trusted(parents: torch.Tensor) -> torch.Tensor:
    """``tree_attention_mask(parents)`` without the checks: no read of the values (no host sync on a
    GPU), for callers whose trees are valid by construction (the model layer's ``TokenTree``, built
    by the engines). An invalid ``parents`` gives a wrong mask here, not an error."""
    return _ancestor_or_self(parents)


# A custom op, so that under torch.compile / torch.export the check's read of the values happens when the
# op runs, on real tensors, and not while tracing (where it would break a fullgraph=True graph). Eager
# calls skip the op's dispatch (~20 us of ~90).
@torch.library.custom_op("triforce::tree_attention_mask", mutates_args=())
def _tree_attention_mask_op(parents: torch.Tensor) -> torch.Tensor:
    return _checked_mask(parents)


def _mask(parents: torch.Tensor) -> torch.Tensor:
    _check_shape(parents)
    return _tree_attention_mask_op(parents) if torch.compiler.is_compiling() else _checked_mask(parents)


@_tree_attention_mask_op.register_fake
def _(parents):
    B, T = parents.shape
    return parents.new_empty((B, T, T), dtype=torch.bool)


def tree_attention_mask(parents: torch.Tensor) -> torch.Tensor:
    """Ancestor-or-self mask of a token tree, the ``tree_mask`` argument of ``tk.verify_attention``.

    ``mask[b, t, s]`` is True iff node ``s`` is node ``t`` or one of its ancestors. Node 0 is the root.
    Example (root 0 with children 1 and 2; 3 is a child of 1)::

        parents = [[-1, 0, 0, 1]]        mask[0] = 1 . . .
                                                   1 1 . .
                                                   1 . 1 .
                                                   1 1 . 1

    Args:
        parents: int32/int64 ``[B, T]``, ``T >= 1``: ``parents[b, 0] == -1`` and
            ``0 <= parents[b, t] < t`` for ``t > 0`` (topological order). Checking this reads the
            values: one host synchronisation on GPU tensors; violations raise ``ValueError``.

    Returns:
        bool ``[B, T, T]`` on ``parents``' device.

    Example:
        >>> mask = tk.tree_attention_mask(torch.tensor([[-1, 0, 0, 1]]))
    """
    return _mask(parents)


def tree_depths(parents: torch.Tensor) -> torch.Tensor:
    """Depth of every tree node (root 0): its RoPE position is ``base + depth``.

    Args:
        parents: as for :func:`tree_attention_mask` (validated the same way; one host sync on GPU).

    Returns:
        int32 ``[B, T]``.

    Example:
        >>> tk.tree_depths(torch.tensor([[-1, 0, 0, 1]]))   # tensor([[0, 1, 1, 2]], dtype=torch.int32)
    """
    return (_mask(parents).sum(-1) - 1).to(torch.int32)
