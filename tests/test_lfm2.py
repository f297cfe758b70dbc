"""LFM2 (``model_type="lfm2"``: Lfm2ForCausalLM): Llama's layers, some of whose mixers are a gated short convolution
(:class:`~triforce.models.llama.ShortConv`) whose last inputs every cache keeps in a ring per layer; against
transformers, and the caches' convolution state through steps, trees, rollbacks, evictions and retrieval."""
import pytest
import torch

import triforce.models.cache as cache_module
from triforce.models import LlamaConfig
from triforce.models.cache import FullCache, RetrievalCache, StreamingCache
from triforce.models.llama import Attention, ShortConv

from .test_engines import TINY_CASES, assert_greedy_equals_autoregressive
from .test_families import (TOL, assert_common_defaults, assert_save_loads, assert_saved_reads_back, randomize_,
                            tiny_family)
from .test_sliding_window import assert_every_path_matches, assert_pass_equals_steps

transformers = pytest.importorskip("transformers")

BASE = dict(vocab_size=101, hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=256, block_multiple_of=16)
CASES = {"hybrid": dict(layer_types=["conv", "full_attention", "conv", "conv"]),
         # (biased convolutions of 4 taps, the attention layers by index, an MLP of intermediate_size itself, untied)
         "biased-k4-untied": dict(full_attn_idxs=[0, 2], conv_bias=True, conv_L_cache=4, block_auto_adjust_ff_dim=False,
                                  tie_word_embeddings=False, norm_eps=1e-6)}


def pair(case="hybrid"):
    """transformers' Lfm2ForCausalLM of ``case`` (random weights, the convolution layers' drawn larger than
    transformers' initialisation so that they count; biases and norms randomised) and ours."""
    from triforce.models.loading import _build

    torch.manual_seed(0)
    config = transformers.Lfm2Config(**{**BASE, **CASES[case]}, attn_implementation="eager")
    hf = randomize_(transformers.Lfm2ForCausalLM(config).eval())
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if ".conv." in name and name.endswith("weight"):
                p.normal_(0, 0.3)
    return hf, _build(LlamaConfig.from_dict(hf.config.to_dict()), hf.state_dict(), None, None)


def tiny(seed, types=("conv", "full_attention", "conv"), **extra):
    return tiny_family("lfm2", seed, layers=len(types), extra={"layer_types": list(types), "conv_bias": True,
                                                                **extra})


@pytest.mark.parametrize("case", list(CASES))
def test_logits_and_every_path_match_transformers(tmp_path, case):
    """Every path (the plain forward, a chunked prefill, a verify pass, one-token steps, a tree whose branches
    convolve over their own ancestors) gives transformers' logits; our save reads back in transformers as the same
    model."""
    hf, ours = pair(case)
    kinds = [type(layer.self_attn) for layer in ours.model.layers]
    assert kinds == [ShortConv if t == "conv" else Attention for t in hf.config.layer_types]
    mlp = ours.model.layers[0].mlp
    assert mlp.gate_proj.weight.shape[0] == hf.model.layers[0].feed_forward.w1.weight.shape[0]
    assert ours.config.kv_heads_per_layer == tuple(0 if t == "conv" else 2 for t in hf.config.layer_types)
    assert_every_path_matches(hf, ours)
    assert_saved_reads_back(tmp_path, hf, ours)


def test_transformers_directory_loads(tmp_path):
    hf, ours = pair("biased-k4-untied")
    ids = torch.randint(0, 101, (2, 24), generator=torch.Generator().manual_seed(5))
    assert_save_loads(hf, tmp_path, ids, ours)


def test_each_part_moves_the_logits():
    """The convolution's taps (its oldest too) and bias, and each third of in_proj count; so does the history a cached
    step reads: the ring's inputs zeroed, the next step's logits move."""
    hf, ours = pair("biased-k4-untied")
    ids = torch.randint(0, 101, (2, 16), generator=torch.Generator().manual_seed(4))
    conv = ours.model.layers[1].self_attn
    assert type(conv) is ShortConv
    w = conv.in_proj.weight
    assert_parts_count(hf, ours, ids, (conv.conv.weight[:, :, 0], conv.conv.weight[:, :, -1], conv.conv.bias,
                                       w[:64], w[64:128], w[128:]), lambda cache: cache.conv[1].zero_())


