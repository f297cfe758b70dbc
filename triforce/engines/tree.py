"""Tree speculation (SpecInfer / Sequoia style): a static token tree is drafted level by level
(greedy: the top-k children; sampling: k i.i.d. children of each node's draft distribution) and
verified in one target pass with the tree attention mask and the tree accept/reject sampler.

The tree shape is a tuple of branching factors per depth: ``(2, 2, 1)`` = a root with 2 children,
each with 2 children, each with 1: 1 + 2 + 4 + 4 = 11 nodes, depth 3. The default drafter is the
target itself on a StreamingLLM window (MagicDec-style self-speculation); trained heads on the
target's hidden states draft without a second model (``draft="medusa"`` etc., engines/heads.py); prompt lookup
(``draft="lookup"``) drafts a tree of the continuations of a row's earlier occurrences of its last tokens, no
model (:func:`~triforce.engines.lookup.lookup_tree`: ``tree`` then bounds the children per depth)."""
from __future__ import annotations

import torch

from .decode import Decode, cache_dtype
from .drafters import Drafter
from .heads import HeadDrafter, heads_for, is_heads_source  # noqa: F401 (generate imports it here)
from .lookup import LOOKUP, LookupDrafter, is_lookup, tree_size
from .steps import CHAIN_HIST, active_advance, ragged_passes


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


def tree_step(d: Decode, drafter, cache, active, shape, parents_row, widths=None) -> None:
    """One step: the drafter proposes a token tree (a static ``shape``, or ``widths`` nodes per depth by
    cumulative probability), the target verifies it in one tree-masked pass (the accepted path is
    compacted in the cache), the drafter commits what was emitted."""
    target, sampling, stats = d.target, d.sampling, d.stats
    with stats.time("draft"):
        if widths is not None:
            tree, q, nodes = drafter.propose_by_probability(widths, target.config.vocab_size)
        else:
            tree, q, nodes = drafter.propose_tree(shape, parents_row, target.config.vocab_size)
    with stats.time("full"):
        base = cache.lengths.clone()
        if isinstance(drafter, HeadDrafter):
            logits = drafter.tree_pass(tree, cache, nodes)
        elif getattr(drafter, "ragged", False):  # prompt lookup: rows' trees of their own sizes, -1 padded
            # (the padding is fed as 0 and never accepted: no token equals -1); where ragged passes pay (the CPU),
            # each row's own nodes are computed (steps.ragged_passes)
            ragged = tree.shape[1] > 1 and ragged_passes(tree.device)
            logits = target(tree.clamp(min=0), cache=cache, tree_parents=nodes,
                            widths=(tree >= 0).sum(1) if ragged else None)
        else:
            logits = target(tree, cache=cache, tree_parents=nodes)
        path, tokens, num = sampling.verify_tree(tree, nodes.parents, q, logits)
        adv = active_advance(num, active)
        cache.commit_path(base, path, num)
        cache.rollback(base + adv)  # finished rows keep nothing
    with stats.time("draft"):
        drafter.commit(tokens, adv, path=path)
    if getattr(drafter, "level", None) == LOOKUP:  # offered: the depth of the row's own tree
        stats.accept(f"{LOOKUP}->full", num, torch.where(tree >= 0, nodes.depths, 0).amax(1), active)
    elif tree.shape[1] > 1:  # the heads' first step verifies the root alone (no drafts yet)
        stats.accept("tree->full", num, len(widths or shape), active)
    d.emit(tokens, adv, active)


def run(d: Decode, draft, *, tree: tuple[int, ...], sink: int, window: int, tree_nodes=None,
        draft_vocab: int | None = None, ngram: int = 3) -> tuple:
    from triforce.models.cache import StreamingCache

    shape = tree
    parents_row = tree_parents(shape)
    if is_heads_source(draft):
        return run_heads(d, draft, shape, parents_row, tree_nodes, draft_vocab)
    if tree_nodes is not None:
        raise ValueError("tree_nodes: a tree by cumulative probability is built from trained heads "
                         "(draft='medusa', 'mlp', 'hidden_transfer', 'early_exit' or a DraftHeads)")
    if is_lookup(draft):
        return run_lookup(d, shape, ngram)
    hist_width = len(shape) + 2  # the drafter sits at the root after drafting; a step advances <= depth + 1
    d.setup(width=len(parents_row))
    d.require_window(window, hist_width + len(parents_row), "tree")
    model = draft if draft is not None else d.target
    cache = d.full_cache(d.target)
    dcache = StreamingCache(model.config, d.batch, sink, window, max_step=max(hist_width, len(parents_row)),
                            device=d.device, dtype=cache_dtype(model), rope_long=d.rope_long(model.config))
    drafter = Drafter(model, dcache, d.sampling, hist_width)
    d.track(drafter, dcache)
    with d.timed_prefill():
        drafter.prefill(d.prompts, d.start(d.target.prefill(d.prompts, cache), hist_width),
                        full=cache if model is d.target else None)
    return d.loop(lambda active: tree_step(d, drafter, cache, active, shape, parents_row))


def run_heads(d: Decode, draft, shape, parents_row, widths, draft_vocab: int | None = None) -> tuple:
    heads = heads_for(d.target, draft)
    levels, name = (len(widths), "tree_nodes") if widths is not None else (len(shape), "tree")
    if levels > heads.depth:
        raise ValueError(f"{name}: {levels} levels need heads of depth >= {levels}; these {heads.kind} "
                         f"heads draft {heads.depth} tokens (use a shallower tree)")
    vocab = d.target.config.vocab_size
    if max(widths or shape) > vocab:
        raise ValueError(f"{name}: at most vocab_size={vocab} candidates per node, got {widths or shape}")
    drafter = HeadDrafter(d.target, heads, d.sampling, levels, draft_vocab)
    d.track(drafter)
    nodes = 1 + sum(widths) if widths is not None else len(parents_row)
    d.setup(width=nodes * (1 + drafter.extra_width))
    cache = d.full_cache(d.target)
    with d.timed_prefill():
        drafter.prefill(d.prompts, d.start(d.target.prefill(d.prompts, cache), 1))
    return d.loop(lambda active: tree_step(d, drafter, cache, active, shape, parents_row, widths))


def run_lookup(d: Decode, shape: tuple[int, ...], ngram: int) -> tuple:
    """Prompt lookup's trees (:func:`~triforce.engines.lookup.lookup_tree`), verified by the target on its full
    cache; no draft model, no draft cache."""
    d.setup(width=1 + tree_size(shape, ngram))
    cache = d.full_cache(d.target)
    drafter = LookupDrafter(d, ngram, CHAIN_HIST)
    d.track(drafter)
    with d.timed_prefill():
        drafter.prefill(d.prompts, d.start(d.target.prefill(d.prompts, cache), CHAIN_HIST))
    return d.loop(lambda active: tree_step(d, drafter, cache, active, shape, None))
