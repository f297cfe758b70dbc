"""Prompt lookup: drafts copied from the sequence itself (``draft="lookup"``; docs/engines.md, "Prompt lookup").

Long-context work often repeats its context: an answer quotes the document, code edits copy the code, a
model restates what it said. The drafter keeps every committed token of each row (its prompt, then what
the verifier emitted). To propose, it takes the row's last ``n`` tokens for ``n = ngram, ngram - 1, .., 1``
and finds their earlier occurrences in the row; the longest ``n`` with one wins. Which occurrence, and how
many of the tokens after it are the draft, is the option ``lookup_length``:

* ``"match"`` (the default; :func:`lookup_match_drafts`): of the latest ``MATCH_CANDIDATES`` occurrences, the
  one whose match with the row's last tokens runs furthest back (counted up to ``MATCH_CAP`` tokens), and a
  draft as long as that match, up to ``gamma``. A long match says the row is copying: such drafts are mostly
  accepted, so they are drafted long; a one- or two-token match is mostly wrong after a token or two, so it
  costs the pass little width.
* ``"gamma"`` (:func:`lookup_drafts`): the latest occurrence (preferring one that ``gamma`` tokens follow) and
  up to ``gamma`` tokens after it, whatever the match.

No model runs: a draft costs a few tensor operations over the row's tokens, on their device.

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
LENGTHS = ("match", "gamma")  # the option lookup_length: how long a proposal is (module docstring)
# lookup_length="match": the latest occurrences of the row's last n-gram whose matches are compared, and the
# match length counted up to (longer matches all count as this long).
MATCH_CANDIDATES = 16
MATCH_CAP = 32


def is_lookup(draft) -> bool:
    """``draft="lookup"``: prompt-lookup drafting."""
    return isinstance(draft, str) and draft == LOOKUP


def _occurrences(buf: torch.Tensor, length: torch.Tensor, ngram: int, gamma: int | None):
    """The n-gram search of both rules over ``buf`` ``[B, C]`` (each row's tokens in ``[0, length[b])``):
    for ``n = 1 .. ngram``, the positions ``e`` where an earlier occurrence of the row's last ``n`` tokens
    ends (with a token after it). ``gamma`` given -> int64 ``[B]``: where the proposal of
    :func:`lookup_drafts` starts (``-1``: none); ``None`` -> bool ``[B, C]``: the occurrences of the largest
    ``n`` that has one."""
    B, C = buf.shape
    dev = buf.device
    length = length.long()[:, None]
    end = torch.arange(C, device=dev)[None, :]  # e: the position where an occurrence ends
    follow = end + 1  # where its continuation starts; an earlier occurrence has follow < length
    if gamma is not None:
        full = torch.where(follow + gamma <= length, C, 0)  # prefer an occurrence that gamma tokens follow
        start = torch.full((B,), -1, dtype=torch.int64, device=dev)  # where the proposal starts in buf
    else:
        top = torch.zeros(B, C, dtype=torch.bool, device=dev)
    hit = torch.ones(B, C, dtype=torch.bool, device=dev)
    for n in range(1, min(ngram, C - 1) + 1):
        # hit[b, e]: buf[b, e - n + 1 .. e] equals the row's last n tokens (one more compare per n, on slices)
        token = buf.gather(1, (length - n).clamp(min=0))  # [B, 1]: the pattern's n-th token from the end
        hit[:, n - 1:] &= buf[:, : C - n + 1] == token  # (positions before n - 1 keep shorter n's: masked below)
        ok = hit & (end >= n - 1) & (follow < length) & (length > n)
        if gamma is not None:
            best, at = torch.where(ok, follow + full, -1).max(1)
            start = torch.where(best >= 0, at + 1, start)  # a longer n overrides a shorter one
        else:
            top = torch.where(ok.any(1, keepdim=True), ok, top)
    return start if gamma is not None else top


def _copy(buf: torch.Tensor, length: torch.Tensor, start: torch.Tensor, take: torch.Tensor, gamma: int):
    """``[B, gamma]``: ``buf[b, start[b] + i]`` for ``i < take[b]`` inside the row, else ``-1`` (and for
    ``start[b] < 0``)."""
    C = buf.shape[1]
    i = torch.arange(gamma, device=buf.device)
    idx = start[:, None] + i
    ok = (start[:, None] >= 0) & (idx < length.long()[:, None]) & (i < take[:, None])
    return torch.where(ok, buf.gather(1, idx.clamp(0, C - 1)), -1)


def lookup_drafts(buf: torch.Tensor, length: torch.Tensor, gamma: int, ngram: int) -> torch.Tensor:
    """Prompt-lookup drafts, ``lookup_length="gamma"``: ``buf`` int64 ``[B, C]`` holds each row's tokens in
    ``[0, length[b])`` and ``-1`` after them; -> int64 ``[B, gamma]``: per row the tokens that followed the latest
    earlier occurrence of its last ``n`` tokens, for the largest ``n <= ngram`` that occurs (among the
    occurrences of that ``n``, the latest one that ``gamma`` tokens follow, else the latest), ``-1`` past them
    and for a row with no occurrence."""
    start = _occurrences(buf, length, ngram, gamma)
    return _copy(buf, length, start, torch.full_like(start, gamma), gamma)


def _ranked_candidates(buf: torch.Tensor, length: torch.Tensor, gamma: int, ngram: int):
    """The match rule's candidates: per row, the latest ``MATCH_CANDIDATES`` occurrences of its last ``n``
    tokens for the largest ``n <= ngram`` that occurs (:func:`lookup_match_drafts`) -> (``cand`` int64 ``[B, K]``:
    the occurrences' ends, ``-1`` none; ``take``: how many tokens after each the rule copies, ``min(gamma, m)``
    for its match length ``m``; ``key``: the rule's order, larger first and distinct, ``-1`` for none)."""
    B, C = buf.shape
    dev = buf.device
    top = _occurrences(buf, length, ngram, None)
    K, N = min(MATCH_CANDIDATES, C), max(MATCH_CAP, ngram)
    end = torch.arange(C, device=dev)
    cand = torch.where(top, end, -1).topk(K, dim=1).values  # [B, K]: the latest occurrences' ends, -1 none
    back = torch.arange(N, device=dev)
    at = cand[:, :, None] - back  # [B, K, N]: an occurrence's tokens, counted back from its end
    mine = (length.long() - 1)[:, None] - back  # [B, N]: the row's last tokens, counted back
    same = (at >= 0) & (buf.gather(1, at.clamp(min=0).flatten(1)).view(B, K, N)
                        == buf.gather(1, mine.clamp(min=0))[:, None, :])
    m = same.long().cumprod(-1).sum(-1)  # [B, K]: match lengths (>= 1 for a real occurrence)
    take = m.clamp(max=gamma)
    full = cand + 1 + take <= length.long()[:, None]
    key = torch.where(cand >= 0, (m * 2 + full) * C + cand, -1)  # the longest match, one that take tokens follow,
    return cand, take, key                                         # the latest


def lookup_match_drafts(buf: torch.Tensor, length: torch.Tensor, gamma: int, ngram: int) -> torch.Tensor:
    """Prompt-lookup drafts, ``lookup_length="match"`` (the default): ``buf`` and ``length`` as for
    :func:`lookup_drafts`; -> int64 ``[B, gamma]``. Per row, the occurrences of its last ``n`` tokens for the
    largest ``n <= ngram`` that occurs earlier with a token after it; of the latest ``MATCH_CANDIDATES`` of them,
    the one whose match runs furthest back: its match length ``m`` counts the tokens before and including its
    end that equal the row's last tokens, in order, up to ``max(MATCH_CAP, ngram)``. Ties: one that ``min(gamma,
    m)`` tokens follow, then the latest. The draft: the ``min(gamma, m)`` tokens after it (fewer where the row
    ends), ``-1`` past them and for a row with no occurrence."""
    cand, take, key = _ranked_candidates(buf, length, gamma, ngram)
    best = key.argmax(1, keepdim=True)
    start = torch.where(key.gather(1, best) >= 0, cand.gather(1, best) + 1, -1)[:, 0]
    return _copy(buf, length, start, take.gather(1, best)[:, 0], gamma)


def tree_size(shape: tuple[int, ...], ngram: int) -> int:
    """The most nodes (the root not counted) of a lookup tree of branching limits ``shape`` (:func:`lookup_tree`):
    at depth ``d`` at most ``prod(shape[:d])`` nodes, and at most one per candidate; none deeper than the longest
    match counted, ``max(MATCH_CAP, ngram)`` (a candidate copies at most its match's length)."""
    n, width = 0, 1
    for k in shape[:max(MATCH_CAP, ngram)]:
        width = min(width * k, MATCH_CANDIDATES)
        n += width
    return n


def lookup_tree(buf: torch.Tensor, length: torch.Tensor, shape: tuple[int, ...], ngram: int):
    """A token tree of prompt-lookup drafts (``method="tree", draft="lookup"``): ``buf`` and ``length`` as for
    :func:`lookup_drafts`; ``shape``: the most children of a node at each depth (its length is the tree's
    depth). -> (``tokens`` int64 ``[B, N]``, ``parents`` int64 ``[B, N]``), ``N = tree_size(shape, ngram)``: the
    tree's nodes past its root, numbered ``1..N`` (the root, node 0, is the row's last token), each row's own
    nodes first and ``-1`` tokens with parent 0 after them.

    The match rule's candidates (:func:`lookup_match_drafts` with ``gamma = len(shape)``: the latest
    ``MATCH_CANDIDATES`` occurrences of the longest n-gram, each with its ``min(depth, m)`` tokens after it)
    are inserted into a trie in that rule's order (longest match, then one that its tokens follow, then the
    latest): a candidate's tokens follow the trie's nodes while they exist and add a node for each token
    after, until a node would exceed its parent's limit ``shape[d]`` (its children are kept in the order they
    were added) or the candidate's tokens end. So the first child of every node leads along the match rule's
    own proposal (and on, where a later candidate continues it: a tree's first path starts with the chain's
    proposal), and the other branches are the next candidates' continuations where they differ. Nodes are
    numbered by depth, then in the order they were added (each parent before its children). All rows at once,
    on their device: ``[B, K, K, depth]`` compares."""
    B, C = buf.shape
    dev = buf.device
    shape = shape[:max(MATCH_CAP, ngram)]  # (no candidate copies more than its match counted)
    D = len(shape)
    cand, take, key = _ranked_candidates(buf, length, D, ngram)
    order = key.argsort(1, descending=True)  # the rule's order (keys of real candidates are distinct)
    cand, take = cand.gather(1, order), take.gather(1, order)
    K = cand.shape[1]
    depth = torch.arange(D, device=dev)
    at = cand[:, :, None] + 1 + depth  # [B, K, D]: where each candidate's tokens are
    real = (cand[:, :, None] >= 0) & (depth < take[:, :, None]) & (at < length.long()[:, None, None])
    tok = torch.where(real, buf.gather(1, at.clamp(0, C - 1).flatten(1)).view(B, K, D), -1)
    # same[b, k, j, d]: candidates k and j share their first d + 1 tokens (both that long)
    same = (tok[:, :, None] == tok[:, None, :]) & real[:, :, None] & real[:, None, :]
    same = same.long().cumprod(-1).bool()
    first = same.long().argmax(2)  # [B, K, D]: the first candidate with k's tokens up to depth d: the node's maker
    idx = torch.arange(K, device=dev)
    new = real & (first == idx[:, None])  # the candidates that add a node at depth d
    parent = torch.cat([torch.full_like(first[:, :, :1], -1), first[:, :, :-1]], 2)  # the parent's maker
    earlier = idx[None, :, None] < idx[:, None, None]  # [K, K, 1]: j before k
    siblings = new[:, None] & (parent[:, None] == parent[:, :, None]) & earlier  # [B, K, K, D]
    rank = siblings.sum(2)  # [B, K, D]: children the node's parent has before it
    # a node is made when it and every node on its path fit their parents' limits: fits.gather(1, first)[b, k, d]
    # says whether the node holding k's first d + 1 tokens (made by first[b, k, d]) does
    fits = new & torch.stack([rank[:, :, d] < shape[d] for d in range(D)], 2)
    made = new & fits.gather(1, first).long().cumprod(2).bool()
    # node numbers: by depth, then in the order added; the root is 0
    number = made.transpose(1, 2).reshape(B, D * K).long().cumsum(1).view(B, D, K).transpose(1, 2)
    up = torch.cat([torch.zeros_like(number[:, :, :1]), number[:, :, :-1].gather(1, parent[:, :, 1:].clamp(min=0))],
                   2)  # the parent's number
    N = tree_size(shape, ngram)
    slot = torch.where(made, number - 1, N).flatten(1)  # column N: a dump for the candidates that add no node
    tokens = torch.full((B, N + 1), -1, dtype=torch.int64, device=dev).scatter_(1, slot, tok.flatten(1))
    parents = torch.zeros((B, N + 1), dtype=torch.int64, device=dev).scatter_(1, slot, up.flatten(1))
    return tokens[:, :N], parents[:, :N]


class LookupDrafter:
    """The chain drafter of prompt lookup (module docstring), with a drafter's bookkeeping
    (:mod:`~triforce.engines.drafters`): ``hist``, ``pending``, ``prefill``, ``propose``, ``commit``, ``rebase``.
    ``seq``: each row's committed tokens (a :class:`~triforce.engines.steps.TokenBuffer` of the full cache's
    capacity, ``-1`` past each row's ``count``). It drafts for the full level (``speculative``) or for
    TriForce's retrieval level (its bottom level)."""

    level = LOOKUP  # the drafter's name in the acceptance statistics ("lookup->full", "lookup->retrieval")
    ragged = True  # its proposals differ in length: a verification pass computes each row's own (verify_chain)

    def __init__(self, d, ngram: int, width: int, length: str = "match"):
        if length not in LENGTHS:
            raise ValueError(f"lookup_length: expected one of {', '.join(map(repr, LENGTHS))}, got {length!r}")
        self.d, self.ngram, self.width = d, ngram, width
        self._search = lookup_match_drafts if length == "match" else lookup_drafts
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
        x = self._search(self.tokens, self.seq.count, gamma, self.ngram)
        x = torch.where(self.d.active()[:, None], x, -1)
        g = int((x >= 0).sum(1).max())  # the one read of a step: the pass's width
        return x[:, :g], None

    def propose_tree(self, shape: tuple[int, ...], parents_row=None, vocab=None):
        """A token tree (``method="tree"``; :func:`lookup_tree`) -> (tokens int64 ``[B, 1 + n]``: the pending
        token at the root, then the row's nodes, ``-1`` past them; None: deterministic children, which the
        tree sampler takes as None; the :class:`~triforce.models.TokenTree`), ``n``: the most nodes of an active
        row (0: the pass verifies the pending token alone). ``parents_row`` and ``vocab`` (a static tree's) are
        not used."""
        from triforce.models.cache import TokenTree

        x, parents = lookup_tree(self.tokens, self.seq.count, shape, self.ngram)
        x = torch.where(self.d.active()[:, None], x, -1)
        n = int((x >= 0).sum(1).max())  # the one read of a step: the pass's width
        root = torch.full_like(parents[:, :1], -1)
        # a tree by construction: every node's parent is an earlier node (padding hangs from the root)
        return torch.cat([self.pending, x[:, :n]], 1), None, TokenTree._trusted(torch.cat([root, parents[:, :n]], 1))

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
