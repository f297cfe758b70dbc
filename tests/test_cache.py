"""Caches vs recomputation from scratch: full-cache rollback / commit_path / incremental chunk means,
StreamingLLM == attention over sink + window, retrieval cache == attention over the selected tokens of
the full cache, constant memory over a long decode."""
import math

import pytest
import torch
from hypothesis import example, given
from hypothesis import strategies as st

import triforce_kernels as tk
from triforce.models import FullCache, Llama, LlamaConfig, RetrievalCache, StreamingCache
from triforce.models.rope import apply_rope, rope_attention_scale, rope_cos_sin, rope_inv_freq, rows_inv_freq

TOL = 1e-5  # fp32 reordering only (measured <= ~5e-7 on these sizes)


def tiny(seed=0, **kw):
    base = dict(vocab_size=97, hidden_size=48, intermediate_size=64, num_hidden_layers=2, num_attention_heads=6,
                num_key_value_heads=2, max_position_embeddings=512)
    base.update(kw)
    torch.manual_seed(seed)
    return Llama(LlamaConfig(**base)).eval()


def check_chunk_means(cache):
    cs = cache.chunk_size
    for layer in range(cache.num_layers):
        for b, L in enumerate(cache.lengths.tolist()):
            n = L // cs
            ref = tk.chunk_mean_keys(cache.k[layer][b:b + 1, :L], cs, backend="reference")[0]
            assert torch.allclose(cache.chunk_keys[layer][b, :n], ref, atol=1e-6), (layer, b)


# ---------------------------------------------------------------- full cache
def test_rollback_then_new_tokens_equals_fresh_run():
    model = tiny()
    prompts = [torch.randint(0, 97, (n,)) for n in (11, 6)]
    cache = FullCache(model.config, 2, 64, chunk_size=4)
    model.prefill(prompts, cache)
    rejected = torch.randint(0, 97, (2, 5))
    model(rejected, cache=cache)
    keep = torch.tensor([2, 0], dtype=torch.int32)
    cache.rollback(cache.lengths - 5 + keep)
    assert cache.lengths.tolist() == [13, 6]
    check_chunk_means(cache)
    new = torch.randint(0, 97, (2, 3))
    out = model(new, cache=cache)
    check_chunk_means(cache)
    for b in range(2):
        seq = torch.cat([prompts[b], rejected[b, :keep[b]], new[b]])[None]
        assert (out[b] - model(seq)[0, -3:]).abs().max() <= TOL


def test_rollback_never_grows_and_validates():
    model = tiny()
    for bad in (0, -1, True, 2.0):
        with pytest.raises(ValueError, match="max_len must be a positive int"):
            FullCache(model.config, 2, bad)
    cache = FullCache(model.config, 2, 16)
    model.prefill(torch.zeros(2, 5, dtype=torch.long), cache)
    cache.rollback(torch.tensor([9, 3]))
    assert cache.lengths.tolist() == [5, 3]
    with pytest.raises(ValueError, match="new_lengths"):
        cache.rollback(torch.tensor([1, 2, 3]))
    with pytest.raises(ValueError, match="new_lengths"):
        cache.rollback(torch.tensor([1.0, 2.0]))
    # a negative length would make the next forward write at slots -2, -1 (the buffer's end)
    with pytest.raises(ValueError, match="new_lengths must be >= 0"):
        cache.rollback(torch.tensor([-3, 2]))
    cache.rollback(torch.tensor([2**32 + 1, 2]))  # no int32 wrap-around: larger than any length
    assert cache.lengths.tolist() == [5, 2]


def test_unchecked_values_are_clamped(monkeypatch):
    """What a GPU cache does (no value checks there: each would be a host sync): clamp."""
    from triforce.models import cache as cache_module

    monkeypatch.setattr(cache_module, "check_values", lambda t: False)
    model = tiny()
    cache = FullCache(model.config, 2, 48)
    model.prefill(torch.randint(0, 97, (2, 10)), cache)
    cache.rollback(torch.tensor([-3, 8]))
    assert cache.lengths.tolist() == [0, 8]
    model.prefill(torch.randint(0, 97, (2, 10)), cache)
    base = cache.lengths.clone()
    model(torch.randint(0, 97, (2, 3)), cache=cache, tree_parents=torch.tensor([[-1, 0, 1], [-1, 0, 0]]))
    cache.commit_path(base, torch.tensor([[0, 1, 2], [0, 2, -1]]), torch.tensor([7, -4]))
    assert cache.lengths.tolist() == [13, 11]  # num_accepted clamped into [0, 2]
    cache.commit_path(torch.tensor([-5, 10]), torch.tensor([[0, 1, 2], [0, 2, -1]]), torch.tensor([1, 0]))
    assert cache.lengths.tolist() == [2, 11]  # a base clamped at 0


def test_commit_path_checks_its_counts_on_the_cpu():
    model = tiny()
    cache = FullCache(model.config, 2, 48)
    model.prefill(torch.randint(0, 97, (2, 10)), cache)
    base = cache.lengths.clone()
    model(torch.randint(0, 97, (2, 3)), cache=cache, tree_parents=torch.tensor([[-1, 0, 1], [-1, 0, 0]]))
    path = torch.tensor([[0, 1, 2], [0, 2, -1]])
    for bad, match in (((base, path, torch.tensor([5, 1])), "num_accepted must be in \\[0, 2\\]"),
                       ((base, path, torch.tensor([-2, 1])), "num_accepted must be in"),
                       ((base + 2, path, torch.tensor([2, 1])), "must be <= lengths"),
                       ((base, torch.tensor([[0, 1, 7], [0, 2, -1]]), torch.tensor([2, 1])), "path: the kept"),
                       ((base, torch.tensor([[0, -1, 2], [0, 2, -1]]), torch.tensor([2, 1])), "path: the kept")):
        with pytest.raises(ValueError, match=match):
            cache.commit_path(*bad)
        assert cache.lengths.tolist() == [13, 13]  # nothing changed
    cache.commit_path(base, path, torch.tensor([2, 1]))
    assert cache.lengths.tolist() == [13, 12]


@pytest.mark.parametrize("name", ["cpu:0", "cuda"])
def test_a_cache_on_another_name_of_the_models_device(name):
    """A cache built on ``"cuda"`` serves a model on ``cuda:0`` (and ``"cpu:0"`` one on ``cpu``): the
    cache keeps the device as its tensors report it. Comparing the names as given raised "cache is
    float32 on cuda, the model float32 on cuda:0" (first seen on an H200)."""
    if name == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    model = tiny().to(name)
    assert model.device != torch.device(name)  # the two names differ as given
    for cache in (FullCache(model.config, 1, 32, device=name),
                  StreamingCache(model.config, 1, sink=2, window=8, max_step=4, device=name)):
        assert cache.device == model.device == cache.k[0].device
        model.prefill([torch.arange(6, device=name)], cache)
        out = model(torch.tensor([[3, 4]], device=name), cache=cache)
        assert out.shape == (1, 2, 97) and cache.lengths.tolist() == [8]


