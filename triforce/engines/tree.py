"""Tree speculation (SpecInfer / Sequoia style): a static token tree is drafted level by level
(greedy: the top-k children; sampling: k i.i.d. children of each node's draft distribution) and
verified in one target pass with the tree attention mask and the tree accept/reject sampler.

The tree shape is a tuple of branching factors per depth: ``(2, 2, 1)`` = a root with 2 children,
each with 2 children, each with 1: 1 + 2 + 4 + 4 = 11 nodes, depth 3. The default drafter is the
target itself on a StreamingLLM window (MagicDec-style self-speculation)."""
from __future__ import annotations

import torch

from .decode import Decode, model_dtype
from .steps import active_advance, advance



def tree_parents(shape) -> list[int]:
    """Parent index of every node of a static tree with the given branching factors (root: -1)."""
    parents, level = [-1], [0]
    for k in shape:
        nxt = []
        for node in level:
            for _ in range(k):
                parents.append(node)
                nxt.append(len(parents) - 1)
        level = nxt
    return parents


def draft_tree(drafter, dcache, hist, shape, parents_row, sampling, vocab: int):
    """Draft the tree: -> (tokens int64 [B, T], draft_probs float32 [B, T, V] or None). One drafter
    forward per depth over the tree built so far (then rolled back); the first one also feeds the
    catch-up tokens ``hist[:, :-1]``, which stay."""
    B, T, dev = hist.shape[0], len(parents_row), hist.device
    tokens = torch.zeros(B, T, dtype=torch.int64, device=dev)
    tokens[:, 0] = hist[:, -1]
    probs = None if sampling.greedy else torch.zeros(B, T, vocab, device=dev)
    logits = drafter(hist, cache=dcache)[:, -1:]
    dcache.rollback(dcache.lengths - 1)  # keep the catch-up tokens, drop the root
    parents = torch.tensor(parents_row, device=dev).expand(B, T)
    level, n = [0], 1  # nodes of the current depth, nodes drafted so far
    for depth, k in enumerate(shape):
        if depth > 0:
            logits = drafter(tokens[:, :n], cache=dcache, tree_parents=parents[:, :n])[:, level]
            dcache.rollback(dcache.lengths - n)  # relative: the forward may have compacted a window
        for j, node in enumerate(level):
            child, p = sampling.sample(logits[:, j], k)
            tokens[:, n + j * k: n + (j + 1) * k] = child
            if probs is not None:
                probs[:, node] = p
        level = list(range(n, n + len(level) * k))
        n += len(level)
    return tokens, probs, parents


def tree_step(d: Decode, drafter, dcache, cache, hist, active, shape, parents_row):
    target, sampling, stats = d.target, d.sampling, d.stats
    with stats.time("draft"):
        tree, q, parents = draft_tree(drafter, dcache, hist, shape, parents_row, sampling,
                                      target.config.vocab_size)
    with stats.time("full"):
        base = cache.lengths.clone()
        logits = target(tree, cache=cache, tree_parents=parents)
        path, tokens, num = sampling.verify_tree(tree, parents, q, logits)
        adv = active_advance(num, active)
        cache.commit_path(base, path, num)
        cache.rollback(base + adv)  # finished rows keep nothing
    dcache.rollback(dcache.lengths + 1 + adv - hist.shape[1])  # from committed - 1 to committed' - H
    stats.accept("tree->full", num, len(shape), active)
    d.emit(tokens, adv, active)
    return advance(hist, tokens, adv, hist.shape[1])


def run(d: Decode, draft, *, tree: tuple[int, ...], sink: int, window: int) -> tuple:
    from triforce.models.cache import StreamingCache

    shape = tree
    parents_row = tree_parents(shape)
    hist_width = len(shape) + 2  # the drafter sits at the root after drafting; a step advances <= depth + 1
    d.setup(width=len(parents_row))
    d.require_prompt_len(hist_width, "tree")
    d.require_window(window, hist_width + len(parents_row), "tree")
    drafter = draft if draft is not None else d.target
    cache = d.full_cache(d.target)
    dcache = StreamingCache(drafter.config, d.batch, sink, window, max_step=max(hist_width, len(parents_row)),
                            device=d.device, dtype=model_dtype(drafter))
    with d.timed_prefill():
        hist = d.start(d.target.prefill(d.prompts, cache), hist_width)
        drafter.prefill(d.truncated(hist_width), dcache)
    return d.loop(lambda h, active: tree_step(d, drafter, dcache, cache, h, active, shape, parents_row), hist)
