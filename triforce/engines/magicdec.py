"""MagicDec (self-speculation): the target itself on a fixed StreamingLLM window (sink + recent
tokens) drafts ``gamma`` tokens for the target on the full cache. Drafting reads the weights plus a
small fixed KV window instead of the whole context, so it pays off when batch x context makes KV
bytes dominate weight bytes. ``draft_cache="retrieval"`` drafts from a retrieval cache of the same
budget instead (the TriForce middle level used as a two-level method)."""
from __future__ import annotations

from . import Decode
from .speculative import HIST, chain_step

OPTIONS = {"gamma": 4, "sink": 16, "window": 240, "draft_cache": "streaming", "budget": None, "chunk_size": 8}


def run(d: Decode, draft=None, gamma: int = 4, sink: int = 16, window: int = 240,
        draft_cache: str = "streaming", budget: int | None = None, chunk_size: int = 8) -> tuple:
    from triforce.models.cache import RetrievalCache, StreamingCache

    from . import model_dtype

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
            dcache = RetrievalCache(target.config, cache, retrieval_budget(budget, sink + window, chunk_size, d),
                                    chunk_size, max_step=gamma + 1)  # tokens appended between syncs
    else:
        raise ValueError(f"draft_cache: expected 'streaming' or 'retrieval', got {draft_cache!r}")
    return d.loop(lambda h, active: chain_step(d, drafter, dcache, cache, h, active, gamma, "self->full"), hist)


def retrieval_budget(budget: int | None, default: int, chunk_size: int, d: Decode) -> int:
    """The retrieval budget capped by the shortest prompt's complete chunks (a multiple of
    ``chunk_size``; it needs more than the sink and recent chunk)."""
    shortest = min(len(p) for p in d.prompts)
    b = (min(budget or default, shortest) // chunk_size) * chunk_size
    if b < 3 * chunk_size:
        raise ValueError(f"budget: a retrieval cache needs at least 3 chunks of chunk_size={chunk_size} tokens; "
                         f"the shortest prompt has {shortest} tokens (lower chunk_size or use longer prompts)")
    return b