def test_commit_path_equals_sequential_run():
    model = tiny()
    prompt = torch.randint(0, 97, (2, 10))
    cache = FullCache(model.config, 2, 48, chunk_size=4)
    model.prefill(prompt, cache)
    parents = torch.tensor([[-1, 0, 0, 1, 1, 2, 5], [-1, 0, 1, 2, 0, 4, 4]])
    toks = torch.randint(0, 97, (2, 7))
    base = cache.lengths.clone()
    model(toks, cache=cache, tree_parents=parents)
    path = torch.tensor([[0, 2, 5, 6], [0, 4, 6, -1]])
    acc = torch.tensor([3, 2], dtype=torch.int32)
    cache.commit_path(base, path, acc)
    assert cache.lengths.tolist() == [14, 13]
    check_chunk_means(cache)
    nxt = torch.randint(0, 97, (2, 1))
    out = model(nxt, cache=cache)
    for b in range(2):
        seq = torch.cat([prompt[b], toks[b, path[b, :acc[b] + 1]], nxt[b]])[None]
        assert (out[b, 0] - model(seq)[0, -1]).abs().max() <= TOL


def test_chunk_means_incremental_and_last_query():
    model = tiny()
    prompts = [torch.randint(0, 97, (n,)) for n in (13, 30, 4)]
    cache = FullCache(model.config, 3, 64, chunk_size=4)
    model.prefill(prompts, cache, chunk_size=7)
    check_chunk_means(cache)
    # last_query after a ragged prefill == query of each prompt's last token (== that token's forward alone)
    for b, p in enumerate(prompts):
        one = FullCache(model.config, 1, 64, chunk_size=4)
        if len(p) > 1:
            model.prefill(p[None, :-1], one)
            model(p[None, -1:], cache=one)
        else:
            model.prefill(p[None], one)
        for layer in range(2):
            assert (cache.last_query[layer][b] - one.last_query[layer][0]).abs().max() <= TOL
    g = torch.Generator().manual_seed(1)
    for _ in range(12):
        T = int(torch.randint(1, 7, (), generator=g))
        model(torch.randint(0, 97, (3, T), generator=g), cache=cache)
        check_chunk_means(cache)
        cache.rollback(cache.lengths - torch.randint(0, T, (3,), generator=g).int())
        check_chunk_means(cache)


# ---------------------------------------------------------------- streaming cache
def _stream_reference(tokens, sink, window, q, k_new_raw, v_new, inv_freq, scale=1.0):
    """Naive StreamingLLM: ``tokens`` = list of (k_raw, v) held before the step (eviction already
    applied); attention of the new queries over them (keys rotated at slots 0..n-1) + causal new.
    ``scale``: RoPE's factor on cos and sin (YaRN's)."""
    n, T = len(tokens), q.shape[0]
    kr = torch.stack([t[0] for t in tokens] + list(k_new_raw)).double()
    vv = torch.stack([t[1] for t in tokens] + list(v_new)).double()
    pos = torch.arange(n + T)[None]
    cos, sin = rope_cos_sin(inv_freq.double(), pos, torch.float64, scale)
    k = apply_rope(kr[None], cos, sin)[0]  # [n+T, Hkv, D]
    cq, sq = rope_cos_sin(inv_freq.double(), torch.arange(n, n + T)[None], torch.float64, scale)
    qq = apply_rope(q.double()[None], cq, sq)[0]  # [T, Hq, D]
    g = q.shape[1] // k.shape[1]
    k, vv = k.repeat_interleave(g, 1), vv.repeat_interleave(g, 1)
    s = torch.einsum("thd,nhd->htn", qq, k) / math.sqrt(q.shape[-1])
    mask = torch.arange(n + T)[None, :] <= (n + torch.arange(T))[:, None]
    s = s.masked_fill(~mask, float("-inf"))
    return torch.einsum("htn,nhd->thd", s.softmax(-1), vv)


YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}
# head_dim 6: three pairs, each with its own short and long factor
LONGROPE = {"rope_type": "longrope", "short_factor": [1.0, 1.3, 1.7], "long_factor": [2.0, 3.0, 5.0],
            "original_max_position_embeddings": 64}


def row_inv_freq(cfg, rows_long):
    """``[B, head_dim // 2]``: each row's RoPE frequencies (LongRoPE's long or short set per ``rows_long``)."""
    short = rope_inv_freq(cfg)
    if cfg.rope_long_from is None:
        return short.expand(len(rows_long), -1)
    return rows_inv_freq(short, rope_inv_freq(cfg, long=True), rows_long)


@pytest.mark.parametrize("sink,window,max_step,rope", [(2, 5, 3, None), (0, 4, 2, None), (4, 16, 4, None),
                                                       (2, 5, 3, YARN), (2, 5, 3, LONGROPE)])
def test_streaming_equals_attention_over_sink_and_window(sink, window, max_step, rope):
    """(With YaRN RoPE too: its factor on cos and sin comes along when the cache re-rotates its keys; and with
    LongRoPE, one row on its long factors and one on its short ones: each row's re-rotations take its own.)"""
    cfg = LlamaConfig(vocab_size=11, hidden_size=24, intermediate_size=8, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, rope_scaling=rope)
    B, Hq, Hkv, D = 2, 4, 2, 6
    rows_long = torch.tensor([True, False])
    cache = StreamingCache(cfg, B, sink=sink, window=window, max_step=max_step, rope_long=rows_long)
    inv_freq, scale = row_inv_freq(cfg, rows_long), rope_attention_scale(cfg)
    assert (scale > 1) == (rope is not None)
    held = [[], []]  # reference: per row list of (k_raw, v)
    g = torch.Generator().manual_seed(0)
    steps = [9, 1, 2, 3, 1, 1, 2, 25, 3, 1, 3, 1, 2]  # 9 and 25 exceed max_step: the prefill path
    for i, T in enumerate(steps):
        counts = torch.tensor([T, max(1, T - 1)], dtype=torch.int32)  # row 1 is ragged (shorter)
        step = cache.begin(T, counts=counts)
        for b in range(B):  # eviction at the start of the step
            if len(held[b]) > sink + window:
                held[b] = held[b][:sink] + held[b][len(held[b]) - window:]
        assert cache.lengths.tolist() == [len(h) for h in held]
        q = torch.randn(B, T, Hq, D, generator=g)
        kr = torch.randn(B, T, Hkv, D, generator=g)
        v = torch.randn(B, T, Hkv, D, generator=g)
        cos, sin = rope_cos_sin(inv_freq, step.positions, torch.float32, scale)
        out = cache.attend(0, apply_rope(q, cos, sin), apply_rope(kr, cos, sin), v, step, k_raw=kr)
        cache.end(step)
        for b in range(B):
            ref = _stream_reference(held[b], sink, window, q[b], kr[b], v[b], inv_freq[b], scale)
            c = int(counts[b])
            assert (out[b, :c].double() - ref[:c]).abs().max() <= TOL, (i, b)
            held[b] += list(zip(kr[b, :c], v[b, :c]))
            if T > max_step and len(held[b]) > sink + window:  # big step evicts at its end
                held[b] = held[b][:sink] + held[b][len(held[b]) - window:]
        if T <= max_step and i % 3 == 2:  # reject the step's last token(s): rollback
            drop = torch.tensor([1, 0])
            cache.rollback(cache.lengths - drop)
            held[0] = held[0][:-1]
    assert cache.memory_bytes() == StreamingCache(cfg, B, sink, window, max_step).memory_bytes()


