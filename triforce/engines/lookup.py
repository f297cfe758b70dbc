"""Prompt lookup: drafts copied from the sequence itself (``draft="lookup"``; docs/engines.md, "Prompt lookup").

Long-context work often repeats its context: an answer quotes the document, code edits copy the code, a
model restates what it said. The drafter keeps every committed token of each row (its prompt, then what
the verifier emitted). To propose, it takes the row's last ``n`` tokens for ``n = ngram, ngram - 1, .., 1``
and finds their latest earlier occurrence in the row (preferring one that ``gamma`` tokens follow); the
tokens that followed it are the draft, up to ``gamma`` of them. The longest ``n`` with a match wins. No model
runs: a draft costs a few tensor operations over the row's tokens, on their device.

Each pass verifies as many drafts as the row with the longest proposal has (one read of that width per
step, on a GPU a host sync): a step where no row found a match verifies the pending token alone, an
autoregressive step, instead of paying for a wide pass of tokens that would all be rejected. Shorter
proposals are padded with ``-1``, which the verification rejects unread.

Lossless: a proposal is a function of the committed tokens, so the draft distribution of each drafted
position is a point mass on the drafted token (``q`` = one-hot; ``tk.chain_speculative_sample`` takes such a
draft as ``draft_probs=None``). Chain verification then accepts token
``x`` with probability ``min(1, p(x) / q(x)) = p(x)`` and on a rejection samples the residual
``max(p - q, 0)``, which is ``p`` without ``x``, renormalised: together exactly ``p``, the target's
distribution (greedy: its argmax)."""
from __future__ import annotations

import torch

from .steps import TokenBuffer, advance

LOOKUP = "lookup"


def is_lookup(draft) -> bool:
    """``draft="lookup"``: prompt-lookup drafting."""
    return isinstance(draft, str) and draft == LOOKUP


def lookup_drafts(buf: torch.Tensor, length: torch.Tensor, gamma: int, ngram: int) -> torch.Tensor:
    """Prompt-lookup drafts: ``buf`` int64 ``[B, C]`` holds each row's tokens in ``[0, length[b])`` and ``-1``
    after them; -> int64 ``[B, gamma]``: per row the tokens that followed the latest earlier occurrence of its
    last ``n`` tokens, for the largest ``n <= ngram`` that occurs (among the occurrences of that ``n``, the
    latest one that ``gamma`` tokens follow, else the latest), ``-1`` past them and for a row with no
    occurrence."""
    B, C = buf.shape
    dev = buf.device
    length = length.long()[:, None]
    end = torch.arange(C, device=dev)[None, :]  # e: the position where an occurrence ends
    follow = end + 1  # where its continuation starts; an earlier occurrence has follow < length
    full = torch.where(follow + gamma <= length, C, 0)  # prefer an occurrence that gamma tokens follow
    start = torch.full((B,), -1, dtype=torch.int64, device=dev)  # where the proposal starts in buf
    hit = torch.ones(B, C, dtype=torch.bool, device=dev)
    for n in range(1, min(ngram, C - 1) + 1):
        # hit[b, e]: buf[b, e - n + 1 .. e] equals the row's last n tokens (one more compare per n, on slices)
        token = buf.gather(1, (length - n).clamp(min=0))  # [B, 1]: the pattern's n-th token from the end
        hit[:, n - 1:] &= buf[:, : C - n + 1] == token  # (positions before n - 1 keep shorter n's: masked below)
        ok = hit & (end >= n - 1) & (follow < length) & (length > n)
        best, at = torch.where(ok, follow + full, -1).max(1)
        start = torch.where(best >= 0, at + 1, start)  # a longer n overrides a shorter one
    idx = start[:, None] + torch.arange(gamma, device=dev)
    ok = (start[:, None] >= 0) & (idx < length)
    return torch.where(ok, buf.gather(1, idx.clamp(0, C - 1)), -1)


class LookupDrafter:
    """The chain drafter of prompt lookup (module docstring), with a drafter's bookkeeping
    (:mod:`~triforce.engines.drafters`): ``hist``, ``pending``, ``prefill``, ``propose``, ``commit``, ``rebase``.
    ``seq``: each row's committed tokens (a :class:`~triforce.engines.steps.TokenBuffer` of the full cache's
    capacity, ``-1`` past each row's ``count``). It drafts for the full level (``speculative``) or for
    TriForce's retrieval level (its bottom level)."""

    level = LOOKUP  # the drafter's name in the acceptance statistics ("lookup->full", "lookup->retrieval")

    def __init__(self, d, ngram: int, width: int):
        self.d, self.ngram, self.width = d, ngram, width
        self.seq = TokenBuffer(d.batch, d.cache_len, d.device)
        self.hist: torch.Tensor | None = None

    @property
    def tokens(self) -> torch.Tensor:
        """``[B, capacity]``: the rows' tokens (the buffer without its dump column, which the search never reads)."""
        return self.seq.tokens[:, : self.seq.capacity]

    @property
    def pending(self) -> torch.Tensor:
        return self.hist[:, -1:]

    def prefill(self, prompts: list[torch.Tensor], hist: torch.Tensor) -> None:
        """The prompts, then the first sampled token (``hist[:, -1]``)."""
        for b, p in enumerate(prompts):
            self.tokens[b, : len(p)] = p
        self.seq.count = torch.tensor([len(p) for p in prompts], dtype=torch.int32, device=self.d.device)
        self.hist = hist
        self.seq.append(hist[:, -1:], torch.ones_like(self.seq.count))

    def propose(self, gamma: int):
        """-> (drafts int64 ``[B, g]`` with ``-1`` past each row's proposal, None: the draft probabilities of a
        deterministic draft, one-hot, which the samplers take as None); ``g <= gamma``: the longest proposal of
        an active row (0: the pass verifies the pending token alone, an autoregressive step)."""
        x = lookup_drafts(self.tokens, self.seq.count, gamma, self.ngram)
        x = torch.where(self.d.active()[:, None], x, -1)
        g = int((x >= 0).sum(1).max())  # the one read of a step: the pass's width
        return x[:, :g], None

    def commit(self, tokens: torch.Tensor, adv: torch.Tensor, width: int | None = None,
               acceptance: torch.Tensor | None = None, path: torch.Tensor | None = None) -> None:
        self.seq.append(tokens, adv)
        self.hist = advance(self.hist, tokens, adv, width or self.width)
        self.width = self.hist.shape[1]

    def select_rows(self, rows: torch.Tensor) -> None:
        self.seq.select_rows(rows)
        self.hist = self.hist[rows]

    def rebase(self, hist: torch.Tensor, delta: torch.Tensor, adv: torch.Tensor | None = None) -> None:
        """The verifier's sequence changed by ``delta`` tokens per row and now ends with ``hist`` (TriForce's
        bottom level: the full level kept ``adv`` of the tokens the middle level had collected, its last one its
        own): the row's tokens are cut or extended to the new length, ending with ``hist``."""
        length = self.seq.count.long() + delta.long()
        H = hist.shape[1]
        cols = torch.arange(self.tokens.shape[1], device=hist.device)
        self.tokens.masked_fill_(cols[None, :] >= length[:, None], -1)
        self.tokens.scatter_(1, (length[:, None] - H + torch.arange(H, device=hist.device)).clamp(min=0), hist)
        self.seq.count = length.to(torch.int32)
        self.hist, self.width = hist, H
