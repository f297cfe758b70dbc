"""TriForce (Sun et al. 2024): hierarchical speculation, lossless at both levels.

    draft model, StreamingLLM cache --gamma1--> target, retrieval cache --(until gamma2)--> target, full cache

The bottom level may also be trained heads (``draft="mlp"`` etc.) or prompt lookup (``draft="lookup"``: drafts
copied from the sequence itself, no model; :mod:`~triforce.engines.lookup`).

Middle level: the target on the retrieval cache verifies the draft's ``gamma1`` tokens with the
draft's probabilities (exact residual sampling), repeated until each row holds ``gamma2`` tokens.
Those tokens are exact samples of the retrieval-level model M (residual samples included), so the
full level verifies them with M's probabilities at exactly those positions: the ``target_probs``
the middle verification computed for each emitted token. (The reference implementation samples
from p instead of the residual on a middle rejection; that would make the claimed q wrong.)
"""
from __future__ import annotations

import torch

from .decode import Decode, cache_dtype
from .drafters import Drafter, half_precision_copy
from .heads import HeadDrafter, heads_for, is_heads_source
from .lookup import LookupDrafter, is_lookup
from .steps import TokenBuffer, advance, chain_step, recent_chunks, retrieval_budget, verify_chain

HIST_MID = 2  # bottom drafter's window inside the middle loop (a middle pass advances <= gamma1 + 1)
HIST = 3      # at full-level boundaries: the middle's pending token is in neither cache


def _verify_middle(sampling, draft_tokens, draft_probs, logits):
    """The middle level's accept/reject (a seam the residual-sampling test patches)."""
    return sampling.verify_chain(draft_tokens, draft_probs, logits)