@given(seed=st.integers(0, 2**31 - 1), sink=st.integers(0, 4), window=st.integers(1, 14),
       max_step=st.integers(1, 5), short_context=st.booleans(), fixed_width=st.booleans(), in_order=st.booleans())
@example(seed=0, sink=2, window=6, max_step=3, short_context=False, fixed_width=False, in_order=False)
@example(seed=1, sink=0, window=5, max_step=2, short_context=False, fixed_width=True, in_order=False)
@example(seed=3, sink=3, window=9, max_step=5, short_context=True, fixed_width=False, in_order=False)
@example(seed=4, sink=1, window=1, max_step=3, short_context=False, fixed_width=False, in_order=False)
@example(seed=6, sink=3, window=9, max_step=5, short_context=True, fixed_width=True, in_order=False)
@example(seed=7, sink=2, window=6, max_step=3, short_context=False, fixed_width=False, in_order=True)
@example(seed=8, sink=3, window=9, max_step=5, short_context=True, fixed_width=True, in_order=True)
def test_streaming_random_steps_deep_rollbacks_and_trees(seed, sink, window, max_step, short_context, fixed_width,
                                                         in_order):
    """Random forwards, rollbacks reaching back across several forwards (so across evictions, which
    refill evicted slots out of order), token trees kept with commit_path and prefill-sized steps: every
    forward attends exactly to the sinks and the most recent tokens, at their StreamingLLM positions.
    ``short_context`` (the model's context just above sink + window + max_step) forces re-basing the
    RoPE frame every few steps; ``fixed_width`` runs the eviction path of non-CPU devices (a fixed
    number of slot moves, no host read); ``in_order`` the eviction that keeps the window in position order
    (a windowed model's, ``_in_order``), which every forward then also finds: the held positions increase."""
    context = sink + window + max_step + 12 if short_context else 256
    cfg = LlamaConfig(vocab_size=11, hidden_size=24, intermediate_size=8, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=context)
    B, Hq, Hkv, D = 3, 4, 2, 6
    cache = StreamingCache(cfg, B, sink=sink, window=window, max_step=max_step)
    cache._read_width = not fixed_width
    cache._in_order = in_order
    inv_freq = rope_inv_freq(cfg)
    held = [[] for _ in range(B)]  # reference: per row, per token, per layer (k_raw, v)
    g = torch.Generator().manual_seed(seed)

    def rand(*shape):
        return torch.randn(*shape, generator=g)

    def evict(b):
        if len(held[b]) > sink + window:
            held[b] = held[b][:sink] + held[b][len(held[b]) - window:]

    def forward(T, counts, parents=None):
        step = cache.begin(T, tree_parents=parents, counts=counts)
        assert int(step.positions.max()) < context  # the frame is re-based before a position leaves the context
        for b in range(B):  # eviction at the start of every forward
            evict(b)
        assert cache.lengths.tolist() == [len(h) for h in held]
        if in_order and T <= max_step:
            for b in range(B):
                n = int(cache.lengths[b]) + T
                held_pos = cache.slot_pos[b, sink:n]
                assert bool((held_pos[1:] > held_pos[:-1]).all()), held_pos
        cos, sin = rope_cos_sin(inv_freq, step.positions, torch.float32)
        q, kr, v = rand(2, B, T, Hq, D), rand(2, B, T, Hkv, D), rand(2, B, T, Hkv, D)
        outs = [cache.attend(layer, apply_rope(q[layer], cos, sin), apply_rope(kr[layer], cos, sin), v[layer],
                             step, k_raw=kr[layer]) for layer in range(2)]
        cache.end(step)
        return outs, q, kr, v

    def check(outs, q, kr, v, counts):
        for layer in range(2):
            for b in range(B):
                toks = [(t[layer][0], t[layer][1]) for t in held[b]]
                ref = _stream_reference(toks, sink, window, q[layer, b], kr[layer, b], v[layer, b], inv_freq)
                c = int(counts[b])
                assert (outs[layer][b, :c].double() - ref[:c]).abs().max() <= TOL

    def append(b, kr, v, idx):
        held[b] += [[(kr[layer, b, i], v[layer, b, i]) for layer in range(2)] for i in idx]

    for i in range(60):
        action = int(torch.randint(0, 10, (), generator=g))
        if i == 0 or action == 9:  # a prefill-sized step: evicts at its end
            T = max_step + 1 + int(torch.randint(0, 8, (), generator=g))
            counts = torch.randint(1, T + 1, (B,), generator=g).int()
            outs, q, kr, v = forward(T, counts)
            check(outs, q, kr, v, counts)
            for b in range(B):
                append(b, kr, v, range(int(counts[b])))
                evict(b)
        elif action < 5:  # a forward of up to max_step tokens
            T = int(torch.randint(1, max_step + 1, (), generator=g))
            counts = torch.randint(1, T + 1, (B,), generator=g).int()
            outs, q, kr, v = forward(T, counts)
            check(outs, q, kr, v, counts)
            for b in range(B):
                append(b, kr, v, range(int(counts[b])))
        elif action < 8:  # roll back up to 2 * max_step + 2 tokens, across forwards
            r = torch.randint(0, 2 * max_step + 3, (B,), generator=g)
            r = torch.minimum(r, cache.lengths.long())
            cache.rollback(cache.lengths - r)
            for b in range(B):
                held[b] = held[b][: len(held[b]) - int(r[b])]
        else:  # a token tree (a chain 0 <- 1 <- 2 plus a sibling of 1), one path kept with commit_path
            T = min(max_step, 4)
            parents = torch.tensor([-1, 0, 1, 0][:T]).expand(B, T)
            _, _, kr, v = forward(T, None, parents)  # (the kernels' tree masks are tested elsewhere)
            base = cache.lengths - T
            paths = [[0, 1, 2][: min(T, 3)], [0, 3] if T == 4 else [0], [0]]
            path = torch.full((B, 3), -1)
            acc = torch.zeros(B, dtype=torch.int32)
            for b, p in enumerate(paths):
                path[b, : len(p)] = torch.tensor(p)
                acc[b] = len(p) - 1
            cache.commit_path(base, path, acc)
            for b, p in enumerate(paths):  # the kept nodes' keys were rotated at their depths: a chain
                append(b, kr, v, p)
    assert cache.memory_bytes() == StreamingCache(cfg, B, sink, window, max_step).memory_bytes()


def test_streaming_without_eviction_equals_full_cache():
    model = tiny()
    ids = torch.randint(0, 97, (2, 20))
    s = StreamingCache(model.config, 2, sink=2, window=30, max_step=4)
    f = FullCache(model.config, 2, 40)
    assert (model.prefill(ids[:, :12], s, chunk_size=5) - model.prefill(ids[:, :12], f)).abs().max() <= TOL
    for t in range(12, 20, 2):
        assert (model(ids[:, t:t + 2], cache=s) - model(ids[:, t:t + 2], cache=f)).abs().max() <= TOL


