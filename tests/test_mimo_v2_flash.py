"""MiMo-V2-Flash (``model_type="mimo_v2_flash"``: MiMoV2FlashForCausalLM): sliding layers of twice the KV heads with
attention sinks beside full layers, keys of head_dim and narrower values (v_head_dim) scaled by attention_value_scale,
a RoPE per layer type on a share of each head, and DeepSeek-V3's mixture without shared experts; against
transformers."""
import pytest
import torch

from triforce.models import FullCache, Llama, LlamaConfig, StreamingCache
from triforce.models.llama import SparseMoE

from .test_engines import TINY_CASES, assert_greedy_equals_autoregressive
from .test_families import TOL, assert_common_defaults, assert_saved_reads_back, randomize_, tiny_family
from .test_sliding_window import assert_every_path_matches, assert_pass_equals_steps

transformers = pytest.importorskip("transformers")

BASE = dict(vocab_size=101, hidden_size=64, intermediate_size=48, num_hidden_layers=3, num_attention_heads=4,
            num_key_value_heads=1, head_dim=24, v_head_dim=16, max_position_embeddings=128, sliding_window=8,
            moe_intermediate_size=16, n_routed_experts=8, num_experts_per_tok=2, n_group=2, topk_group=1)
CASES = {"default": dict(layer_types=["full_attention", "sliding_attention", "sliding_attention"]),
         # (every layer sparse, scaled and not renormalised routing, biased q / k / v, equal value and key widths, the
         # checkpoints' window key, its RoPE bases of its own)
         "sparse-scaled-biased": dict(
             layer_types=["sliding_attention", "full_attention", "sliding_attention"],
             mlp_layer_types=["sparse"] * 3, routed_scaling_factor=2.5, norm_topk_prob=False, attention_bias=True,
             v_head_dim=24, attention_value_scale=1.5, num_key_value_heads=2, sliding_window_size=5,
             rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1e5,
                                                 "partial_rotary_factor": 0.5},
                              "sliding_attention": {"rope_type": "default", "rope_theta": 500.0,
                                                    "partial_rotary_factor": 0.5}})}


def pair(case="default"):
    """transformers' MiMoV2FlashForCausalLM of ``case`` (random weights: the stacked experts, the sinks and the
    correction biases drawn, which transformers leaves at zero; biases and norms randomised) and ours."""
    from triforce.models.loading import _build

    torch.manual_seed(0)
    config = transformers.MiMoV2FlashConfig(**{**BASE, **CASES[case]}, attn_implementation="eager")
    hf = randomize_(transformers.MiMoV2FlashForCausalLM(config).eval())
    with torch.no_grad():
        for name, t in [*hf.named_parameters(), *hf.named_buffers()]:
            if ".experts." in name and t.dim() == 3:
                t.normal_(0, 0.2)
            elif name.endswith(("sinks", "e_score_correction_bias")):
                t.normal_(0, 1)
    return hf, _build(LlamaConfig.from_dict(hf.config.to_dict()), hf.state_dict(), None, None)


@pytest.mark.parametrize("case", list(CASES))
def test_logits_and_every_path_match_transformers(tmp_path, case):
    """Every path (the plain forward, a chunked prefill, a verify pass, one-token steps, a tree) gives transformers'
    logits; the checkpoint we save reads back in transformers as the same model."""
    hf, ours = pair(case)
    c = hf.config
    for i, (kind, layer) in enumerate(zip(c.layer_types, ours.model.layers)):
        att = layer.self_attn
        sliding = kind == "sliding_attention"
        assert att.n_kv == c.num_key_value_heads * (2 if sliding else 1) and (att.sinks is not None) == sliding
        assert att.v_proj.out_features == att.n_kv * c.v_head_dim and att.o_proj.in_features == 4 * c.v_head_dim
        assert ours.config.layer_windows[i] == (c.sliding_window if sliding else 0)
        assert (type(layer.mlp) is SparseMoE) == (c.mlp_layer_types[i] == "sparse")
    assert_every_path_matches(hf, ours)
    assert_saved_reads_back(tmp_path, hf, ours)


