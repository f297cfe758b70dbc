"""The drafting side of every speculative method: one owner of a draft source's model, cache and
pending history, so that each method's step reads *propose, verify, commit*.

Bookkeeping (one rule for every drafter, no host sync):

* Its verifier has committed the sequence ``s[0 .. c-1]``; ``s[c-1]`` is the *pending* token (sampled
  by the last verification, in no cache yet).
* ``hist`` ``[B, H]`` holds the last ``H`` committed tokens; the drafter's cache holds the ``c - H``
  before them. ``propose`` first feeds all of ``hist`` (catch-up: one fixed width for every row, so a
  ragged batch never needs per-row shapes), then drafts.
* ``commit(tokens, adv)``: the verifier accepted and emitted ``tokens[b, :adv[b]]`` (``adv = 0`` for a
  row that did not advance). The cache keeps ``adv`` of the tokens this step appended, counted from
  its current length (a StreamingLLM cache may compact between forwards, so absolute lengths are not
  comparable), and ``hist`` becomes the last ``H`` tokens of the longer sequence. This needs
  ``adv <= H + appended`` kept tokens, which sizes ``H`` per method.
* ``rebase(hist, delta)``: the verifier's sequence changed by ``delta`` tokens per row (negative: cut
  back) and now ends with ``hist`` (TriForce's bottom level, when the full level overrules the middle).
"""
from __future__ import annotations

import copy
import weakref

import torch

from .steps import Sampling, advance, pad_prompts, static_tree


class Drafter:
    """A draft model on its own cache (full, StreamingLLM or retrieval) proposing for one verifier."""

    def __init__(self, model, cache, sampling: Sampling, width: int):
        self.model, self.cache, self.sampling, self.width = model, cache, sampling, width
        self.hist: torch.Tensor | None = None
        self.appended = 0  # tokens this step's forwards kept in the cache beyond c - H
        self._trees: dict = {}  # static tree shapes drafted so far (steps.static_tree)

    @property
    def pending(self) -> torch.Tensor:
        """``[B, 1]``: the verifier's pending token (its next forward's first input)."""
        return self.hist[:, -1:]

    def prefill(self, prompts: list[torch.Tensor], hist: torch.Tensor, full=None) -> None:
        """Fill the cache with each prompt but its last ``width - 1`` tokens; ``hist`` ``[B, width]``
        holds those and the first sampled token (a prompt shorter than ``width`` is padded:
        :func:`~triforce.engines.steps.pad_prompts`).

        ``full``: the verifier's full cache, prefilled with the prompts, when the drafter's model is the
        verifier's own (self-speculation). A StreamingLLM drafter cache is then loaded from it
        (:meth:`~triforce.models.cache.StreamingCache.fill_from`) instead of running a second prefill,
        unless a prompt is shorter than ``width`` (its padding is in no full cache)."""
        from triforce.models.cache import StreamingCache

        self.hist, self.appended = hist, 0
        if full is not None and isinstance(self.cache, StreamingCache) and min(len(p) for p in prompts) >= self.width:
            self.cache.fill_from(full, full.lengths - (self.width - 1))
            return
        self.model.prefill([p[: len(p) + 1 - self.width] for p in pad_prompts(prompts, self.width)], self.cache)

    def propose(self, gamma: int):
        """Draft ``gamma`` tokens autoregressively -> (tokens int64 ``[B, gamma]``, probs float32
        ``[B, gamma, V]`` or None when greedy)."""
        tokens, probs = [], []
        logits = self.model(self.hist, cache=self.cache)[:, -1]
        for i in range(gamma):
            tok, p = self.sampling.sample(logits)
            tokens.append(tok)
            probs.append(p)
            if i + 1 < gamma:
                logits = self.model(tok, cache=self.cache)[:, -1]
        self.appended = self.width + gamma - 1
        return torch.cat(tokens, 1), None if self.sampling.greedy else torch.stack(probs, 1)

    def propose_tree(self, shape: tuple[int, ...], parents_row: list[int], vocab: int):
        """Draft a static tree (branching factors ``shape``; node 0 = the pending token) -> (tokens int64
        ``[B, T]``, draft probs float32 ``[B, T, V]`` or None, :class:`~triforce.models.TokenTree`).
        Greedy: the top-k children of each node; sampling: k i.i.d. children. One forward per depth over
        the tree so far (then rolled back); the first also feeds the catch-up tokens ``hist[:, :-1]``,
        which stay."""
        sampling, hist = self.sampling, self.hist
        B, T, dev = hist.shape[0], len(parents_row), hist.device
        tokens = torch.zeros(B, T, dtype=torch.int64, device=dev)
        tokens[:, 0] = hist[:, -1]
        probs = None if sampling.greedy else torch.zeros(B, T, vocab, device=dev)
        logits = self.model(hist, cache=self.cache)[:, -1:]
        self.cache.rollback(self.cache.lengths - 1)  # keep the catch-up tokens, drop the root
        tree = static_tree(self._trees, parents_row, B, dev)
        lo, n = 0, 1  # the current depth's nodes are lo .. n-1
        for depth, k in enumerate(shape):
            if depth > 0:
                logits = self.model(tokens[:, :n], cache=self.cache, tree_parents=tree.prefix(n))[:, lo:n]
                self.cache.rollback(self.cache.lengths - n)  # relative: the forward may have compacted
            for j in range(n - lo):
                child, p = sampling.sample(logits[:, j], k)
                tokens[:, n + j * k: n + (j + 1) * k] = child
                if probs is not None:
                    probs[:, lo + j] = p
            lo, n = n, n + (n - lo) * k
        self.appended = self.width - 1
        return tokens, probs, tree

    def commit(self, tokens: torch.Tensor, adv: torch.Tensor, width: int | None = None,
               acceptance: torch.Tensor | None = None, path: torch.Tensor | None = None) -> None:
        """The verifier emitted ``tokens[b, :adv[b]]``; ``width``: a new history width from now on.
        ``acceptance`` (0-d tensor) is this step's acceptance rate, for drafters that adapt to it;
        ``path``: a tree verification's accepted nodes (read by drafters that keep per-node state)."""
        self._move(adv, advance(self.hist, tokens, adv, width or self.width))

    def rebase(self, hist: torch.Tensor, delta: torch.Tensor, adv: torch.Tensor | None = None) -> None:
        """The verifier's sequence changed by ``delta`` tokens per row and now ends with ``hist``."""
        self._move(delta, hist)

    def select_rows(self, rows: torch.Tensor) -> None:
        """Finished rows left the batch (:meth:`~triforce.engines.decode.Decode.track`; the cache is tracked
        on its own): the history keeps ``rows``, and the tree shapes are built anew for the new batch."""
        self.hist, self._trees = self.hist[rows], {}

    def _move(self, delta, hist: torch.Tensor) -> None:
        # cache: from c - H + appended tokens to (c + delta) - H'
        self.cache.rollback(self.cache.lengths - self.appended + delta + self.width - hist.shape[1])
        self.hist, self.width, self.appended = hist, hist.shape[1], 0