def test_streaming_model_positions_stay_in_cache():
    model = tiny(max_position_embeddings=64)
    s = StreamingCache(model.config, 1, sink=4, window=16, max_step=4)
    model.prefill(torch.randint(0, 97, (1, 200)), s, chunk_size=32)  # a prompt longer than the context
    assert s.lengths.tolist() == [20]
    for _ in range(30):
        out = model(torch.randint(0, 97, (1, 3)), cache=s)
        assert torch.isfinite(out).all()
    assert s.lengths.tolist() == [23]


# ---------------------------------------------------------------- retrieval cache
def _prefilled(model, lens, max_len=96, cs=4):
    prompts = [torch.randint(0, 97, (n,)) for n in lens]
    full = FullCache(model.config, len(lens), max_len, chunk_size=cs)
    model.prefill(prompts, full, chunk_size=16)
    return prompts, full


def test_retrieval_selection_and_gather():
    model = tiny()
    _, full = _prefilled(model, (45, 62))
    cs, budget = 4, 24
    rc = RetrievalCache(model.config, full, budget=budget, chunk_size=cs, max_step=4, sink_chunks=1, recent_chunks=1)
    for layer in range(2):
        idx = rc.chunk_idx[layer]  # [B, Hkv, budget // cs]
        for b, L in enumerate(full.lengths.tolist()):
            nc = L // cs
            # scores recomputed from scratch (chunk means of the whole cache, the last prompt token's query)
            means = tk.chunk_mean_keys(full.k[layer][b:b + 1, :L], cs, backend="reference")[0]  # [nc, Hkv, D]
            q = full.last_query[layer][b].float().view(2, 3, -1)
            p = torch.einsum("hgd,chd->hgc", q, means).div(math.sqrt(q.shape[-1])).softmax(-1).sum(1)
            for h in range(2):
                sel = idx[b, h].tolist()
                assert sel == sorted(sel) and 0 in sel and nc - 1 in sel
                rest = [c for c in range(1, nc - 1)]
                top = sorted(rest, key=lambda c: (-p[h, c].item(), c))[: len(sel) - 2]
                assert sorted(top + [0, nc - 1]) == sel
                for i, c in enumerate(sel):
                    assert torch.equal(rc.k[layer][b, i * cs:(i + 1) * cs, h], full.k[layer][b, c * cs:(c + 1) * cs, h])
                    assert torch.equal(rc.v[layer][b, i * cs:(i + 1) * cs, h], full.v[layer][b, c * cs:(c + 1) * cs, h])
            tail = L - nc * cs
            assert torch.equal(rc.k[layer][b, budget:budget + tail], full.k[layer][b, nc * cs:L])
    assert rc.lengths.tolist() == [budget + 45 % 4, budget + 62 % 4]


def test_retrieval_attention_equals_attention_over_selected_tokens():
    model = tiny()
    _, full = _prefilled(model, (45, 62))
    cs, budget, T = 4, 24, 3
    rc = RetrievalCache(model.config, full, budget=budget, chunk_size=cs, max_step=4)
    B, Hq, Hkv, D = 2, 6, 2, 8
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, T, H, D, generator=g) for H in (Hq, Hkv, Hkv))
    step = rc.begin(T)
    out = rc.attend(0, q, k, v, step)
    for b, L in enumerate(full.lengths.tolist()):
        nc = L // cs
        assert step.positions[b].tolist() == list(range(L, L + T))  # true absolute positions
        for h in range(Hkv):
            toks = [c * cs + t for c in rc.chunk_idx[0][b, h].tolist() for t in range(cs)] + list(range(nc * cs, L))
            kk = torch.cat([full.k[0][b, toks, h], k[b, :, h]]).double()
            vv = torch.cat([full.v[0][b, toks, h], v[b, :, h]]).double()
            n = len(toks)
            for j in range(h * 3, h * 3 + 3):
                s = q[b, :, j].double() @ kk.T / math.sqrt(D)
                s = s.masked_fill(torch.arange(n + T)[None] > (n + torch.arange(T))[:, None], float("-inf"))
                ref = s.softmax(-1) @ vv
                assert (out[b, :, j].double() - ref).abs().max() <= TOL


def test_retrieval_with_whole_context_budget_equals_full_cache():
    """Budget = every complete chunk: the retrieval cache holds every token (per-head order differs), so the
    model's logits through it equal the full cache's, across speculative steps, syncs and rebuilds."""
    model = tiny()
    prompt = torch.randint(0, 97, (2, 40))
    full = FullCache(model.config, 2, 120, chunk_size=4)
    ref = FullCache(model.config, 2, 120)
    model.prefill(prompt, full)
    model.prefill(prompt, ref)
    rc = RetrievalCache(model.config, full, budget=40, chunk_size=4, max_step=6, rebuild_stride=100,
                        recent_chunks=0, min_acceptance=0.0)
    g = torch.Generator().manual_seed(0)
    for it in range(10):
        draft = torch.randint(0, 97, (2, 3), generator=g)
        a = model(draft, cache=rc)  # middle level: speculative tokens on the retrieval cache
        b = model(draft, cache=ref)
        assert (a - b).abs().max() <= TOL, it
        model(draft, cache=full)
        # keep the full length below 44 so that 10 chunks stay the whole context
        new = (full.lengths - 3 + torch.randint(0, 3, (2,), generator=g).int()).clamp(max=43)
        full.rollback(new)
        ref.rollback(new)
        assert rc.sync() is False
        assert torch.equal(rc.lengths.long(), 40 + full.lengths.long() - rc.base_pos)
        if it % 3 == 1:
            rc.rebuild()
    assert rc.num_rebuilds == 4


def test_retrieval_rebuild_triggers_and_errors():
    model = tiny()
    _, full = _prefilled(model, (45, 62))
    with pytest.raises(ValueError, match="exceeds a sequence's complete chunks"):
        RetrievalCache(model.config, full, budget=48, chunk_size=4, max_step=4)
    with pytest.raises(ValueError, match="chunk_size"):
        RetrievalCache(model.config, full, budget=16, chunk_size=8, max_step=4)
    with pytest.raises(ValueError, match="multiple"):
        RetrievalCache(model.config, full, budget=18, chunk_size=4, max_step=4)
    with pytest.raises(ValueError, match="must exceed"):
        RetrievalCache(model.config, full, budget=8, chunk_size=4, max_step=4, sink_chunks=1, recent_chunks=1)
    with pytest.raises(ValueError, match="chunk_size"):
        RetrievalCache(model.config, FullCache(model.config, 2, 64), budget=16, chunk_size=4, max_step=4)
    for name, bad in (("budget", 0), ("max_step", 0), ("sink_chunks", -1), ("rebuild_stride", 0),
                      ("acceptance_window", 0), ("rebuild_stride", 2.0), ("max_step", True)):
        args = dict(budget=16, chunk_size=4, max_step=4) | {name: bad}
        with pytest.raises(ValueError, match=f"{name} must be an int >= "):
            RetrievalCache(model.config, full, **args)
    rc = RetrievalCache(model.config, full, budget=16, chunk_size=4, max_step=4, rebuild_stride=100,
                        min_acceptance=0.6, acceptance_window=3)
    assert rc.num_rebuilds == 1
    model(torch.zeros(2, 2, dtype=torch.long), cache=full)
    assert rc.sync() is False
    for r in (0.9, 0.2, 0.3):
        rc.record_acceptance(r)
    assert rc.sync() is True and rc.num_rebuilds == 2  # rolling acceptance 0.47 < 0.6
    with pytest.raises(ValueError, match="full"):
        model(torch.zeros(2, rc.capacity - 16, dtype=torch.long), cache=rc)  # more than the free slots


