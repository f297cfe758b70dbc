"""MagicDec (self-speculation): the target itself on a fixed StreamingLLM window (sink + recent
tokens) drafts ``gamma`` tokens for the target on the full cache. Drafting reads the weights plus a
small fixed KV window instead of the whole context, so it pays off when batch x context makes KV
bytes dominate weight bytes. ``draft_cache="retrieval"`` drafts from a retrieval cache of the same
budget instead (the TriForce middle level used as a two-level method)."""
from __future__ import annotations

from .decode import Decode
from .speculative import HIST, chain_step
from .steps import retrieval_budget


def run(d: Decode, draft, *, gamma: int, sink: int, window: int, draft_cache: str, budget: int | None,
        chunk_size: int, rebuild_stride: int) -> tuple:
    from triforce.models.cache import RetrievalCache, StreamingCache

    from .decode import model_dtype

    d.setup(width=gamma + 1)
    target = d.target
    drafter = draft if draft is not None else target
    d.require_prompt_len(HIST, "magicdec")
    if draft_cache == "streaming":
        d.require_window(window, gamma + HIST, "magicdec")
        cache = d.full_cache(target)
        dcache = StreamingCache(drafter.config, d.batch, sink, window, max_step=HIST,
                                device=d.device, dtype=model_dtype(drafter))
        with d.timed_prefill():
            hist = d.start(target.prefill(d.prompts, cache), HIST)
            drafter.prefill(d.truncated(HIST), dcache)
    elif draft_cache == "retrieval":
        if draft is not None:
            raise ValueError("draft: draft_cache='retrieval' drafts with the target itself; pass draft=None")
        cache = d.full_cache(target, chunk_size=chunk_size)
        with d.timed_prefill():
            hist = d.start(target.prefill(d.prompts, cache), 1)  # follows the full cache: width 1
            dcache = RetrievalCache(target.config, cache, retrieval_budget(budget or sink + window, chunk_size,
                                                                           d.prompts),
                                    chunk_size, max_step=gamma + 1,  # tokens appended between syncs
                                    rebuild_stride=rebuild_stride)
    return d.loop(lambda h, active: chain_step(d, drafter, dcache, cache, h, active, gamma, "self->full"), hist)
