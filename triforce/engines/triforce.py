"""TriForce (Sun et al. 2024): hierarchical speculation, lossless at both levels.

    draft model, StreamingLLM cache --gamma1--> target, retrieval cache --(until gamma2)--> target, full cache

Middle level: the target on the retrieval cache verifies the draft's ``gamma1`` tokens with the
draft's probabilities (exact residual sampling), repeated until each row holds ``gamma2`` tokens.
Those tokens are exact samples of the retrieval-level model M (residual samples included), so the
full level verifies them with M's probabilities at exactly those positions: the ``target_probs``
the middle verification computed for each emitted token. (The reference implementation samples
from p instead of the residual on a middle rejection; that would make the claimed q wrong.)
"""
from __future__ import annotations

import torch

from .decode import Decode, model_dtype
from .steps import TokenBuffer, active_advance, advance, draft_chain, retrieval_budget

HIST_MID = 2  # drafter window inside the middle loop (advance <= gamma1 + 1)
HIST = 3      # at full-level boundaries: the middle's pending token is in neither cache


def _verify_middle(sampling, draft_tokens, draft_probs, logits):
    """The middle level's accept/reject (a seam the residual-sampling test patches)."""
    return sampling.verify_chain(draft_tokens, draft_probs, logits)


def triforce_step(d: Decode, draft, dcache, rcache, cache, xs: TokenBuffer, hist, active, g1: int, g2: int):
    target, sampling, stats = d.target, d.sampling, d.stats
    base = cache.lengths.clone()
    xs.reset()
    mhist = hist
    while True:  # middle level: one host sync per gamma1-block to decide when every row has gamma2
        mactive = active & (xs.count < g2)
        if not bool(mactive.any()):
            break
        with stats.time("draft"):
            x, q = draft_chain(draft, dcache, mhist, g1, sampling)
        with stats.time("retrieval"):
            mbase = rcache.lengths.clone()
            logits = target(torch.cat([mhist[:, -1:], x], 1), cache=rcache)
            tokens, num, mprobs = _verify_middle(sampling, x, q, logits)
            adv = active_advance(num, mactive)
            rcache.rollback(mbase + adv)
        dcache.rollback(dcache.lengths - (mhist.shape[1] + g1 - 1) + adv + mhist.shape[1] - HIST_MID)
        xs.append(tokens, adv, mprobs)  # each emitted token with the M-probs it was sampled from
        stats.accept("draft->retrieval", num, g1, mactive)
        mhist = advance(mhist, tokens, adv, HIST_MID)
    m = int(xs.count.max())
    x = xs.tokens[:, :m]  # -1 past a row's count: rejected unread, then the bonus comes from p
    q = None if sampling.greedy else xs.probs[:, :m]
    with stats.time("full"):
        logits = target(torch.cat([hist[:, -1:], x.clamp(min=0)], 1), cache=cache)
        tokens, num, _ = sampling.verify_chain(x, q, logits)
        adv = active_advance(num, active)
        cache.rollback(base + adv)
    with stats.time("retrieval"):
        rcache.record_acceptance((num * active).sum() / (xs.count * active).sum().clamp(min=1))
        rcache.sync()  # drop the middle's own tokens, copy the verified ones from the full cache
    dcache.rollback(dcache.lengths + adv - xs.count - 1)  # from committed_mid - 2 to committed - 3
    stats.accept("retrieval->full", num, xs.count, active)
    d.emit(tokens, adv, active)
    return advance(hist, tokens, adv, HIST)


def run(d: Decode, draft, *, gamma1: int, gamma2: int, budget: int, chunk_size: int, rebuild_stride: int,
        sink: int, window: int, draft_layers: int | None) -> tuple:
    from triforce.models.cache import RetrievalCache, StreamingCache

    d.setup(width=1 + gamma1 + gamma2)
    target = d.target
    # default bottom level: the target itself on the StreamingLLM window (or its first draft_layers)
    draft = draft if draft is not None else (target.layer_skip(draft_layers) if draft_layers else target)
    d.require_prompt_len(HIST, "triforce")
    cap = gamma2 + gamma1  # most tokens the middle level collects: a row at gamma2 - 1 may gain gamma1 + 1
    d.require_window(window, cap + HIST, "triforce")
    cache = d.full_cache(target, chunk_size=chunk_size)
    dcache = StreamingCache(draft.config, d.batch, sink, window, max_step=HIST,
                            device=d.device, dtype=model_dtype(draft))
    xs = TokenBuffer(d.batch, cap, d.device, None if d.sampling.greedy else target.config.vocab_size)
    with d.timed_prefill():
        hist = d.start(target.prefill(d.prompts, cache), HIST)
        draft.prefill(d.truncated(HIST), dcache)
        # Between two syncs a row holds up to `cap` middle tokens, and a middle pass still writes
        # gamma1 + 1 more to it while other rows continue (they are rolled back after the pass).
        rcache = RetrievalCache(target.config, cache, retrieval_budget(budget, chunk_size, d.prompts), chunk_size,
                                max_step=cap + gamma1 + 1, rebuild_stride=rebuild_stride)
    return d.loop(lambda h, active: triforce_step(d, draft, dcache, rcache, cache, xs, h, active,
                                                  gamma1, gamma2), hist)