# ---------------------------------------------------------------- memory
def test_constant_memory_over_long_decode():
    model = tiny()
    prompt = torch.randint(0, 97, (2, 48))
    full = FullCache(model.config, 2, 512, chunk_size=4)
    stream = StreamingCache(model.config, 2, sink=4, window=24, max_step=4)
    model.prefill(prompt, full)
    model.prefill(prompt, stream)
    rc = RetrievalCache(model.config, full, budget=32, chunk_size=4, max_step=4, rebuild_stride=16)
    caches = (full, stream, rc)

    def snapshot():
        return [(c.memory_bytes(), [t.data_ptr() for t in c._tensors()]) for c in caches]

    before = snapshot()
    g = torch.Generator().manual_seed(0)
    for _ in range(100):
        toks = torch.randint(0, 97, (2, 4), generator=g)
        model(toks[:, :3], cache=stream)
        stream.rollback(stream.lengths - 1)
        model(toks, cache=rc)
        model(toks, cache=full)
        full.rollback(full.lengths - torch.randint(0, 4, (2,), generator=g).int())
        rc.sync()
    assert snapshot() == before
    assert stream.lengths.max() <= 4 + 24 + 4 and rc.num_rebuilds > 5
    assert int(full.lengths.min()) > 48 + 100


def test_commit_path_at_the_capacity_with_a_wide_path():
    """A path tensor wider than the tree, on a tree that ends at the cache's last slot: the unused
    entries (their slots would lie past the capacity) leave the kept nodes intact."""
    model = tiny()
    prompt = torch.randint(0, 97, (2, 9))
    cache = FullCache(model.config, 2, 12)
    model.prefill(prompt, cache)
    parents = torch.tensor([[-1, 0, 1], [-1, 0, 0]])
    toks = torch.randint(0, 97, (2, 3))
    base = cache.lengths.clone()
    model(toks, cache=cache, tree_parents=parents)  # fills slots 9..11: the cache is full
    path = torch.tensor([[0, 1, 2, -1, -1, -1], [0, 2, -1, -1, -1, -1]])
    acc = torch.tensor([2, 1], dtype=torch.int32)
    cache.commit_path(base, path, acc)
    assert cache.lengths.tolist() == [12, 11]
    for b in range(2):
        seq = torch.cat([prompt[b], toks[b, path[b, :acc[b] + 1]]])[None]
        ref = FullCache(model.config, 1, 12)
        model.prefill(seq, ref)
        n = seq.shape[1]
        for layer in range(model.config.num_hidden_layers):
            assert (cache.k[layer][b, :n] - ref.k[layer][0, :n]).abs().max() <= TOL
            assert (cache.v[layer][b, :n] - ref.v[layer][0, :n]).abs().max() <= TOL


# ---------------------------------------------------------------- streaming cache loaded from a full cache
@pytest.mark.parametrize("rope", [None, YARN, LONGROPE])
def test_streaming_fill_from_full_equals_attention_over_sink_and_window(rope):
    """``StreamingCache.fill_from``: row b keeps the sinks and the last ``window`` of the first
    ``lengths[b]`` tokens of a full cache (their keys and values as the full cache holds them), then
    behaves as a StreamingLLM cache: attention over them equals the naive reference, through further
    steps, evictions and a rollback; a row that evicted nothing holds the full cache's keys bitwise.
    (With YaRN RoPE too: rotating the full cache's keys back undoes its factor on cos and sin; with LongRoPE the
    streaming cache takes the full cache's choice of factors per row.)"""
    cfg = LlamaConfig(vocab_size=11, hidden_size=24, intermediate_size=8, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, rope_scaling=rope)
    B, Hq, Hkv, D, sink, window = 3, 4, 2, 6, 2, 8
    g = torch.Generator().manual_seed(0)
    rows_long = torch.tensor([True, False, True])
    inv_freq, scale = row_inv_freq(cfg, rows_long), rope_attention_scale(cfg)
    full = FullCache(cfg, B, 64, rope_long=rows_long)
    kr_full, v_full = torch.randn(B, 30, Hkv, D, generator=g), torch.randn(B, 30, Hkv, D, generator=g)
    step = full.begin(30)
    cos, sin = rope_cos_sin(inv_freq, step.positions, torch.float32, scale)
    full.attend(0, apply_rope(torch.randn(B, 30, Hq, D, generator=g), cos, sin), apply_rope(kr_full, cos, sin),
                v_full, step)
    full.end(step)
    lengths = torch.tensor([28, 9, 30])  # row 1 fits (keep = 10): nothing evicted
    cache = StreamingCache(cfg, B, sink=sink, window=window, max_step=3, rope_long=False)
    cache.fill_from(full, lengths)
    assert (cache.rope_long is None) == (rope is not LONGROPE)
    assert cache.rope_long is None or torch.equal(cache.rope_long, rows_long)
    assert cache.lengths.tolist() == [10, 9, 10] and cache.evicted.tolist() == [18, 0, 20]
    assert torch.equal(cache.k[0][1, :9], full.k[0][1, :9]) and torch.equal(cache.v[0][1, :9], full.v[0][1, :9])
    held = []
    for b, n in enumerate(lengths.tolist()):
        keep = list(range(n)) if n <= sink + window else list(range(sink)) + list(range(n - window, n))
        held.append([(kr_full[b, i], v_full[b, i]) for i in keep])
        assert torch.equal(cache.v[0][b, :len(keep)], v_full[b, keep])
    for i, T in enumerate([2, 3, 1, 3, 2]):
        step = cache.begin(T)
        for b in range(B):
            if len(held[b]) > sink + window:
                held[b] = held[b][:sink] + held[b][len(held[b]) - window:]
        assert cache.lengths.tolist() == [len(h) for h in held]
        q = torch.randn(B, T, Hq, D, generator=g)
        kr = torch.randn(B, T, Hkv, D, generator=g)
        v = torch.randn(B, T, Hkv, D, generator=g)
        cos, sin = rope_cos_sin(inv_freq, step.positions, torch.float32, scale)
        out = cache.attend(0, apply_rope(q, cos, sin), apply_rope(kr, cos, sin), v, step, k_raw=kr)
        cache.end(step)
        for b in range(B):
            ref = _stream_reference(held[b], sink, window, q[b], kr[b], v[b], inv_freq[b], scale)
            assert (out[b].double() - ref).abs().max() <= TOL, (i, b)
            held[b] += list(zip(kr[b], v[b]))
        if i == 1:  # reject the last token of row 0
            cache.rollback(cache.lengths - torch.tensor([1, 0, 0]))
            held[0] = held[0][:-1]


