"""MagicDec (self-speculation): the target itself on a fixed StreamingLLM window (sink + recent
tokens) drafts ``gamma`` tokens for the target on the full cache. Drafting reads the weights plus a
small fixed KV window instead of the whole context, so it pays off when batch x context makes KV
bytes dominate weight bytes. ``draft_cache="retrieval"`` drafts from a retrieval cache of the same
budget instead (the TriForce middle level used as a two-level method); with a prompt too short for
a retrieval cache (fewer than 3 complete chunks) it drafts from the StreamingLLM window, and says so
in ``stats["notes"]``."""
from __future__ import annotations

from .decode import Decode, model_dtype
from .drafters import Drafter, RetrievalDrafter
from .steps import CHAIN_HIST, chain_step, recent_chunks, retrieval_budget


def run(d: Decode, draft, *, gamma: int, sink: int, window: int, draft_cache: str, budget: int | None,
        chunk_size: int, rebuild_stride: int, recent: int) -> tuple:
    from triforce.models.cache import RetrievalCache, StreamingCache

    d.setup(width=gamma + 1)
    target = d.target
    if draft_cache == "retrieval":
        if draft is not None:
            raise ValueError("draft: draft_cache='retrieval' drafts with the target itself; pass draft=None")
        budget = retrieval_budget(budget or sink + window, chunk_size, d.prompts)
        if budget is None:
            d.notes.append(f"magicdec: the shortest prompt has fewer than 3 chunks of {chunk_size} tokens, too "
                           f"short for a retrieval cache: drafted from the StreamingLLM window instead")
            draft_cache = "streaming"
    if draft_cache == "streaming":
        model = draft if draft is not None else target
        d.require_window(window, gamma + CHAIN_HIST, "magicdec")
        cache = d.full_cache(target)
        drafter = Drafter(model, StreamingCache(model.config, d.batch, sink, window, max_step=CHAIN_HIST,
                                                device=d.device, dtype=model_dtype(model)), d.sampling, CHAIN_HIST)
        with d.timed_prefill():
            drafter.prefill(d.prompts, d.start(target.prefill(d.prompts, cache), CHAIN_HIST),
                            full=cache if model is target else None)
    else:
        cache = d.full_cache(target, chunk_size=chunk_size)
        with d.timed_prefill():
            first = d.start(target.prefill(d.prompts, cache), 1)
            rcache = RetrievalCache(target.config, cache, budget, chunk_size,
                                    max_step=gamma + 1,  # tokens appended between syncs
                                    rebuild_stride=rebuild_stride,
                                    recent_chunks=recent_chunks(recent, budget, chunk_size))
            drafter = RetrievalDrafter(target, rcache, d.sampling)
            drafter.prefill(d.prompts, first)
    return d.loop(lambda active: chain_step(d, drafter, cache, active, gamma, "self->full"))
