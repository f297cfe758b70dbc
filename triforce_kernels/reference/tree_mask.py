"""Naive oracles of ``tk.tree_attention_mask`` and ``tk.tree_depths`` (docs/design.md 3.2): walk the
parents one node at a time."""
from __future__ import annotations

import torch


def tree_attention_mask(parents: torch.Tensor) -> torch.Tensor:
    """Reference: ``mask[b, t, s]`` is True iff node ``s`` is ``t`` or an ancestor of ``t`` (walks parents)."""
    B, T = parents.shape
    p = parents.cpu().tolist()
    mask = torch.zeros(B, T, T, dtype=torch.bool)
    for b in range(B):
        for t in range(T):
            s = t
            while s >= 0:
                mask[b, t, s] = True
                s = p[b][s]
    return mask.to(parents.device)


def tree_depths(parents: torch.Tensor) -> torch.Tensor:
    """Reference: number of edges from the root (node 0) to each node, int32 ``[B, T]``."""
    return (tree_attention_mask(parents).sum(-1) - 1).to(torch.int32)