def test_streaming_fill_from_without_eviction_equals_the_full_cache():
    """A model forward on a cache loaded from a full cache that evicted nothing is bitwise the forward
    on the full cache cut back to the same lengths."""
    model = tiny()
    prompts = [torch.randint(0, 97, (n,)) for n in (14, 9)]
    full = FullCache(model.config, 2, 32)
    model.prefill(prompts, full)
    cache = StreamingCache(model.config, 2, sink=4, window=12, max_step=4)
    cache.fill_from(full, full.lengths - 2)
    full.rollback(full.lengths - 2)
    ids = torch.randint(0, 97, (2, 3))
    assert torch.equal(model(ids, cache=cache), model(ids, cache=full))


@pytest.mark.skipif(not tk.backend_status("triton", "cuda" if torch.cuda.is_available() else "cpu")[0],
                    reason="needs Triton (a GPU, or TRITON_INTERPRET=1)")
@given(seed=st.integers(0, 2**31 - 1), sink=st.integers(0, 3), window=st.integers(1, 9),
       max_step=st.integers(1, 4))
@example(seed=0, sink=2, window=5, max_step=3)
@example(seed=5, sink=0, window=1, max_step=4)
def test_streaming_eviction_moves_with_the_triton_kernel(seed, sink, window, max_step):
    """The GPU's eviction (a fixed width of candidate slot moves, no host read) done by the Triton kernel
    that copies only the real moves (triforce_kernels/triton/slot_move.py) leaves a StreamingLLM cache
    bitwise as the PyTorch move does: every layer's k, v and un-rotated k, the slots' positions and
    the lengths, after random forwards, trees kept with commit_path, and rollbacks across evictions."""
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    cfg = LlamaConfig(vocab_size=11, hidden_size=24, intermediate_size=8, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    B, Hq, Hkv, D = 3, 4, 2, 6
    caches = [StreamingCache(cfg, B, sink=sink, window=window, max_step=max_step, device=dev) for _ in range(2)]
    caches[0]._read_width, caches[0]._triton_move = False, False  # the PyTorch move of the fixed width
    caches[1]._read_width, caches[1]._triton_move = False, True   # the kernel
    inv_freq = rope_inv_freq(cfg, dev)
    g = torch.Generator().manual_seed(seed)
    from triforce_kernels.triton import slot_move
    real, moved = slot_move.move_slots, []
    slot_move.move_slots = lambda *a: (moved.append(int(a[3].sum())), real(*a))
    try:
        _random_streaming_twins(caches, g, B, Hq, Hkv, D, max_step, inv_freq, dev)
    finally:
        slot_move.move_slots = real
    assert moved  # every eviction went through the kernel
    if (seed, sink, window, max_step) in ((0, 2, 5, 3), (5, 0, 1, 4)):  # (the examples: real moves among them; a
        assert sum(moved) > 0  # drawn case may move none, e.g. seed 47818, no sink, a window of 8, steps of 3)


def _random_streaming_twins(caches, g, B, Hq, Hkv, D, max_step, inv_freq, dev):
    for i in range(40):
        action = int(torch.randint(0, 10, (), generator=g))
        if action < 8:
            T = max_step + 1 + int(torch.randint(0, 3, (), generator=g)) if action == 0 else \
                int(torch.randint(1, max_step + 1, (), generator=g))
            counts = torch.randint(1, T + 1, (B,), generator=g).int().to(dev)
            parents = None
            if action == 7 and T > 1:  # a tree, then its path to its last node kept
                parents = torch.tensor([[-1] + [int(torch.randint(0, t, (), generator=g)) for t in range(1, T)]] * B)
                counts = torch.full((B,), T, dtype=torch.int32, device=dev)
            q, kr, v = (torch.randn(B, T, h, D, generator=g).to(dev) for h in (Hq, Hkv, Hkv))
            for cache in caches:
                step = cache.begin(T, tree_parents=None if parents is None else parents.to(dev), counts=counts)
                cos, sin = rope_cos_sin(inv_freq, step.positions, torch.float32)
                for layer in range(2):
                    cache.attend(layer, apply_rope(q, cos, sin), apply_rope(kr, cos, sin), v, step, k_raw=kr)
                cache.end(step)
                if parents is not None:
                    path, t = [T - 1], T - 1
                    while t > 0:
                        t = int(parents[0, t])
                        path.append(t)
                    path = torch.tensor(path[::-1], device=dev)[None].expand(B, -1)
                    cache.commit_path(cache.lengths - T, path, torch.full((B,), path.shape[1] - 1, device=dev))
        else:
            r = torch.minimum(torch.randint(0, 2 * max_step + 2, (B,), generator=g).to(dev), caches[0].lengths.long())
            for cache in caches:
                cache.rollback(cache.lengths - r)
        a, b = caches
        assert torch.equal(a._kvr, b._kvr) and torch.equal(a.slot_pos, b.slot_pos), i
        assert torch.equal(a.lengths, b.lengths) and torch.equal(a.evicted, b.evicted), i
        assert (a._ordered, a._bound, a._next_bound) == (b._ordered, b._bound, b._next_bound), i


def test_streaming_fill_from_checks():
    model = tiny()
    full = FullCache(model.config, 2, 32)
    cache = StreamingCache(model.config, 2, sink=2, window=8, max_step=2)
    with pytest.raises(TypeError, match="FullCache"):
        cache.fill_from(StreamingCache(model.config, 2, sink=2, window=8, max_step=2))
    with pytest.raises(ValueError, match="sequences"):
        cache.fill_from(FullCache(model.config, 3, 32))
    with pytest.raises(ValueError, match="different model config"):
        cache.fill_from(FullCache(tiny(num_hidden_layers=3).config, 2, 32))
    with pytest.raises(ValueError, match="lengths"):
        cache.fill_from(full, torch.zeros(3, dtype=torch.int64))


# ---------------------------------------------------------------- rows leaving the batch
def _twin_caches(model, kind, prompts, rope_long=None):
    """Two identical prefilled caches of ``kind`` (with their full caches, for a retrieval cache) -> a list of
    (cache, full cache or None) pairs. ``rope_long``: the caches' LongRoPE choice per row."""
    pair = []
    for _ in range(2):
        if kind == "streaming":
            c = StreamingCache(model.config, len(prompts), sink=2, window=12, max_step=4, rope_long=rope_long)
            model.prefill(prompts, c, chunk_size=8)
            pair.append((c, None))
            continue
        full = FullCache(model.config, len(prompts), 96, chunk_size=None if kind == "full" else 4, rope_long=rope_long)
        model.prefill(prompts, full, chunk_size=16)
        if kind == "retrieval":
            pair.append((RetrievalCache(model.config, full, budget=16, chunk_size=4, max_step=8, rebuild_stride=12),
                         full))
        else:
            pair.append((full, None))
    return pair


def _step(model, cache, full, toks, keep, tree: bool):
    """One speculative step: a forward of ``toks``, then ``keep`` of them kept (``tree``: the 4 tokens as the
    tree ``TREE``, of which the path 0, 1, 3 is kept up to ``keep`` nodes; a retrieval cache's full cache takes
    the tokens and the retrieval cache syncs from it) -> the logits."""
    B, T = toks.shape
    if full is not None:
        out = model(toks, cache=cache)
        model(toks, cache=full)
        full.rollback(full.lengths - T + keep)
        cache.sync()
        return out
    if not tree:
        out = model(toks, cache=cache)
        cache.rollback(cache.lengths - T + keep)  # relative: a StreamingLLM cache may evict as it begins
        return out
    base = cache.lengths.clone()
    out = model(toks, cache=cache, tree_parents=TREE.expand(B, 4))
    cache.commit_path(base, torch.tensor([0, 1, 3]).expand(B, 3), keep.clamp(max=3).int() - 1)
    return out


TREE = torch.tensor([-1, 0, 0, 1])


@given(st.data())
def test_select_rows_continues_as_the_rows_would_have(data):
    """After ``select_rows(rows)`` a cache's row ``i`` continues exactly as the old row ``rows[i]``: its
    later forwards (chains, trees, rollbacks, a retrieval cache's syncs and rebuilds) give that row's logits
    in an untouched twin, bit for bit; lengths, chunk-mean keys and last queries follow. Rows kept in place
    (the order :func:`rows_in_place` gives) and any other order (gathered) alike. (The twin's dropped rows stop
    growing, as finished rows do: when a retrieval cache rebuilds is decided over all its rows.) With LongRoPE, each
    row's choice of factor set goes with it."""
    from triforce.models.cache import rows_in_place

    kind = data.draw(st.sampled_from(["full", "chunked", "streaming", "retrieval"]), label="kind")
    B = data.draw(st.integers(2, 4), label="B")
    lens = data.draw(st.lists(st.integers(17, 30), min_size=B, max_size=B), label="lens")
    g = torch.Generator().manual_seed(data.draw(st.integers(0, 2 ** 16), label="seed"))
    rope_long = None
    if data.draw(st.booleans(), label="longrope"):  # head_dim 8: four pairs
        model = tiny(rope_scaling={"rope_type": "longrope", "short_factor": [1.0, 1.5, 2.0, 3.0],
                                   "long_factor": [2.0, 4.0, 8.0, 16.0], "original_max_position_embeddings": 64})
        rope_long = torch.tensor(data.draw(st.lists(st.booleans(), min_size=B, max_size=B), label="rows long"))
    else:
        model = tiny()
    prompts = [torch.randint(0, 97, (n,), generator=g) for n in lens]
    (a, fa), (b, fb) = _twin_caches(model, kind, prompts, rope_long)
    live = sorted(data.draw(st.sets(st.integers(0, B - 1), min_size=1, max_size=B), label="live"))
    rows = rows_in_place(live) if data.draw(st.booleans(), label="in place") else \
        data.draw(st.permutations(live), label="order")
    for it in range(6):
        tree = kind in ("full", "chunked") and it % 2 == 1
        T = 4 if tree else data.draw(st.integers(1, 4), label="T")
        toks = torch.randint(0, 97, (B, T), generator=g)
        keep = torch.randint(1, T + 1, (B,), generator=g)
        if it == 2:
            a.select_rows(rows)
            if fa is not None:
                fa.select_rows(rows)
        sel = torch.tensor(rows) if it >= 2 else torch.arange(B)
        if kind == "retrieval" and it >= 2:
            # the twin's other rows stop growing, as an engine's rows do once they are done: a retrieval cache's
            # rebuild is the batch's decision (any row's growth or tail triggers it for all)
            keep = torch.where(torch.isin(torch.arange(B), sel), keep, 0)
        out_a = _step(model, a, fa, toks[sel], keep[sel], tree)
        out_b = _step(model, b, fb, toks, keep, tree)
        assert torch.equal(out_a, out_b[sel]), (kind, it, rows)
        assert torch.equal(a.lengths, b.lengths[sel]), (kind, it)
        if kind == "retrieval" and it == 3:
            a.rebuild()
            b.rebuild()
    if kind == "chunked":
        check_chunk_means(a)
        for layer in range(a.num_layers):
            assert torch.equal(a.last_query[layer], b.last_query[layer][sel])
    assert a.batch_size == len(rows) and a.lengths.shape == (len(rows),)
    assert rope_long is None or torch.equal(a.rope_long, rope_long[torch.tensor(rows)])


def test_select_rows_in_place_copies_only_the_moved_rows():
    """A full cache keeps its buffers (narrowed views of them) when rows are taken in place; any other order
    gathers new ones. The validation names what is wrong."""
    from triforce.models.cache import rows_in_place

    model = tiny()
    prompts = [torch.randint(0, 97, (n,)) for n in (20, 25, 18, 30)]
    cache = FullCache(model.config, 4, 64, chunk_size=4)
    model.prefill(prompts, cache)
    assert rows_in_place([1, 2, 3]) == [3, 1, 2] and rows_in_place([0, 3]) == [0, 3]
    ptr = cache.k[0].data_ptr()
    k3 = cache.k[0][3].clone()
    cache.select_rows([3, 1, 2])  # row 3 moves into the place of row 0, which left
    assert cache.k[0].data_ptr() == ptr and cache.k[0].shape[0] == 3 and torch.equal(cache.k[0][0], k3)
    assert cache.lengths.tolist() == [30, 25, 18]
    cache.select_rows(torch.tensor([1, 0]))  # row 0 would be overwritten before it is read: gathered
    assert cache.k[0].data_ptr() != ptr and cache.lengths.tolist() == [25, 30]
    for bad in ([], [0, 0], [2], [-1], [0.5], torch.tensor([0.0]), torch.tensor([[0]]), [True]):
        with pytest.raises(ValueError, match="rows must be"):
            cache.select_rows(bad)


# ---------------------------------------------------------------- the sorted eviction's in-place shift
def _shift_op():
    from triforce.models import cache as cache_module

    return cache_module._cache_op("shift_slots_")


needs_extension = pytest.mark.skipif(_shift_op() is None, reason="the C++ extension is not built")


@needs_extension
@given(data=st.data(), N=st.integers(1, 3), B=st.integers(1, 4), S=st.integers(1, 12), R=st.integers(0, 5),
       dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.int8, torch.float64]))
