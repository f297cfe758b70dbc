"""A retrieval cache on a sliding-window model (``RetrievalCache(..., exact_windows=True)``, the default): each
windowed layer holds the most recent complete chunks, so with its tail a contiguous run of the latest positions,
and attends within its window. With ``budget >= window - 1`` that is every key the layer sees: its attention,
and on a model windowed in every layer the logits, equal the full cache's, through speculative steps, trees,
syncs and rebuilds. A shorter budget gives the window's most recent part."""
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from triforce.models import FullCache, Llama, LlamaConfig, RetrievalCache
from triforce.models.cache import TokenTree

from .test_model import TOL


def windowed(seed, model_type="mistral", window=8, layers=2, **extra):
    torch.manual_seed(seed)
    extra = {"sliding_window": window, **extra}
    cfg = LlamaConfig(model_type=model_type, vocab_size=64, hidden_size=32, intermediate_size=64,
                      num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                      max_position_embeddings=1024, initializer_range=0.3, extra=extra)
    return Llama(cfg).eval()


def mixed(seed, window=8):
    """Qwen3 with a windowed first layer and a global second one."""
    return windowed(seed, "qwen3", window, use_sliding_window=True,
                    layer_types=["sliding_attention", "full_attention"])


def prefilled(model, lens, max_len=128, cs=4):
    g = torch.Generator().manual_seed(7)
    prompts = [torch.randint(0, 64, (n,), generator=g) for n in lens]
    full = FullCache(model.config, len(lens), max_len, chunk_size=cs)
    with torch.no_grad():
        model.prefill(prompts, full, chunk_size=16)
    return full


def test_windowed_layers_hold_the_latest_chunks_and_their_window():
    model = mixed(0)
    full = prefilled(model, (45, 62))
    rc = RetrievalCache(model.config, full, budget=16, chunk_size=4, max_step=4)
    assert rc.windows == (8, 0) == model.config.layer_windows
    for b, L in enumerate(full.lengths.tolist()):
        nc = L // 4
        assert rc.chunk_idx[0][b].tolist() == [list(range(nc - 4, nc))] * 2  # both KV heads
        assert torch.equal(rc.k[0][b, :16 + L % 4], full.k[0][b, nc * 4 - 16:L])  # contiguous: chunks + tail
        assert torch.equal(rc.v[0][b, :16 + L % 4], full.v[0][b, nc * 4 - 16:L])
        assert rc.chunk_idx[1][b, :, 0].tolist() == [0, 0]  # the global layer retrieves (its sink chunk first)
    off = RetrievalCache(model.config, full, budget=16, chunk_size=4, max_step=4, exact_windows=False)
    assert off.windows == (0, 0) and off.chunk_idx[0][0, :, 0].tolist() == [0, 0]
    with pytest.raises(TypeError, match="exact_windows must be a bool"):
        RetrievalCache(model.config, full, budget=16, chunk_size=4, max_step=4, exact_windows=1)


def _attend_both(full, rc, layer, T, tree, seed):
    """One layer's attention of the same new tokens through ``full`` and ``rc`` (both rolled back after)."""
    B, Hq, Hkv, D = full.batch_size, 4, 2, 8
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, T, H, D, generator=g) for H in (Hq, Hkv, Hkv))
    outs = []
    for cache in (full, rc):
        before = cache.lengths.clone()
        step = cache.begin(T, tree_parents=tree)
        outs.append(cache.attend(layer, q, k, v, step))
        cache.rollback(before)
    return outs


@pytest.mark.parametrize("budget,window", [(8, 8), (8, 9), (12, 9), (16, 13)])
def test_a_windowed_layer_attends_as_on_the_full_cache(budget, window):
    """``budget >= window - 1``: chains and a tree deeper than the tail, the windowed layer's attention equals
    the full cache's (the global layer's does not: it sees retrieved chunks)."""
    model = mixed(0, window)
    full = prefilled(model, (45, 62))
    rc = RetrievalCache(model.config, full, budget=budget, chunk_size=4, max_step=8)
    tree = TokenTree(torch.tensor([[-1, 0, 1, 2, 3, 1, 5]] * 2))
    for T, parents in ((1, None), (5, None), (7, tree)):
        ours, theirs = _attend_both(full, rc, 0, T, parents, T)
        assert (ours - theirs).abs().max().item() <= TOL
    ours, theirs = _attend_both(full, rc, 1, 5, None, 0)
    assert (ours - theirs).abs().max().item() > 1e-3


