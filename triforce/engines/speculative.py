"""Speculative decoding (Leviathan et al. / Chen et al.): a draft model on its own full cache
proposes ``gamma`` tokens, the target on the full cache verifies them in one pass."""
from __future__ import annotations

import torch

from .decode import Decode
from .steps import Sampling, active_advance, advance, draft_chain

HIST = 2  # drafter catch-up window: a step advances by at most gamma + 1 = (gamma - 1) + HIST tokens


def default_draft(target, draft_layers: int | None):
    """The embedded default draft: the target's first half of layers + its head (weights shared)."""
    n = target.config.num_hidden_layers
    return target.layer_skip(draft_layers or max(1, n // 2))


def chain_step(d: Decode, drafter, dcache, cache, hist, active, gamma: int, level: str):
    """One draft-then-verify step against the full cache ``cache``; returns the new ``hist``."""
    target, sampling, stats = d.target, d.sampling, d.stats
    with stats.time("draft"):
        x, q = draft_chain(drafter, dcache, hist, gamma, sampling)
    with stats.time("full"):
        base = cache.lengths.clone()
        logits = target(torch.cat([hist[:, -1:], x], 1), cache=cache)
        tokens, num, _ = sampling.verify_chain(x, q, logits)
        adv = active_advance(num, active)
        cache.rollback(base + adv)
    follow(dcache, hist.shape[1] + gamma - 1, adv, (num * active).sum() / (gamma * active.sum()).clamp(min=1))
    stats.accept(level, num, gamma, active)
    d.emit(tokens, adv, active)
    return advance(hist, tokens, adv, hist.shape[1])


def follow(dcache, appended: int, adv, acceptance) -> None:
    """After a verification, keep ``adv`` of the ``appended`` tokens the drafter's forwards appended
    this step (relative to its current length: a StreamingLLM cache may have compacted mid-step).
    A retrieval-cache drafter instead drops its speculative tail and copies the verified tokens from
    the full cache (it then holds exactly the committed tokens: a window of width 1), after recording
    this step's ``acceptance`` (0-d tensor) for its rebuild-on-low-acceptance policy."""
    if hasattr(dcache, "sync"):
        dcache.record_acceptance(acceptance)
        dcache.sync()
    else:
        dcache.rollback(dcache.lengths - appended + adv)


def run(d: Decode, draft, *, gamma: int, draft_layers: int | None) -> tuple:
    d.setup(width=gamma + 1)
    draft = draft if draft is not None else default_draft(d.target, draft_layers)
    d.require_prompt_len(HIST, "speculative")
    cache = d.full_cache(d.target)
    dcache = d.full_cache(draft)
    with d.timed_prefill():
        hist = d.start(d.target.prefill(d.prompts, cache), HIST)
        draft.prefill(d.truncated(HIST), dcache)
    return d.loop(lambda h, active: chain_step(d, draft, dcache, cache, h, active, gamma, "draft->full"), hist)