@example(data=None, N=2, B=3, S=10, R=4, dtype=torch.float32)
def test_shift_slots_moves_each_row_as_a_copy_would(data, N, B, S, R, dtype):
    """``triforce_C::shift_slots_``: slots ``[lo, hi)`` of every ``buf[n, b]`` take slots ``[lo + shift[b], hi +
    shift[b])`` as they were (the ranges overlap: one memmove each), in either direction; rows with shift 0 and
    slots outside ``[lo, hi)`` keep their bytes."""
    if data is None:  # the StreamingLLM case: a window shifted down by 1, 2 and 0 slots
        lo, hi, shift = 2, 7, [1, 3, 0]
    else:
        lo = data.draw(st.integers(0, S), label="lo")
        hi = data.draw(st.integers(lo, S), label="hi")
        shift = data.draw(st.lists(st.integers(-lo, S - hi), min_size=B, max_size=B), label="shift")
    buf = torch.randint(-100, 100, (N, B, S, R)).to(dtype)
    want = buf.clone()
    for b, e in enumerate(shift):
        want[:, b, lo:hi] = buf[:, b, lo + e: hi + e]
    torch.ops.triforce_C.shift_slots_(buf, torch.tensor(shift, dtype=torch.int64), lo, hi)
    assert torch.equal(buf, want)