def test_a_budget_shorter_than_the_window_sees_its_latest_part():
    """``budget < window - 1``: a query sees the cache's contiguous positions from ``base_pos - budget`` on
    (the most recent part of its window), checked against attention over those positions in float64."""
    model = mixed(0, window=20)
    full = prefilled(model, (45, 62))
    budget, T = 8, 5
    rc = RetrievalCache(model.config, full, budget=budget, chunk_size=4, max_step=8)
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, T, H, 8, generator=g) for H in (4, 2, 2))
    out = rc.attend(0, q, k, v, rc.begin(T))
    for b, L in enumerate(full.lengths.tolist()):
        first = L // 4 * 4 - budget  # the cache's first position
        for h in range(4):
            kk = torch.cat([full.k[0][b, first:L, h // 2], k[b, :, h // 2]]).double()
            vv = torch.cat([full.v[0][b, first:L, h // 2], v[b, :, h // 2]]).double()
            s = q[b, :, h].double() @ kk.T / math.sqrt(8)
            pos = torch.arange(first, L + T)
            p = torch.arange(L, L + T)[:, None]
            s = s.masked_fill((pos[None] > p) | (pos[None] <= p - 20), float("-inf"))
            assert (out[b, :, h].double() - s.softmax(-1) @ vv).abs().max() <= TOL


@pytest.mark.parametrize("exact", [True, False])
def test_a_model_windowed_in_every_layer_is_exact_at_the_retrieval_level(exact):
    """Mistral (every layer windowed, ``budget >= window - 1``): the model's logits through the retrieval cache
    equal the full cache's over a decode of speculative chains, a tree, syncs and a rebuild; retrieving the
    windowed layers' chunks instead (``exact_windows=False``) does not."""
    model = windowed(0)
    full = prefilled(model, (45, 62))
    rc = RetrievalCache(model.config, full, budget=8, chunk_size=4, max_step=8, rebuild_stride=12,
                        exact_windows=exact)
    g = torch.Generator().manual_seed(5)
    tree = TokenTree(torch.tensor([[-1, 0, 1, 1, 3]] * 2))
    worst = 0.0
    with torch.no_grad():
        for i in range(8):
            T = 1 + i % 4
            toks = torch.randint(0, 64, (2, T), generator=g)
            parents = tree if i == 5 else None
            if parents is not None:
                toks = torch.randint(0, 64, (2, 5), generator=g)
            before = rc.lengths.clone()
            drafted = model(toks, cache=rc, tree_parents=parents)
            rc.rollback(before)
            verified = model(toks, cache=full, tree_parents=parents)
            worst = max(worst, (drafted - verified).abs().max().item())
            if parents is not None:  # keep the chain 0 -> 1 -> 3
                full.commit_path(full.lengths - 5, torch.tensor([[0, 1, 3]] * 2),
                                 torch.tensor([2, 2], dtype=torch.int32))
            rc.sync()
    assert rc.num_rebuilds >= 2
    assert worst <= TOL if exact else worst > 1e-2


@pytest.mark.parametrize("method,opts", [
    ("magicdec", {"gamma": 3, "draft_cache": "retrieval", "budget": 12, "chunk_size": 4}),
    ("triforce", {"gamma1": 2, "gamma2": 4, "budget": 12, "chunk_size": 4, "sink": 1, "window": 12}),
])
def test_the_engines_draft_exactly_on_windowed_layers(method, opts):
    """Mistral with a window of 8, budget 12: the target drafting on its retrieval cache proposes the tokens the
    full cache verifies (acceptance 1 at that level, greedy) with ``sliding_layers="window"``, the default; with
    ``"retrieve"`` it does not. Both emit autoregressive decoding's tokens."""
    from .test_engines import assert_greedy_equals_autoregressive

    target, draft = windowed(0), windowed(1)
    level = "self->full" if method == "magicdec" else "retrieval->full"
    rates = {}
    for mode in ("window", "retrieve"):
        out = assert_greedy_equals_autoregressive(target, draft, method, {**opts, "sliding_layers": mode})
        rates[mode] = out.stats["acceptance"][level]
    assert rates["window"] == 1.0 and rates["retrieve"] < 0.9, rates


@settings(deadline=None)
@given(lens=st.lists(st.integers(16, 70), min_size=1, max_size=3), cs=st.sampled_from([1, 2, 4, 8]),
       data=st.data())
def test_a_windowed_layer_is_exact_wherever_the_budget_covers_its_window(lens, cs, data):
    """Any lengths, chunk size, budget, window up to budget + 1, chain or tree of up to 6 tokens: a windowed
    layer's attention through the retrieval cache equals the full cache's (a cache filled with random keys)."""
    budget = cs * data.draw(st.integers(2, min(lens) // cs), label="budget chunks")
    window = data.draw(st.integers(1, budget + 1), label="window")
    T = data.draw(st.integers(1, 6), label="T")
    tree = None
    if data.draw(st.booleans(), label="tree"):
        parents = [-1] + [data.draw(st.integers(0, t - 1)) for t in range(1, T)]
        tree = TokenTree(torch.tensor([parents] * len(lens)))
    config = LlamaConfig(model_type="mistral", vocab_size=64, hidden_size=32, intermediate_size=64,
                         num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                         max_position_embeddings=1024, extra={"sliding_window": window})
    full = FullCache(config, len(lens), max(lens) + 8, chunk_size=cs)
    g = torch.Generator().manual_seed(data.draw(st.integers(0, 2**31 - 1), label="seed"))
    full.k[0].normal_(generator=g)
    full.v[0].normal_(generator=g)
    full.lengths.copy_(torch.tensor(lens, dtype=torch.int32))
    full.tighten_bound(max(lens))
    rc = RetrievalCache(config, full, budget=budget, chunk_size=cs, max_step=8)
    ours, theirs = _attend_both(full, rc, 0, T, tree, 0)
    assert (ours - theirs).abs().max().item() <= TOL