class RetrievalLevel:
    """The middle level, a drafter for the full level: the target on the retrieval cache verifies the
    bottom drafter's ``gamma1``-token chains until every active row holds ``gamma2`` tokens, each kept
    with the retrieval-level probabilities it was sampled from (the full level's ``q``)."""

    def __init__(self, d: Decode, bottom: Drafter, rcache, gamma1: int):
        self.d, self.bottom, self.rcache, self.gamma1 = d, bottom, rcache, gamma1
        vocab = None if d.sampling.greedy else d.target.config.vocab_size
        # a row at gamma2 - 1 tokens may still gain gamma1 + 1
        self.xs = TokenBuffer(d.batch, d.width - 1, d.device, vocab)
        self.hist = None  # the full level's history at the start of the step (width HIST)

    @property
    def pending(self) -> torch.Tensor:
        return self.hist[:, -1:]

    def select_rows(self, rows: torch.Tensor) -> None:
        """Finished rows left the batch (the bottom drafter and the caches are tracked on their own)."""
        self.xs.select_rows(rows)
        self.hist = None  # set from the bottom drafter at the next step's start

    def propose(self, gamma2: int, active: torch.Tensor):
        d, bottom, xs, stats = self.d, self.bottom, self.xs, self.d.stats
        self.hist = bottom.hist
        xs.reset()
        # A block adds at most gamma1 + 1 tokens to a row, so every active row needs at least `sure`
        # blocks: those run without asking. After them, one host sync per block decides whether every
        # row has gamma2 tokens, and brings the longest row's count along.
        sure, blocks = -(-gamma2 // (self.gamma1 + 1)), 0
        while True:
            mactive = active & (xs.count < gamma2)
            if blocks >= sure:
                more, m = torch.stack([mactive.any().long(), xs.count.max().long()]).tolist()
                if not more:
                    break
            blocks += 1
            with stats.time("draft"):
                x, q = bottom.propose(self.gamma1)  # prompt lookup: up to gamma1, -1 past a row's own
            with stats.time("retrieval"):
                tokens, num, adv, mprobs = verify_chain(d.target, self.rcache, bottom.pending, x, q, mactive,
                                                        d.sampling, accept_reject=_verify_middle,
                                                        forward=getattr(bottom, "chain_pass", None),
                                                        ragged=getattr(bottom, "ragged", False))
            bottom.commit(tokens, adv, width=HIST_MID)
            xs.append(tokens, adv, mprobs)  # each emitted token with the M-probs it was sampled from
            stats.accept(f"{getattr(bottom, 'level', 'draft')}->retrieval", num, (x >= 0).sum(1), mactive)
        # -1 past a row's count: rejected unread, then the bonus comes from p
        return xs.tokens[:, :m], None if d.sampling.greedy else xs.probs[:, :m]

    def commit(self, tokens, adv, num, active) -> None:
        xs = self.xs
        with self.d.stats.time("retrieval"):
            self.rcache.record_acceptance((num * active).sum() / (xs.count * active).sum().clamp(min=1))
            self.rcache.sync()  # drop the middle's own tokens, copy the verified ones from the full cache
        # the bottom drafter followed the middle's sequence (xs.count tokens past the full level's);
        # the full level kept adv of them (its last one its own): rebase onto that, window HIST again
        self.bottom.rebase(advance(self.hist, tokens, adv, HIST), adv - xs.count, adv=adv)


def triforce_step(d: Decode, middle: RetrievalLevel, cache, active, gamma2: int) -> None:
    x, q = middle.propose(gamma2, active)
    with d.stats.time("full"):
        # rows collect different counts (-1 past each row's): a ragged chain
        tokens, num, adv, _ = verify_chain(d.target, cache, middle.pending, x, q, active, d.sampling,
                                           forward=getattr(middle.bottom, "chain_pass", None), ragged=True)
    middle.commit(tokens, adv, num, active)
    d.stats.accept("retrieval->full", num, middle.xs.count, active)
    d.emit(tokens, adv, active)


def run(d: Decode, draft, *, gamma1: int, gamma2: int, budget: int, chunk_size: int, rebuild_stride: int,
        sink: int, window: int, draft_layers: int | None, recent: int, draft_vocab: int | None, ngram: int,
        lookup_length: str, sliding_layers: str) -> tuple:
    from triforce.models.cache import RetrievalCache, StreamingCache

    target = d.target
    cap = gamma2 + gamma1  # most tokens the middle level collects
    extra = 0  # hidden_transfer heads: pseudo tokens per position riding in each verification pass
    if is_lookup(draft):  # prompt lookup drafts the bottom level: no model
        d.setup(width=1 + gamma1 + gamma2)
        bottom = LookupDrafter(d, ngram, HIST, lookup_length)
    elif is_heads_source(draft):  # trained heads on the target's hidden states draft the bottom level
        heads = heads_for(target, draft)
        if gamma1 > heads.depth:
            raise ValueError(f"gamma1: {gamma1} drafts need heads of depth >= {gamma1}; these {heads.kind} heads "
                             f"draft {heads.depth} tokens")
        bottom = HeadDrafter(target, heads, d.sampling, gamma1, draft_vocab)
        extra = bottom.extra_width
        d.setup(width=(1 + cap) * (1 + extra))
    else:
        d.setup(width=1 + gamma1 + gamma2)
        # bottom level: a bfloat16 copy of the target (the target itself if it is bfloat16), or its first
        # draft_layers layers, on a StreamingLLM window
        if draft is None:
            draft = target.layer_skip(draft_layers) if draft_layers else (half_precision_copy(target) or target)
        # The full level may cut the bottom drafter back by all the middle collected but one (cap - 1) and its
        # history by one more (cap in all); and each middle block's forwards first evict room for up to gamma1
        # of their own tokens, which the block then rolls back, so after a block with a full window only
        # window - gamma1 of the sequence's tokens stay. Hence window >= cap + gamma1, and never below the
        # cap + HIST the full level's history needs.
        d.require_window(window, cap + max(HIST, gamma1), "triforce")
        bottom = Drafter(draft, StreamingCache(draft.config, d.batch, sink, window, max_step=HIST,
                                               device=d.device, dtype=cache_dtype(draft),
                                               rope_long=d.rope_long(draft.config)), d.sampling, HIST)
    d.track(bottom, getattr(bottom, "cache", None))  # a model drafter's StreamingLLM cache
    budget = retrieval_budget(budget, chunk_size, d.prompts)
    cache = d.full_cache(target, chunk_size=chunk_size)
    with d.timed_prefill():
        bottom.prefill(d.prompts, d.start(target.prefill(d.prompts, cache), HIST))
        if budget is not None:
            # Between two syncs a row holds up to `cap` middle tokens, and a middle pass still writes
            # gamma1 + 1 more to it (and their pseudo tokens) while other rows continue (they are rolled
            # back after the pass).
            rcache = RetrievalCache(target.config, cache, budget, chunk_size,
                                    max_step=cap + (gamma1 + 1) * (1 + extra), rebuild_stride=rebuild_stride,
                                    recent_chunks=recent_chunks(recent, budget, chunk_size),
                                    exact_windows=sliding_layers == "window")
    if budget is None:  # no retrieval cache can exist: the bottom level drafts straight for the full level
        d.notes.append(f"triforce: the shortest prompt has fewer than 3 chunks of {chunk_size} tokens, too short "
                       f"for a retrieval cache: the draft proposed {gamma1} tokens straight to the full level")
        level = f"{getattr(bottom, 'level', 'draft')}->full"
        return d.loop(lambda active: chain_step(d, bottom, cache, active, gamma1, level))
    middle = RetrievalLevel(d, bottom, rcache, gamma1)
    d.track(rcache, middle)
    return d.loop(lambda active: triforce_step(d, middle, cache, active, gamma2))