@needs_extension
def test_shift_slots_checks_its_arguments():
    op, buf, shift = torch.ops.triforce_C.shift_slots_, torch.zeros(2, 3, 8, 4), torch.zeros(3, dtype=torch.int64)
    for bad, args, match in [
            ("a slot past the end", (buf, torch.tensor([0, 2, 0]), 1, 7), "row 1's shift 2 reads slots \\[3, 9\\)"),
            ("a slot before the start", (buf, torch.tensor([-2, 0, 0]), 1, 7), "row 0's shift -2"),
            ("lo > hi", (buf, shift, 5, 4), "0 <= lo <= hi <= S"),
            ("hi > S", (buf, shift, 0, 9), "0 <= lo <= hi <= S"),
            ("int32 shift", (buf, shift.int(), 0, 4), "int64 \\[B\\]"),
            ("a shift per row", (buf, shift[:2], 0, 4), "int64 \\[B\\] with B = 3"),
            ("3-D", (buf[0], shift, 0, 4), "contiguous \\[N, B, S, R\\]"),
            ("strided", (buf[:, :, ::2], shift, 0, 4), "not contiguous")]:
        before = buf.clone()
        with pytest.raises(RuntimeError, match=match):
            op(*args)
        assert torch.equal(buf, before), bad


@needs_extension
@given(seed=st.integers(0, 2**31 - 1), sink=st.integers(0, 3), window=st.integers(1, 9), max_step=st.integers(1, 4),
       in_order=st.booleans())
@example(seed=0, sink=2, window=5, max_step=3, in_order=True)
@example(seed=5, sink=0, window=1, max_step=4, in_order=True)
@example(seed=1, sink=3, window=6, max_step=2, in_order=False)
def test_native_bookkeeping_leaves_the_cache_as_pytorchs_ops_do(seed, sink, window, max_step, in_order):
    """A float32 StreamingLLM cache's bookkeeping on the CPU takes the extension's ops: the sorted eviction (a
    windowed model's, ``_in_order``) shifts each row's window in place (``shift_slots_``) instead of copying it
    through a clone, and the sinks' keys are rotated again in one pass (``rope_into_``) instead of through
    ``apply_rope``. The cache ends bitwise as with PyTorch's ops, after random forwards, trees kept with
    commit_path, prefill-sized steps and rollbacks across evictions; and the ops really served."""
    from triforce.models import cache as cache_module

    cfg = LlamaConfig(vocab_size=11, hidden_size=24, intermediate_size=8, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    B, Hq, Hkv, D = 3, 4, 2, 6
    caches = [StreamingCache(cfg, B, sink=sink, window=window, max_step=max_step) for _ in range(2)]
    assert caches[1]._shift_in_place and caches[1]._native_rope
    caches[0]._shift_in_place = caches[0]._native_rope = False
    for cache in caches:
        cache._in_order = in_order
    shift, rope, rows, rotated = _shift_op(), cache_module._cache_op("rope_into_"), [], []
    ops = cache_module._CACHE_OPS
    ops["shift_slots_"] = lambda buf, e, lo, hi: (rows.append(int((e != 0).sum())), shift(buf, e, lo, hi))
    ops["rope_into_"] = lambda out, *a: (rotated.append(out.numel()), rope(out, *a))
    try:
        _random_streaming_twins(caches, torch.Generator().manual_seed(seed), B, Hq, Hkv, D, max_step,
                                rope_inv_freq(cfg), "cpu")
    finally:
        ops["shift_slots_"], ops["rope_into_"] = shift, rope
    assert sum(rows) > 0 or not in_order
    assert sum(rotated) > 0 or sink == 0


@needs_extension
@given(data=st.data())
@example(data=None)
def test_rope_into_is_apply_rope_bitwise(data):
    """``triforce_C::rope_into_`` (a float32 StreamingLLM cache's sinks rotated again, written into a view of its
    keys) gives ``apply_rope``'s bits: strided views of one buffer as the cache passes them, cos / sin per row and
    slot, values of any size (zeros, overflow to inf, NaN where inf meets inf: only where apply_rope's is)."""
    if data is None:  # SmolLM2's sinks: 30 layers, 16 slots, 3 heads of 64
        G, B, n, H, D, cap, scale, seed = 30, 2, 16, 3, 64, 40, 1.0, 0
    else:
        G, B, n, H = (data.draw(st.integers(1, 3), label=k) for k in "GBnH")
        D = 2 * data.draw(st.integers(0, 8), label="D/2")
        cap, seed = n + 3, data.draw(st.integers(0, 2**31 - 1), label="seed")
        scale = data.draw(st.sampled_from([1.0, 1e20, 3e38]), label="scale")
    g = torch.Generator().manual_seed(seed)
    buf = torch.randn(3, G, B, cap, H, D, generator=g) * scale
    if D:
        buf[2, ..., 0] = 0.0
    cos, sin = (torch.randn(B, n, 1, D, generator=g) * scale for _ in range(2))
    x, out = buf[2, :, :, 1:n + 1], buf[0, :, :, 2:n + 2]  # k_raw's and k's slots, as the cache's _rotate
    want = apply_rope(x, cos, sin)
    before = buf.clone()
    torch.ops.triforce_C.rope_into_(out, x, cos, sin)
    nan = want.isnan()
    assert torch.equal(out.isnan(), nan) and torch.equal(out[~nan], want[~nan])
    buf[0, :, :, 2:n + 2] = before[0, :, :, 2:n + 2]
    assert torch.equal(buf.nan_to_num(), before.nan_to_num())  # nothing else written


@needs_extension
def test_rope_into_checks_its_arguments():
    op = torch.ops.triforce_C.rope_into_
    buf, cos = torch.zeros(2, 2, 3, 5, 2, 4), torch.zeros(3, 5, 1, 4)
    x, out = buf[0], buf[1]
    for bad, args, match in [
            ("bfloat16", (out.bfloat16(), x.bfloat16(), cos.bfloat16(), cos.bfloat16()), "float32"),
            ("4-D", (out[0], x[0], cos, cos), "\\[G, B, n, H, D\\]"),
            ("other shapes", (out[:, :2], x, cos, cos), "of one shape"),
            ("cos per slot", (out, x, cos[:, :4], cos), "contiguous \\[B, n, 1, D\\]"),
            ("odd D", (out[..., :3], x[..., :3], cos[..., :3], cos[..., :3]), "D must be even"),
            ("strided D", (out[..., ::2], x[..., ::2], cos[..., ::2].contiguous(), cos[..., ::2].contiguous()),
             "contiguous last dimension"),
            ("in place", (x, x, cos, cos), "must not overlap x"),
            ("expanded out", (out[:, :, :1].expand(2, 3, 5, 2, 4), x, cos, cos), "share memory")]:
        with pytest.raises(RuntimeError, match=match):
            op(*args)
