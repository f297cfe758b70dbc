"""Trained heads as a tree drafter (docs/heads.md): the verification pass yields the next step's drafts.

A step of ``method="tree"`` with heads costs one target pass: the target verifies the tree through
:meth:`~triforce.models.Llama.forward_hidden` (with the heads' tap, for the kinds that read an
intermediate layer); the drafter keeps, per row, what its heads need from the *last accepted node*:

* ``medusa`` / ``early_exit`` / ``hidden_transfer``: the draft logits of every depth ``[B, depth, V]``
  (from ``z`` / the tapped stream / the pseudo tokens that rode in the pass);
* ``mlp``: the root state ``z`` ``[B, H]`` (its stages run while drafting, conditioned on each node's token).

Drafting a static tree: node 0 is the pending token; the children of a node at depth ``d`` are the
top-``k`` of its depth-``d`` distribution (greedy) or ``k`` i.i.d. draws from it (sampling; the
tree sampler's rule for i.i.d. children makes the output exactly the target's, whatever the heads'
quality). The first step has no state yet: its tree is the root alone (an autoregressive step whose
pass produces the drafts of the next).
"""
from __future__ import annotations

import copy
import os
import weakref

import torch

from .steps import Sampling, advance


class _Tap:
    """Reads the stream entering ``heads.layer``; for ``hidden_transfer`` also attaches ``n`` pseudo
    tokens to every node: ``T + t*n + i`` is pseudo ``i+1`` of node ``t``, a chain hanging off ``t``."""

    def __init__(self, heads, n: int):
        self.heads, self.layer, self.n, self.h = heads, heads.layer, n, None

    def __call__(self, h, parents):
        self.h = h
        if self.heads.kind != "hidden_transfer":
            return None
        B, T, H = h.shape
        n, dev = self.n, h.device
        if parents is None:  # a chain: node t's parent is t - 1
            parents = (torch.arange(T, device=dev) - 1).expand(B, T)
        t = torch.arange(T, device=dev)[:, None]
        i = torch.arange(n, device=dev)[None, :]
        extra = torch.where(i == 0, t, T + t * n + i - 1).reshape(-1).expand(B, T * n)
        return self.heads.pseudo(h, n).reshape(B, T * n, H), torch.cat([parents.long(), extra], 1)