def test_each_part_moves_the_logits():
    """The sinks, the value scale, the sliding layers' second half of KV heads, the sliding layers' RoPE base and
    the correction bias each count."""
    hf, ours = pair()
    ids = torch.randint(0, 101, (2, 20), generator=torch.Generator().manual_seed(4))
    layer = ours.model.layers[1]
    with torch.no_grad():
        ref = hf(ids).logits
        assert (ours(ids) - ref).abs().max() <= TOL

        def moved(change, undo):
            change()
            out = ours(ids)
            undo()
            assert (out - ref).abs().max() > 1e-3
            assert (ours(ids) - ref).abs().max() <= TOL

        moved(lambda: layer.self_attn.sinks.add_(3), lambda: layer.self_attn.sinks.sub_(3))
        scale = layer.self_attn.v_scale
        moved(lambda: setattr(layer.self_attn, "v_scale", 1.0), lambda: setattr(layer.self_attn, "v_scale", scale))
        k = layer.self_attn.k_proj.weight
        half = k[k.shape[0] // 2:].clone()
        moved(lambda: k[k.shape[0] // 2:].mul_(-1), lambda: k[k.shape[0] // 2:].copy_(half))
        bias = layer.mlp.gate.e_score_correction_bias
        kept = bias.clone()
        moved(lambda: bias.copy_(torch.linspace(-5, 5, bias.numel())), lambda: bias.copy_(kept))
    with torch.no_grad():  # (the sliding layers' own base: with the full layers' their logits move)
        c = LlamaConfig.from_dict({**hf.config.to_dict(), "rope_parameters": {
            kind: {"rope_type": "default", "rope_theta": 5e6, "partial_rotary_factor": 0.334}
            for kind in ("full_attention", "sliding_attention")}})
        assert c.local_rope_theta == 5e6 and ours.config.local_rope_theta == 1e4
        long = torch.randint(0, 101, (1, 60), generator=torch.Generator().manual_seed(2))
        same = Llama(c)
        same.load_state_dict(ours.state_dict())
        assert (same(long) - ours(long)).abs().max() > 1e-3


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("case", list(CASES))
def test_a_pass_gives_the_bits_of_one_token_steps(dtype, case):
    assert_pass_equals_steps(pair(case)[1], dtype)


def test_caches_hold_each_layers_heads():
    """A full cache holds each layer's own KV heads; a StreamingLLM cache's joint buffer the most, the full layers
    viewing their first heads of it (and counting it whole in its memory)."""
    ours = pair()[1]
    full = FullCache(ours.config, 2, 32, chunk_size=4)
    assert [t.shape[2] for t in full.k] == [1, 2, 2] == [t.shape[2] for t in full.chunk_keys]
    stream = StreamingCache(ours.config, 2, sink=1, window=8, max_step=4)
    assert [t.shape[2] for t in stream.k] == [1, 2, 2] == [t.shape[2] for t in stream.k_raw]
    assert stream.memory_bytes() >= stream._kvr.numel() * stream._kvr.element_size()


def test_config_keys_and_defaults():
    """MiMoV2FlashConfig's defaults read (its layer pattern, RoPE per layer type, windows, values, router); its keys
    checked."""
    c, want = LlamaConfig.from_dict({"model_type": "mimo_v2_flash"}), transformers.MiMoV2FlashConfig()
    assert_common_defaults(c, want)
    sliding = [t == "sliding_attention" for t in want.layer_types]
    assert c.layer_windows == tuple(want.sliding_window if s else 0 for s in sliding)
    assert c.kv_heads_per_layer == tuple(want.num_key_value_heads * (2 if s else 1) for s in sliding)
    assert c.rope_layers == tuple(not s for s in sliding) and c.rotary_dim == c.local_rotary_dim == 64
    assert (c.rope_theta, c.local_rope_theta) == tuple(want.rope_parameters[k]["rope_theta"]
                                                       for k in ("full_attention", "sliding_attention"))
    assert (c.value_head_dim, c.value_scale) == (want.v_head_dim, want.attention_value_scale)
    e = c.experts
    assert (e.count, e.top_k, e.intermediate_size, e.shared_intermediate_size, e.groups, e.scale, e.renormalize) == (
        want.n_routed_experts, want.num_experts_per_tok, want.moe_intermediate_size, 0, (1, 1), 1.0, True)
    assert e.layers == tuple(t == "sparse" for t in want.mlp_layer_types)
    assert LlamaConfig.from_dict(c.to_dict()).to_dict() == c.to_dict()
    assert c.to_dict()["rope_parameters"] == want.rope_parameters
    assert c.to_dict()["architectures"] == ["MiMoV2FlashForCausalLM"]
    assert LlamaConfig.from_dict({"model_type": "mimo_v2_flash", "sliding_window_size": 127}).layer_windows[1] == 128
    assert LlamaConfig.from_dict({"model_type": "mimo_v2_flash", "routed_scaling_factor": None}).experts.scale == 1.0
    rope = {"full_attention": {"rope_type": "default", "rope_theta": 1e6, "partial_rotary_factor": 0.5},
            "sliding_attention": {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.25}}
    yarn = {kind: {"rope_type": "yarn", "rope_theta": 1e6, "factor": 2.0, "original_max_position_embeddings": 4096}
            for kind in ("full_attention", "sliding_attention")}
    for extra, match in (({"v_head_dim": 256}, "v_head_dim"), ({"rope_parameters": rope}, "partial_rotary_factor"),
                         ({"rope_parameters": yarn}, "rope"), ({"sliding_window_size": -1}, "sliding_window_size"),
                         ({"sliding_window": None}, "sliding_window"), ({"attention_value_scale": 0}, "value_scale"),
                         ({"n_shared_experts": 1}, "n_shared_experts"), ({"num_experts_per_tok": 9}, "9"),
                         ({"mlp_layer_types": ["dense"]}, "mlp_layer_types")):
        with pytest.raises(ValueError, match=match):
            LlamaConfig.from_dict({"model_type": "mimo_v2_flash", "num_hidden_layers": 6, "n_routed_experts": 8,
                                   **extra})


def test_hub_checkpoint_names_load(tmp_path):
    """The hub's checkpoints' names (each expert's projections apart, the sinks as attention_sink_bias) and its
    multi-token prediction weights (model.mtp.*, skipped as transformers skips them) read to transformers' logits."""
    import safetensors.torch

    hf, ours = pair()
    hf.save_pretrained(tmp_path)
    sd = {}
    for name, t in safetensors.torch.load_file(tmp_path / "model.safetensors").items():
        stem = name.rsplit(".", 1)[0]
        if name.endswith("experts.gate_up_proj"):
            for e, w in enumerate(t):
                gate, up = w.chunk(2)
                sd[f"{stem}.{e}.gate_proj.weight"], sd[f"{stem}.{e}.up_proj.weight"] = gate, up
        elif name.endswith("experts.down_proj"):
            sd.update({f"{stem}.{e}.down_proj.weight": w for e, w in enumerate(t)})
        else:
            sd[name.replace(".self_attn.sinks", ".self_attn.attention_sink_bias")] = t
    assert any(k.endswith("attention_sink_bias") for k in sd)
    sd["model.mtp.layers.0.input_layernorm.weight"] = torch.ones(64)
    safetensors.torch.save_file({k: v.contiguous() for k, v in sd.items()}, tmp_path / "model.safetensors")
    ids = torch.randint(0, 101, (2, 24), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        assert torch.equal(Llama.from_pretrained(tmp_path)(ids), ours(ids))


@pytest.mark.parametrize("method,opts", [TINY_CASES[i] for i in (0, 2, 3, 4, 6)],
                         ids=[f"{TINY_CASES[i][0]}-{i}" for i in (0, 2, 3, 4, 6)])
def test_greedy_equals_autoregressive(method, opts):
    extra = {"v_head_dim": 4, "sliding_window": 6, "n_routed_experts": 8, "num_experts_per_tok": 2,
             "moe_intermediate_size": 16, "n_group": 2, "topk_group": 1}
    target, draft = (tiny_family("mimo_v2_flash", seed, extra=extra) for seed in (0, 1))
    assert [t.self_attn.n_kv for t in target.model.layers] == [2, 4, 4]
    assert_greedy_equals_autoregressive(target, draft, method, opts)


def test_a_streaming_caches_unviewed_heads_are_never_read():
    """The full layers' heads of a StreamingLLM cache's joint buffer past their own (the sliding layers' width) hold
    NaN through a prefill, steps past the window (evictions, the sinks re-rotated) and a rollback: every
    logit is bitwise that of the same cache without them, and the NaNs stay where they were."""
    model = pair()[1]
    ids = torch.randint(0, 101, (2, 40), generator=torch.Generator().manual_seed(8))
    outs = []
    for poison in (False, True):
        cache = StreamingCache(model.config, 2, sink=2, window=10, max_step=6)
        if poison:
            cache._kvr[:, 0, :, :, 1:] = float("nan")  # (layer 0: one KV head of the buffer's two)
        got = []
        with torch.no_grad():
            got.append(model.prefill(ids[:, :12], cache))
            for i in range(12, 30, 3):
                got.append(model(ids[:, i:i + 3], cache=cache))
            cache.rollback(cache.lengths - 2)
            got.append(model(ids[:, 28:34], cache=cache))
        if poison:
            assert torch.isnan(cache._kvr[:, 0, :, :, 1:]).all() and not torch.isnan(cache._kvr[:, 1:]).any()
        outs.append(torch.cat([g.reshape(-1) for g in got]))
    assert torch.isfinite(outs[0]).all() and torch.equal(outs[0], outs[1])