def assert_parts_count(hf, ours, ids, parts, clear):
    """Each tensor of ``parts`` (views of ``ours``' weights) moves ``ours``' logits on ``ids`` when negated and doubled,
    and restored they are transformers' again; so does the recurrent state a cached step starts from (``clear(cache)``
    zeroes it after 15 tokens)."""
    with torch.no_grad():
        ref = hf(ids).logits
        assert (ours(ids) - ref).abs().max() <= TOL
        for t in parts:
            kept = t.clone()
            t.mul_(-2)
            assert (ours(ids) - ref).abs().max() > 1e-3
            t.copy_(kept)
        assert (ours(ids) - ref).abs().max() <= TOL
        cache = FullCache(ours.config, 2, 32)
        ours(ids[:, :15], cache=cache)
        clear(cache)
        assert (ours(ids[:, 15:], cache=cache)[:, 0] - ref[:, 15]).abs().max() > 1e-3


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("case", list(CASES))
def test_a_pass_gives_the_bits_of_one_token_steps(dtype, case):
    assert_pass_equals_steps(pair(case)[1], dtype)


def test_the_layer_stack_runs_the_attention_layers_between_the_convolutions(monkeypatch):
    """On the CPU the attention layers run in the native layer stack, each convolution layer as modules between its
    calls: the logits of a prefill and a pass are bitwise those of every layer as modules."""
    import triforce.models.llama as llama

    model = tiny(0, types=("conv", "full_attention", "full_attention", "conv", "full_attention"))
    ids = torch.randint(0, 64, (2, 24), generator=torch.Generator().manual_seed(9))
    out, calls, available = {}, [], None
    for native in ("1", "0"):
        monkeypatch.setenv("TRIFORCE_DECODER_LAYERS", native)
        monkeypatch.setattr(llama, "_STACK", None)
        available = llama._native_stack_available() if available is None else available
        cache = FullCache(model.config, 2, 32)
        with torch.no_grad():
            model.prefill(ids[:, :18], cache)
            real = llama._native_layers
            monkeypatch.setattr(llama, "_native_layers", lambda *a, **k: calls.append(native) or real(*a, **k))
            out[native] = model(ids[:, 18:], cache=cache)
            monkeypatch.setattr(llama, "_native_layers", real)
    assert torch.equal(out["1"], out["0"])
    if available:  # (the runs: [conv], [attention, attention], [conv], [attention])
        assert calls.count("1") == 4 and llama._stack_runs(model.model.layers, 0, 5) == [(0, 1), (1, 3), (3, 4),
                                                                                       (4, 5)]


def _steps(model, cache, ids, sizes):
    """Logits of ``ids`` run through ``cache`` in steps of ``sizes``, concatenated."""
    out, i = [], 0
    for n in sizes:
        out.append(model(ids[:, i:i + n], cache=cache))
        i += n
    return torch.cat(out, 1)