class HeadDrafter:
    """Drafts token trees from trained heads on the target's hidden states (see the module docstring)."""

    def __init__(self, target, heads, sampling: Sampling, depth: int):
        self.target, self.heads, self.sampling, self.depth = target, heads, sampling, depth
        self.state: torch.Tensor | None = None  # per row: depth logits [B, k, V], or mlp's root state [B, H]
        self.hist: torch.Tensor | None = None   # [B, 1]: the pending token
        self._tap = _Tap(heads, depth) if heads.reads_layer else None

    @property
    def pending(self) -> torch.Tensor:
        return self.hist

    @property
    def extra_width(self) -> int:
        """Extra tokens per tree node in the verification pass (hidden_transfer's pseudo chain)."""
        return self.depth if self.heads.kind == "hidden_transfer" else 0

    def prefill(self, prompts, hist: torch.Tensor) -> None:
        self.hist, self.state = hist[:, -1:], None

    def propose_tree(self, shape: tuple[int, ...], parents_row: list[int], vocab: int):
        """-> (tokens ``[B, T]``, draft probs ``[B, T, V]`` or None, parents ``[B, T]``): the static tree
        of branching factors ``shape`` (``len(shape) <= depth``), or the root alone before any state."""
        sampling, B, dev = self.sampling, self.hist.shape[0], self.hist.device
        if self.state is None:
            shape, parents_row = (), [-1]
        T = len(parents_row)
        tokens = torch.zeros(B, T, dtype=torch.int64, device=dev)
        tokens[:, 0] = self.hist[:, 0]
        probs = None if sampling.greedy else torch.zeros(B, T, vocab, device=dev)
        parents = torch.tensor(parents_row, device=dev).expand(B, T)
        level, n = [0], 1
        states = self.state[:, None] if self.heads.kind == "mlp" and shape else None  # [B, |level|, H]: parents
        for depth, k in enumerate(shape):
            if states is not None:  # mlp: stage `depth` on (parent state, node token) for every node of the level
                states = self.heads.stage(self.target, depth, states, tokens[:, level])
                logits = self.heads.stage_logits(self.target, depth, states)  # [B, |level|, V]
            else:
                logits = self.state[:, depth: depth + 1].expand(B, len(level), -1)
            child, p = sampling.sample(logits.reshape(B * len(level), -1), k)
            tokens[:, n: n + len(level) * k] = child.view(B, len(level) * k)
            if probs is not None:
                probs[:, level] = p.view(B, len(level), -1)
            if states is not None:
                states = states.repeat_interleave(k, 1)
            level = list(range(n, n + len(level) * k))
            n += len(level)
        return tokens, probs, parents

    def tree_pass(self, tree: torch.Tensor, cache, parents: torch.Tensor) -> torch.Tensor:
        """The target's verification forward -> float32 logits ``[B, T, V]`` of the tree's nodes; keeps
        the hidden states the next drafts are read from."""
        T = tree.shape[1]
        tap = self._tap
        if tap is not None:
            tap.n = self.extra_width
        self._z = self.target.forward_hidden(tree, cache, parents, tap=tap)
        self._T = T
        return self.target.head(self._z[:, :T])

    def commit(self, tokens: torch.Tensor, adv: torch.Tensor, path: torch.Tensor | None = None, **_) -> None:
        """The verifier emitted ``tokens[b, :adv[b]]`` along ``path``; rows with ``adv = 0`` keep their state."""
        B, dev = adv.shape[0], adv.device
        rows = torch.arange(B, device=dev)
        node = path.long()[rows, (adv.long() - 1).clamp(min=0)]  # the last accepted node
        kind = self.heads.kind
        if kind == "mlp":
            new = self._z[rows, node]
        elif kind == "medusa":
            new = self.heads.depth_logits(self.target, self._z[rows, node])
        elif kind == "early_exit":
            new = self.heads.depth_logits(self.target, self._tap.h[rows, node])
        else:  # hidden_transfer: the pseudo chain of the accepted node
            k = self.extra_width
            idx = self._T + node[:, None] * k + torch.arange(k, device=dev)
            new = self.target.head(self._z[rows[:, None], idx])
        moved = adv > 0
        if self.state is None:
            self.state = new
        else:
            self.state = torch.where(moved.view(B, *([1] * (new.dim() - 1))), new, self.state)
        self.hist = advance(self.hist, tokens, adv, 1)
        self._z = None
        if self._tap is not None:
            self._tap.h = None


_LOADED: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # target -> {(source, dtype, device): heads}


def heads_for(target, draft):
    """``draft``: a :class:`~triforce.heads.DraftHeads`, a kind name (the set shipped for ``target``) or a
    path to a saved set -> the heads on the target's device and dtype, checked against the target (a
    loaded set is cached while the target lives; a given object is copied on every call, so edits to it
    between calls count)."""
    from triforce.heads import DraftHeads, KINDS, load_heads, shipped_heads_path

    p = next(target.parameters())
    if isinstance(draft, DraftHeads):
        draft.check_target(target)
        return copy.deepcopy(draft).to(device=p.device, dtype=p.dtype).eval()
    source = shipped_heads_path(target, draft) if draft in KINDS else os.fspath(draft)
    loaded = _LOADED.setdefault(target, {})
    key = (str(source), p.dtype, p.device)
    if key not in loaded:
        loaded[key] = load_heads(source, target).to(device=p.device, dtype=p.dtype).eval()
    return loaded[key]