class RetrievalDrafter(Drafter):
    """The target on a :class:`~triforce.models.cache.RetrievalCache` (MagicDec with a retrieval draft
    cache): it follows the full cache instead of keeping tokens, so ``commit`` records the acceptance
    (for the rebuild-on-low-acceptance policy), drops its speculative tail and copies the verified
    tokens from the full cache; ``hist`` is just the pending token (width 1)."""

    def __init__(self, model, cache, sampling: Sampling):
        super().__init__(model, cache, sampling, width=1)

    def prefill(self, prompts, hist) -> None:
        self.hist, self.appended = hist, 0  # the cache was built from the prefilled full cache

    def commit(self, tokens, adv, width=None, acceptance=None) -> None:
        if acceptance is not None:
            self.cache.record_acceptance(acceptance)
        self.cache.sync()
        self.hist, self.appended = advance(self.hist, tokens, adv, 1), 0


_HALF_COPIES: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def half_precision_copy(target):
    """The default draft model of ``speculative`` and ``triforce`` for a float32/float16 target: a
    bfloat16 copy of it (half the weight bytes per draft token; on SmolLM2-135M ~0.86 greedy
    acceptance, where a layer-skipped half of the model gets ~0.04). Made once per target and kept
    while the target lives. ``None`` for a bfloat16 target, and for a target on quantised weights
    (``triforce.models.gguf_copy``: 0.75 bytes a weight, fewer than a bfloat16 copy's 2): no cheaper copy
    exists, and the engines draft with the target itself."""
    from triforce.models.quant import Int8DotLinear, Q4Linear

    if next(target.parameters()).dtype == torch.bfloat16 or any(isinstance(m, (Q4Linear, Int8DotLinear))
                                                                 for m in target.modules()):
        return None
    if target not in _HALF_COPIES:
        _HALF_COPIES[target] = copy.deepcopy(target).to(torch.bfloat16)
    return _HALF_COPIES[target]