def assert_rollbacks_restore_the_state(model, length=30):
    """After a verify pass ``model``'s cache rolls back to any accepted length (and a tree commits a path): the next
    steps' logits are bitwise those of a cache that only ever saw the accepted tokens. -> (ids, those logits)."""
    ids = torch.randint(0, 64, (2, length), generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        ref = FullCache(model.config, 2, length + 36)
        want = _steps(model, ref, ids, [12] + [1] * (length - 12))
        for accepted in (0, 1, 3):
            cache = FullCache(model.config, 2, length + 36)
            model(ids[:, :12], cache=cache)
            model(torch.randint(0, 64, (2, 5)), cache=cache)  # (a rejected draft)
            cache.rollback(torch.full((2,), 12, dtype=torch.int32))
            got = _steps(model, cache, ids[:, 12:], [accepted + 1] + [1] * (7 - accepted))
            assert torch.equal(got, want[:, 12:20])
        # a tree: the accepted path (nodes 0, 2, 4 of a tree whose node 1 is a rival branch) then one more step
        cache = FullCache(model.config, 2, length + 36)
        model(ids[:, :12], cache=cache)
        toks = torch.stack([ids[:, 12], ids[:, 13] * 0 + 7, ids[:, 13], ids[:, 14] * 0 + 9, ids[:, 14]], 1)
        parents = torch.tensor([[-1, 0, 0, 1, 2]] * 2)
        tree = model(toks, cache=cache, tree_parents=parents)
        assert torch.equal(tree[:, [0, 2, 4]], want[:, 12:15])
        path = torch.tensor([[0, 2, 4]] * 2)
        cache.commit_path(torch.full((2,), 12, dtype=torch.int32), path, torch.full((2,), 2, dtype=torch.int32))
        assert torch.equal(_steps(model, cache, ids[:, 15:], [1, 2]), want[:, 15:18])
    return ids, want


def test_rollback_and_commit_path_restore_the_state():
    assert_rollbacks_restore_the_state(tiny(0))


def test_a_rollback_deeper_than_the_ring_raises(monkeypatch):
    """A rollback past what the rings hold raises (on the CPU) instead of reading overwritten inputs; one within them
    does not."""
    monkeypatch.setattr(cache_module, "CONV_HISTORY", 4)
    model = tiny(0)
    cache = FullCache(model.config, 1, 64)
    assert cache.conv_ring == 4 + 3
    ids = torch.randint(0, 64, (1, 30), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        model(ids, cache=cache)
        cache.rollback(torch.tensor([27], dtype=torch.int32))  # (needs positions 25, 26: held)
        with pytest.raises(ValueError, match="CONV_HISTORY"):
            cache.rollback(torch.tensor([20], dtype=torch.int32))
        assert int(cache.lengths[0]) == 27
        # a StreamingLLM cache filled from a full one holds only the last inputs: it cannot go back before them
        s = StreamingCache(model.config, 1, sink=1, window=8, max_step=4)
        s.fill_from(cache)
        with pytest.raises(ValueError, match="CONV_HISTORY"):
            s.rollback(torch.tensor([5], dtype=torch.int32))


def assert_draft_caches_exact(model):
    """On ``model`` (its recurrent layers only: nothing for a draft cache to drop), a StreamingLLM cache (prefilled, or
    filled from a full one; through evictions, a rollback and a large step) and a retrieval cache (through its own
    steps, a rollback and syncs) give the full cache's logits bitwise."""
    ids = torch.randint(0, 64, (2, 60), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        full = FullCache(model.config, 2, 96, chunk_size=4)
        want = _steps(model, full, ids, [20, 3, 1, 4, 1, 12, 1, 2])
        for fill in (False, True):
            s = StreamingCache(model.config, 2, sink=2, window=6, max_step=4)
            if fill:
                f = FullCache(model.config, 2, 96)
                model(ids[:, :20], cache=f)
                s.fill_from(f)
            else:
                assert torch.equal(model(ids[:, :20], cache=s), want[:, :20])
            got = _steps(model, s, ids[:, 20:], [3, 1, 4])
            s.rollback(s.lengths - 2)  # (the last two dropped, then taken again)
            got = torch.cat([got[:, :-2], _steps(model, s, ids[:, 26:], [2, 1, 12, 1, 2])], 1)
            assert torch.equal(got, want[:, 20:])
        full = FullCache(model.config, 2, 96, chunk_size=4)
        model(ids[:, :20], cache=full)
        r = RetrievalCache(model.config, full, budget=8, chunk_size=4, max_step=8)
        assert torch.equal(model(ids[:, 20:23], cache=r), want[:, 20:23])
        model(ids[:, 23:25], cache=r)
        r.rollback(r.lengths - 2)
        assert torch.equal(model(ids[:, 23:24], cache=r), want[:, 23:24])
        model(ids[:, 20:28], cache=full)
        r.sync()
        assert torch.equal(model(ids[:, 28:33], cache=r), want[:, 28:33])


def test_drafts_caches_convolve_exactly():
    assert_draft_caches_exact(tiny(3, types=("conv", "conv")))


def assert_rows_kept_apart(model):
    """A ragged step (padding after a row's real tokens) and dropping a row keep each row's recurrent state: the
    logits are those of the rows run alone."""
    ids = torch.randint(0, 64, (3, 20), generator=torch.Generator().manual_seed(8))
    with torch.no_grad():
        alone = []
        for b in range(3):
            c = FullCache(model.config, 1, 32)
            alone.append(_steps(model, c, ids[b:b + 1], [10, 2 + b, 1]))
        cache = FullCache(model.config, 3, 32)
        model(ids[:, :10], cache=cache)
        widths = torch.tensor([2, 3, 4])
        out = model(ids[:, 10:14], cache=cache, widths=widths)
        for b in range(3):
            assert torch.equal(out[b, :2 + b], alone[b][0, 10:12 + b])
        cache.select_rows([2, 0])
        nxt = model(torch.stack([ids[2, 14:15], ids[0, 12:13]]), cache=cache)
        assert torch.equal(nxt[0], alone[2][0, -1:]) and torch.equal(nxt[1], alone[0][0, -1:])


def test_ragged_rows_and_row_selection_keep_each_rows_history():
    assert_rows_kept_apart(tiny(0))


def test_config_keys_and_defaults():
    """Lfm2Config's defaults read (every layer attention without layer_types or full_attn_idxs); the MLP's width as
    Lfm2MLP computes it; its hub configs' older keys at their harmless values; refusals."""
    c, want = LlamaConfig.from_dict({"model_type": "lfm2"}), transformers.Lfm2Config()
    assert_common_defaults(c, want, rms_norm_eps="norm_eps")
    assert c.conv_layers == tuple(t == "conv" for t in want.layer_types) and c.conv_kernel == 0
    width = transformers.Lfm2ForCausalLM._from_config  # (the MLP's width: built on the meta device)
    with torch.device("meta"):
        hf = width(transformers.Lfm2Config(num_hidden_layers=2, layer_types=["conv", "full_attention"]))
    ours = LlamaConfig.from_dict(transformers.Lfm2Config(num_hidden_layers=2,
                                                         layer_types=["conv", "full_attention"]).to_dict())
    assert ours.dense_intermediate_size == hf.model.layers[0].feed_forward.w1.out_features
    assert ours.conv_kernel == 3 and ours.conv_layers == (True, False)
    for d in (ours.to_dict(), c.to_dict()):
        assert LlamaConfig.from_dict(d).to_dict() == d and d["norm_eps"] == 1e-5 and "rms_norm_eps" not in d
    assert d["architectures"] == ["Lfm2ForCausalLM"]
    hub = {"model_type": "lfm2", "num_hidden_layers": 3, "hidden_size": 64, "num_attention_heads": 4,
           "num_key_value_heads": 2,
           "full_attn_idxs": [1], "block_ff_dim": 96, "tie_embedding": True, "block_dim": 64, "conv_dim": 64,
           "conv_dim_out": 64, "num_heads": 4, "theta": 1000000.0, "block_use_swiglu": True, "use_pos_enc": True,
           "block_norm_eps": 1e-5, "block_mlp_init_scale": 1.0, "conv_use_xavier_init": True}
    read = LlamaConfig.from_dict(hub)
    assert read.conv_layers == (True, False, True) and read.intermediate_size == 96 and read.tie_word_embeddings
    for extra, match in (({"layer_types": ["conv", "mamba", "conv"], "full_attn_idxs": None}, "layer_types"),
                         ({"layer_types": ["conv"] * 3, "full_attn_idxs": [1]}, "full_attn_idxs"),
                         ({"full_attn_idxs": [5]}, "full_attn_idxs"), ({"conv_dim": 32}, "conv_dim"),
                         ({"conv_L_cache": 0}, "conv_L_cache"), ({"block_use_swiglu": False}, "block_use_swiglu"),
                         ({"block_ff_dim": 80, "intermediate_size": 96}, "block_ff_dim"),
                         ({"sliding_window": 16}, "sliding_window")):
        with pytest.raises(ValueError, match=match):
            LlamaConfig.from_dict({**hub, **extra})


@pytest.mark.parametrize("method,opts", [TINY_CASES[i] for i in (0, 2, 3, 4, 6)],
                         ids=[f"{TINY_CASES[i][0]}-{i}" for i in (0, 2, 3, 4, 6)])
def test_greedy_equals_autoregressive(method, opts):
    target, draft = tiny(0), tiny(1)
    assert_greedy_equals_autoregressive(target, draft, method, opts)



def _squeeze_conv(name, t):
    """A tensor as llama.cpp's LFM2 converter writes it: the convolution's weight squeezed to [hidden, taps]."""
    return t.squeeze(1) if name.endswith(".conv.conv.weight") else t


def gguf_kv(c) -> dict:
    """The lfm2.* metadata llama.cpp's converter (LFM2Model) writes for transformers config ``c``: the KV heads per
    layer, 0 on the convolution layers; the MLP's adjusted width; shortconv.l_cache."""
    head_dim = c.hidden_size // c.num_attention_heads
    width = LlamaConfig.from_dict(c.to_dict()).dense_intermediate_size
    return {"context_length": c.max_position_embeddings, "embedding_length": c.hidden_size,
            "feed_forward_length": width, "block_count": c.num_hidden_layers,
            "attention.head_count": c.num_attention_heads,
            "attention.head_count_kv": [0 if t == "conv" else c.num_key_value_heads for t in c.layer_types],
            "attention.key_length": head_dim, "attention.value_length": head_dim,
            "attention.layer_norm_rms_epsilon": float(c.norm_eps),
            "rope.freq_base": float(c.rope_parameters["rope_theta"]), "vocab_size": c.vocab_size,
            "shortconv.l_cache": c.conv_L_cache}


def gguf_pair(**case):
    """transformers' Lfm2ForCausalLM of the hybrid case with ``case`` (unbiased: llama.cpp reads no bias; the
    convolution layers drawn larger)."""
    torch.manual_seed(0)
    hf = randomize_(transformers.Lfm2ForCausalLM(transformers.Lfm2Config(**BASE, **CASES["hybrid"], **case)).eval())
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if ".conv." in name:
                p.normal_(0, 0.3)
    return hf


@pytest.mark.parametrize("untied", [False, True])
def test_gguf_lfm2_as_llama_cpp_writes_it(tmp_path, untied):
    """An lfm2 GGUF, as llama.cpp's converter writes the checkpoint (its per-layer KV heads saying which layers
    convolve, the final norm as token_embd_norm), loads with transformers' logits; in Q8_0 / Q5_0 blocks its blocks
    compute the loaded model bitwise (gguf_copy, and the int8 path)."""
    from .test_families import assert_converted_gguf_is_the_checkpoint

    hf = gguf_pair(tie_word_embeddings=not untied, conv_L_cache=4 if untied else 3)
    c = hf.config
    ours = assert_converted_gguf_is_the_checkpoint(tmp_path, hf, "lfm2", gguf_kv(c), convert=_squeeze_conv)
    assert ours.config.conv_layers == tuple(t == "conv" for t in c.layer_types)
    assert ours.config.conv_kernel == c.conv_L_cache and ours.config.tie_word_embeddings == (not untied)


def test_gguf_lfm2_refusals(tmp_path):
    """Two attention KV counts, no shortconv.l_cache, a key llama.cpp's lfm2 graph would read otherwise (a sliding
    window) and a convolution bias (which llama.cpp never reads) raise."""
    from triforce.models.loading import read_gguf

    from .test_families import write_converted_gguf

    hf = gguf_pair()
    kv = gguf_kv(hf.config)
    read_gguf(write_converted_gguf(tmp_path / "ok.gguf", hf, "lfm2", kv, convert=_squeeze_conv))
    for i, (meta, match) in enumerate(((
            {"attention.head_count_kv": [0, 2, 0, 1]}, "head_count_kv"), ({"shortconv.l_cache": None}, "l_cache"),
            ({"attention.sliding_window": 16}, "sliding_window"))):
        bad = {k: v for k, v in {**kv, **meta}.items() if v is not None}
        with pytest.raises(ValueError, match=match):
            read_gguf(write_converted_gguf(tmp_path / f"{i}.gguf", hf, "lfm2", bad, convert=_squeeze_conv))
    biased = gguf_pair(conv_bias=True)
    with pytest.raises(ValueError, match="shortconv"):
        read_gguf(write_converted_gguf(tmp_path / "b.gguf", biased, "lfm2", kv, convert=_squeeze_conv))


MOE = dict(vocab_size=101, hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=4,
           num_attention_heads=4, num_key_value_heads=2, layer_types=["conv", "full_attention", "conv", "conv"],
           num_dense_layers=1, num_experts=6, num_experts_per_tok=2, max_position_embeddings=256)
MOE_CASES = {"default": {}, "unbiased-scaled-unnormalised": dict(use_expert_bias=False, routed_scaling_factor=2.5,
                                                                  norm_topk_prob=False, num_experts_per_tok=3)}


def moe_pair(case="default"):
    """transformers' Lfm2MoeForCausalLM of ``case`` (the experts, the router, its expert bias and the convolutions
    drawn; biases and norms randomised) and ours."""
    from triforce.models.loading import _build

    torch.manual_seed(0)
    config = transformers.Lfm2MoeConfig(**{**MOE, **MOE_CASES[case]}, attn_implementation="eager")
    hf = randomize_(transformers.Lfm2MoeForCausalLM(config).eval())
    with torch.no_grad():
        for name, t in [*hf.named_parameters(), *hf.named_buffers()]:
            if any(part in name for part in ("experts", "expert_bias", ".conv.", ".gate.")):
                t.normal_(0, 0.3)
    return hf, _build(LlamaConfig.from_dict(hf.config.to_dict()), hf.state_dict(), None, None)


@pytest.mark.parametrize("case", list(MOE_CASES))
def test_moe_every_path_matches_transformers(tmp_path, case):
    """LFM2-MoE: every path gives transformers' logits; our save reads back in transformers; its hub checkpoints'
    experts one by one (w1 / w3 / w2) read as its stacked ones."""
    hf, ours = moe_pair(case)
    c = hf.config
    assert [type(layer.mlp).__name__ for layer in ours.model.layers] == ["MLP"] + ["SparseMoE"] * 3
    assert_every_path_matches(hf, ours)
    assert_saved_reads_back(tmp_path, hf, ours)
    hub = {}
    for name, t in hf.state_dict().items():
        if name.endswith("experts.gate_up_proj"):
            for e, w in enumerate(t):
                gate, up = w.chunk(2)
                hub[name.replace("gate_up_proj", f"{e}.w1.weight")] = gate
                hub[name.replace("gate_up_proj", f"{e}.w3.weight")] = up
        elif name.endswith("experts.down_proj"):
            hub.update({name.replace("down_proj", f"{e}.w2.weight"): w for e, w in enumerate(t)})
        else:
            hub[name] = t
    from triforce.models.loading import _build

    again = _build(LlamaConfig.from_dict(c.to_dict()), hub, None, None)
    ids = torch.randint(0, 101, (2, 12), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        assert torch.equal(again(ids), ours(ids))


def test_moe_router_is_transformers_bitwise_in_bfloat16():
    """The router's weights and choices are transformers' bit for bit in bfloat16 (the sigmoid, the renormalisation
    and the scale in the dtype, the expert bias in float32); the MLP's output within bfloat16's roundings."""
    for case in MOE_CASES:
        hf, ours = moe_pair(case)
        hf, ours = hf.to(torch.bfloat16), ours.to(torch.bfloat16)
        x = torch.randn(7, 64, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
        block, mine = hf.model.layers[2].feed_forward, ours.model.layers[2].mlp
        with torch.no_grad():
            _, w, index = block.gate(x, block.expert_bias if block.use_expert_bias else None)
            got_w, got_index = mine.route(x)
            assert torch.equal(got_index, index) and torch.equal(got_w, w) and got_w.dtype == torch.bfloat16
            theirs = block(x[None])
            assert (mine(x[None]) - theirs).abs().max() <= 2 ** -6 * theirs.abs().max()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_moe_a_pass_gives_the_bits_of_one_token_steps(dtype):
    assert_pass_equals_steps(moe_pair()[1], dtype)


def test_moe_config_keys_and_defaults():
    """Lfm2MoeConfig's defaults (layer_types required: its model indexes them); its keys checked."""
    types = ["conv", "full_attention"] * 16
    c, want = LlamaConfig.from_dict({"model_type": "lfm2_moe", "layer_types": types}), transformers.Lfm2MoeConfig()
    assert_common_defaults(c, want, rms_norm_eps="norm_eps")
    e = c.experts
    assert (e.count, e.top_k, e.intermediate_size, e.renormalize, e.scale, e.correction_bias) == (
        want.num_experts, want.num_experts_per_tok, want.moe_intermediate_size, want.norm_topk_prob,
        want.routed_scaling_factor, want.use_expert_bias)
    assert e.layers == tuple(i >= want.num_dense_layers for i in range(32)) and c.dense_intermediate_size == 7168
    d = c.to_dict()
    assert LlamaConfig.from_dict(d).to_dict() == d and d["architectures"] == ["Lfm2MoeForCausalLM"]
    for extra, match in (({"layer_types": None}, "layer_types"), ({"num_dense_layers": 40}, "num_dense_layers"),
                         ({"use_expert_bias": 1}, "use_expert_bias"), ({"full_attn_idxs": [1]}, "full_attn_idxs"),
                         ({"block_multiple_of": 256}, "block_multiple_of")):
        with pytest.raises(ValueError, match=match):
            LlamaConfig.from_dict({"model_type": "lfm2_moe", "layer_types": types, **extra})


@pytest.mark.parametrize("method,opts", [TINY_CASES[i] for i in (2, 6)],
                         ids=[f"{TINY_CASES[i][0]}-{i}" for i in (2, 6)])
def test_moe_greedy_equals_autoregressive(method, opts):
    extra = {"layer_types": ["conv", "full_attention", "conv"], "num_dense_layers": 1, "num_experts": 4,
             "num_experts_per_tok": 2, "moe_intermediate_size": 16}
    target, draft = (tiny_family("lfm2_moe", seed, extra=extra) for seed in (0, 1))
    assert_greedy_equals_autoregressive(target, draft, method, opts)


def write_lfm2moe_gguf(path, hf, quant=None, omit=()):
    """A GGUF of transformers' Lfm2MoeForCausalLM ``hf`` as llama.cpp's converter writes the checkpoint (LFM2MoeModel:
    lfm2's keys with the dense MLPs' width as feed_forward_length, the experts' count, use and width, the dense layers'
    count, the sigmoid gating; each layer's experts merged into ffn_{gate,up,down}_exps [E, out, in], the expert bias
    as exp_probs_b)."""
    from .test_families import stacked_expert_tensors, write_stacked_experts_gguf

    c = hf.config

    def special(name, t, i):
        if name.endswith("feed_forward.experts.gate_up_proj"):
            gate, up = t.chunk(2, dim=1)
            return {f"blk.{i}.ffn_gate_exps.weight": gate, f"blk.{i}.ffn_up_exps.weight": up}
        if name.endswith("feed_forward.experts.down_proj"):
            return {f"blk.{i}.ffn_down_exps.weight": t}
        if name.endswith("feed_forward.expert_bias"):
            return {f"blk.{i}.exp_probs_b.bias": t}
        if name.endswith(".conv.conv.weight"):
            return {f"blk.{i}.shortconv.conv.weight": t.squeeze(1)}
        return None

    kv = {**gguf_kv(c), "expert_count": c.num_experts, "expert_used_count": c.num_experts_per_tok,
          "expert_feed_forward_length": c.moe_intermediate_size, "leading_dense_block_count": c.num_dense_layers,
          "expert_gating_func": 2}
    return write_stacked_experts_gguf(path, hf, "lfm2moe", kv, quant, omit=omit,
                                      tensors=stacked_expert_tensors(hf, "lfm2moe", special))


def test_gguf_lfm2moe_as_llama_cpp_writes_it(tmp_path):
    """An lfm2moe GGUF loads as its checkpoint (transformers' logits, the conversion cache read back by transformers);
    in Q8_0 / Q5_0 blocks gguf_copy computes the loaded model bitwise; a file without exp_probs_b routes by the
    sigmoid alone."""
    from .test_families import assert_missing_router_biases_are_zeros, assert_mixture_gguf_loads

    hf, ours = moe_pair()
    loaded = assert_mixture_gguf_loads(tmp_path, hf, ours, write_lfm2moe_gguf)
    assert loaded.config.conv_layers == ours.config.conv_layers
    for layer in hf.model.layers[1:]:  # (the helper zeroes DeepSeek's name of it)
        layer.feed_forward.expert_bias.zero_()
    (tmp_path / "nobias").mkdir()
    assert_missing_router_biases_are_zeros(tmp_path / "nobias", hf, write_lfm2moe_gguf)


@pytest.mark.parametrize("tied", [True, False])
def test_lfm2_vl_reads_its_language_model(tmp_path, tied):
    """LFM2-VL's image + text checkpoints (Lfm2VlForConditionalGeneration) read text-only: its LFM2 language model
    (model.language_model.*) gives the wrapper's logits on text, tied by the wrapper's key; its SigLIP2 tower and
    projector not read."""
    from triforce.models import Llama

    torch.manual_seed(0)
    text = dict(BASE, **CASES["hybrid"])
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, patch_size=16,
                  num_patches=16)
    config = transformers.Lfm2VlConfig(text_config=text, vision_config=vision, projector_hidden_size=32,
                                       image_token_id=5, tie_word_embeddings=tied)
    hf = transformers.Lfm2VlForConditionalGeneration(config).eval()
    hf.save_pretrained(tmp_path)
    ours = Llama.from_pretrained(tmp_path)
    assert ours.config.model_type == "lfm2" and ours.config.tie_word_embeddings == tied
    assert ours.config.conv_layers == (True, False, True, True)
    ids = torch.randint(6, 101, (2, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert (ours(ids) - hf(input_ids=ids).logits).abs().max().item() <= TOL
