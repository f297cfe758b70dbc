"""Mixtures of experts (``model_type="mixtral"``: Mixtral 8x7B / 8x22B; ``"qwen3_moe"``: Qwen3-30B-A3B,
Qwen3-235B-A22B; ``"granitemoe"``: granite-3.0-1b-a400m and its kin): each sparse layer's MLP is a router and gated
experts (triforce.models.llama.SparseMoE), against transformers' MixtralForCausalLM, Qwen3MoeForCausalLM and
GraniteMoeForCausalLM on the same weights."""
import pytest
import torch
from hypothesis import example, given
from hypothesis import strategies as st

import triforce
from triforce.models import FullCache, Llama, LlamaConfig, graphs
from triforce.models.llama import MLP, SparseMoE, _bulk_linears, _row_sigmoid, _rowwise_available
from triforce.models.quant import Q8Linear, int8_copy

from .test_engines import TINY_CASES, assert_greedy_equals_autoregressive, ragged_prompts
from .test_config import write_gguf
from .test_families import TINY, randomize_, transformers_and_ours
from .test_model import TOL
from .test_sliding_window import assert_every_path_matches, assert_pass_equals_steps

transformers = pytest.importorskip("transformers")

MIXTRAL = dict(TINY, num_local_experts=4, num_experts_per_tok=2)
# a dense layer (mlp_only_layers) between sparse ones, 3 of 6 experts, renormalised, head_dim not hidden / heads
QWEN3_MOE = dict(TINY, num_hidden_layers=3, num_experts=6, num_experts_per_tok=3, moe_intermediate_size=40,
                 norm_topk_prob=True, mlp_only_layers=[1], head_dim=32)
CASES = {
    "mixtral": ("Mixtral", MIXTRAL),
    "mixtral-window": ("Mixtral", dict(MIXTRAL, sliding_window=7)),
    "qwen3_moe": ("Qwen3Moe", QWEN3_MOE),
    # every 2nd layer sparse, weights not renormalised, biases, a window on every layer, tied
    # Granite's multipliers, the softmax of the top k logits, stacked experts in its checkpoints
    # (multipliers a float32 holds exactly: a GGUF stores them so)
    "granitemoe": ("GraniteMoe", dict(MIXTRAL, num_hidden_layers=3, embedding_multiplier=12.0,
                                      attention_multiplier=0.03125, residual_multiplier=0.375, logits_scaling=8.0,
                                      attention_bias=True)),
    # a shared expert (sigmoid-gated) beside 3 of 6 experts, q/k/v biases, a dense layer; without the biases
    "qwen2_moe": ("Qwen2Moe", dict(QWEN3_MOE, shared_expert_intermediate_size=56, tie_word_embeddings=True)),
    "qwen2_moe-no-bias": ("Qwen2Moe", dict(QWEN3_MOE, shared_expert_intermediate_size=56, qkv_bias=False,
                                           norm_topk_prob=False, mlp_only_layers=[])),
    "qwen3_moe-step-window": ("Qwen3Moe", dict(QWEN3_MOE, num_hidden_layers=4, mlp_only_layers=[],
                                               decoder_sparse_step=2, norm_topk_prob=False, attention_bias=True,
                                               use_sliding_window=True, sliding_window=6, tie_word_embeddings=True)),
    # GraniteMoeShared: GraniteMoE's with a shared expert (no gate) beside 2 of 4 experts
    "granitemoeshared": ("GraniteMoeShared", dict(MIXTRAL, num_hidden_layers=3, embedding_multiplier=12.0,
                                                  attention_multiplier=0.03125, residual_multiplier=0.375,
                                                  logits_scaling=8.0, shared_intermediate_size=24)),
    # OLMoE: q/k norms over the whole projections, 3 of 6 experts, not renormalised; renormalised, biases, every
    # q, k and v clamped (clip_qkv small enough to clamp many of them)
    "olmoe": ("Olmoe", dict(TINY, num_experts=6, num_experts_per_tok=3, intermediate_size=40)),
    "olmoe-clip": ("Olmoe", dict(TINY, num_experts=4, num_experts_per_tok=2, norm_topk_prob=True, attention_bias=True,
                                 clip_qkv=0.4, num_key_value_heads=4)),
    # FlexOlmo: OLMo 2's layer (norms after the blocks, in float32) with OLMoE's mixture; renormalised, tied, GQA
    "flex_olmo": ("FlexOlmo", dict(TINY, num_experts=6, num_experts_per_tok=3, intermediate_size=40, pad_token_id=0,
                                   eos_token_id=1)),
    "flex_olmo-renorm": ("FlexOlmo", dict(TINY, num_experts=4, num_experts_per_tok=2, norm_topk_prob=True,
                                          tie_word_embeddings=True, pad_token_id=0, eos_token_id=1)),
}


def pair(case, **kw):
    """transformers' model of ``case`` with decisive routers (std 0.5: each token's top experts stand apart, so
    a rounding difference cannot swap them) and ours on its weights."""
    name, config = CASES[case]
    hf, _ = transformers_and_ours(name, **{**config, **kw})
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for n, p in hf.named_parameters():
            if n.endswith(("mlp.gate.weight", "block_sparse_moe.router.weight")):
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)
    from triforce.models.loading import _build
    return hf, _build(LlamaConfig.from_dict(hf.config.to_dict()), hf.state_dict(), None, None)


@pytest.mark.parametrize("case", list(CASES))
def test_logits_and_every_path_match_transformers(case):
    """The plain forward, a chunked prefill, a verify pass, steps and a tree over the cache give transformers'
    logits; the layers are sparse where transformers' are; our config reads back in transformers as the same
    mixture."""
    hf, ours = pair(case)
    sparse = [type(layer.mlp) is SparseMoE for layer in ours.model.layers]
    assert sparse == [any(".experts" in n for n, _ in layer.named_modules()) for layer in hf.model.layers]
    assert any(sparse) and list(ours.config.experts.layers) == sparse
    window = CASES[case][1].get("sliding_window", 0) if "window" in case else 0
    assert ours.config.layer_windows == (window,) * len(sparse)
    assert_every_path_matches(hf, ours)
    back = type(hf.config).from_dict(ours.config.to_dict())
    for key in ("num_local_experts", "num_experts_per_tok", "norm_topk_prob", "moe_intermediate_size",
                "decoder_sparse_step", "mlp_only_layers", "sliding_window"):
        assert getattr(back, key, None) == getattr(hf.config, key, None), key


@pytest.mark.parametrize("types", [None, ["full_attention", "sliding_attention", "sliding_attention", "full_attention"]])
def test_qwen2_moe_sliding_windows_match_transformers(types):
    """Qwen2-MoE with use_sliding_window: its window on every other layer from the first below max_window_layers
    (Qwen2MoeConfig's default, here layers 0 and 2 of 4), or where layer_types say; every path gives transformers'
    logits (windows of 6 over 40 tokens), and the config reads back in transformers with the same layers."""
    kw = dict(num_hidden_layers=4, use_sliding_window=True, sliding_window=6, max_window_layers=3)
    hf, ours = pair("qwen2_moe", **kw, **({} if types is None else {"layer_types": types}))
    want = (6, 0, 6, 0) if types is None else (0, 6, 6, 0)
    assert ours.config.layer_windows == want
    assert [t == "sliding_attention" for t in hf.config.layer_types] == [w > 0 for w in want]
    assert_every_path_matches(hf, ours)
    back = transformers.Qwen2MoeConfig.from_dict(ours.config.to_dict())
    assert (back.layer_types, back.sliding_window) == (hf.config.layer_types, hf.config.sliding_window)
    # without use_sliding_window the keys mean nothing, as in transformers
    plain = LlamaConfig.from_dict({**ours.config.to_dict(), "use_sliding_window": False, "layer_types": None})
    assert plain.layer_windows == (0,) * 4


@pytest.mark.parametrize("case", ["mixtral", "qwen3_moe", "granitemoe", "qwen2_moe", "olmoe", "granitemoeshared",
                                  "flex_olmo"])
def test_checkpoint_directories_both_ways(tmp_path, case):
    """A checkpoint transformers saved (Mixtral's block_sparse_moe / w1 w2 w3 names, Qwen3-MoE's per-expert
    projections, GraniteMoE's stacked experts) loads with transformers' logits; ours saves the same names, which
    transformers reads back as the same model."""
    assert_checkpoint_directories_both_ways(tmp_path, pair(case)[0])


def assert_checkpoint_directories_both_ways(tmp_path, hf):
    """``hf`` saved by transformers loads with its logits; ours saves the same names and tensors, which transformers
    reads back bitwise as the same model."""
    hf.save_pretrained(tmp_path / "hf")
    ours = Llama.from_pretrained(tmp_path / "hf")
    ids = torch.randint(0, 101, (2, 30), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = hf(ids).logits
        assert (ours(ids) - ref).abs().max().item() <= TOL
        ours.save_pretrained(tmp_path / "ours")
        back = type(hf).from_pretrained(tmp_path / "ours", attn_implementation="eager").eval()
        assert torch.equal(back(ids).logits, ref)
    want, got = hf.state_dict(), back.state_dict()
    assert got.keys() == want.keys() and all(torch.equal(t, want[k]) for k, t in got.items())
    from safetensors import safe_open
    with safe_open(tmp_path / "ours" / "model.safetensors", "pt") as f:
        names = set(f.keys())
    with safe_open(tmp_path / "hf" / "model.safetensors", "pt") as f:
        assert names == set(f.keys())


@pytest.mark.parametrize("case", ["mixtral", "qwen3_moe-step-window", "granitemoe", "qwen2_moe", "olmoe-clip",
                                  "granitemoeshared", "flex_olmo-renorm"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_pass_gives_the_bits_of_one_token_steps(case, dtype):
    """Routing, experts and their sum read each token's own row: a 10-token pass gives bitwise the logits of 10
    one-token steps (float32, and bfloat16 where the experts' sum rounds at every add)."""
    assert_pass_equals_steps(pair(case)[1], dtype)


def test_routing_choices_matter():
    """Renormalising the chosen experts' weights, and the number chosen, each move the logits by more than ten
    times the tolerance: the tests above would see either one wrong."""
    hf, ours = pair("qwen3_moe")
    ids = torch.randint(0, 101, (1, 20), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ref = hf(ids).logits
        for layer in ours.model.layers:
            if type(layer.mlp) is SparseMoE:
                layer.mlp.renormalize = False
        assert (ours(ids) - ref).abs().max().item() > 10 * TOL
        for layer in ours.model.layers:
            if type(layer.mlp) is SparseMoE:
                layer.mlp.renormalize, layer.mlp.top_k = True, 2
        assert (ours(ids) - ref).abs().max().item() > 10 * TOL


def test_olmoes_clamp_matters():
    """OLMoE's clamp of q, k and v (clip_qkv) clamps values in the test model, and without it the logits move by more
    than ten times the tolerance: the tests above would see it missing."""
    hf, ours = pair("olmoe-clip")
    ids = torch.randint(0, 101, (1, 20), generator=torch.Generator().manual_seed(2))
    attention = ours.model.layers[0].self_attn
    seen = []
    handle = attention.v_proj.register_forward_hook(lambda m, a, out: seen.append(out))
    with torch.no_grad():
        ref = hf(ids).logits
        assert (ours(ids) - ref).abs().max().item() <= TOL
        handle.remove()
        assert (seen[0].abs() > 0.4).float().mean().item() > 0.1  # many values past the clip
        for layer in ours.model.layers:
            layer.self_attn.clip = None
        assert (ours(ids) - ref).abs().max().item() > 10 * TOL


def tiny_moe(seed, dense=(2,)):
    torch.manual_seed(seed)
    config = LlamaConfig(model_type="qwen3_moe", vocab_size=64, hidden_size=32, intermediate_size=48,
                         num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                         max_position_embeddings=1024, initializer_range=0.3,
                         extra=dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=24,
                                    norm_topk_prob=True, mlp_only_layers=list(dense)))
    return randomize_(Llama(config), seed).eval()


@pytest.mark.parametrize("method,opts", TINY_CASES, ids=[f"{m}-{i}" for i, (m, _) in enumerate(TINY_CASES)])
def test_greedy_equals_autoregressive(method, opts):
    assert_greedy_equals_autoregressive(tiny_moe(0), tiny_moe(1), method, opts)


@pytest.mark.parametrize("method,opts", [TINY_CASES[i] for i in (0, 3, 4, 6)],
                         ids=[f"{TINY_CASES[i][0]}-{i}" for i in (0, 3, 4, 6)])
def test_greedy_equals_autoregressive_flex_olmo(method, opts):
    """FlexOlmo (OLMo 2's norms after the blocks around OLMoE's mixture): greedy tokens equal autoregressive's."""
    def tiny(seed):
        torch.manual_seed(seed)
        config = LlamaConfig(model_type="flex_olmo", vocab_size=64, hidden_size=32, intermediate_size=24,
                             num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                             max_position_embeddings=1024, initializer_range=0.3,
                             extra=dict(num_experts=4, num_experts_per_tok=2, norm_topk_prob=True))
        return randomize_(Llama(config), seed).eval()
    assert_greedy_equals_autoregressive(tiny(0), tiny(1), method, opts)


def test_int8_copy_quantises_every_expert_and_drafts_losslessly():
    """The int8 draft copy replaces the router and every expert's projections (most of such a model's weights),
    shares nothing else that is float, and speculative decoding with it emits autoregressive decoding's tokens."""
    model = tiny_moe(0)
    draft = int8_copy(model)
    linears = [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)]
    q8 = {n for n, m in draft.named_modules() if isinstance(m, Q8Linear)}
    assert any(".experts.3.down_proj" in n for n in linears) and set(linears) == q8
    prompts = ragged_prompts()
    ref = triforce.generate(model, prompts, method="autoregressive", max_new_tokens=20)
    out = triforce.generate(model, prompts, method="speculative", draft=draft, gamma=3, max_new_tokens=20)
    for b in range(len(prompts)):
        assert torch.equal(out.tokens[b], ref.tokens[b])


def test_layer_skip_keeps_the_first_layers_dense_list():
    """A ``layer_skip`` draft of a config that lists dense layers past its cut keeps the ones before it (the
    cut list names no missing layer) and computes the first k layers of the model."""
    model = tiny_moe(0, dense=(0, 2))
    draft = model.layer_skip(2)
    assert draft.config.extra["mlp_only_layers"] == [0] and draft.config.experts.layers == (False, True)
    ids = torch.randint(0, 64, (1, 12), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        h = model.embed(ids)
        for layer, rope in zip(model.model.layers[:2], model.rope_tables(torch.arange(12)[None])):
            h = layer(h, *rope, None, None)
        assert torch.equal(draft(ids), model._logits(h))


def test_graphs_decline_a_mixture_of_experts(monkeypatch):
    """Which experts run is read on the host, so the CUDA-graph steps (emulated here) leave such a model eager."""
    monkeypatch.setattr(graphs, "_EMULATE", True)
    model = tiny_moe(0)
    ids = torch.zeros(1, 2, dtype=torch.long)
    cache = FullCache(model.config, 1, 32)
    dense = Llama(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                              num_attention_heads=4))
    with torch.no_grad():
        assert not graphs.enabled(model, cache, ids, None) and graphs.enabled(dense, cache, ids, None)


def test_bad_configs_raise():
    base = {**QWEN3_MOE, "model_type": "qwen3_moe"}
    for bad, match in (({"num_experts_per_tok": 7}, "more than the 6 experts"),
                       ({"num_local_experts": 5}, "differ"),
                       ({"mlp_only_layers": [3]}, "'mlp_only_layers'"),
                       ({"decoder_sparse_step": 0}, "'decoder_sparse_step'"),
                       ({"norm_topk_prob": 1}, "'norm_topk_prob'"),
                       ({"model_type": "qwen3", "num_experts": 6}, "'num_experts'"),

                       ({"router_jitter_noise": 0.1}, "'router_jitter_noise'")):
        with pytest.raises(ValueError, match=match):
            LlamaConfig.from_dict({**base, **bad})
    with pytest.raises(ValueError, match="'moe_intermediate_size'"):
        LlamaConfig.from_dict({**MIXTRAL, "model_type": "mixtral", "moe_intermediate_size": 40})
    qwen2 = {**base, "model_type": "qwen2_moe", "shared_expert_intermediate_size": 8}
    for bad, match in (({"use_sliding_window": "yes"}, "'use_sliding_window'"), ({"qkv_bias": 1}, "'qkv_bias'"),
                       ({"use_sliding_window": True, "sliding_window": None}, "'sliding_window'"),
                       ({"use_sliding_window": True, "sliding_window": 0}, "'sliding_window'"),
                       ({"use_sliding_window": True, "max_window_layers": "2"}, "'max_window_layers'"),
                       ({"layer_types": ["sliding_attention", "full_attention"]}, "'layer_types'"),
                       ({"use_sliding_window": True, "layer_types": ["full_attention"]}, "'layer_types'")):
        with pytest.raises(ValueError, match=match):
            LlamaConfig.from_dict({**qwen2, **bad})
    with pytest.raises(ValueError, match="'qkv_bias'"):
        LlamaConfig.from_dict({**base, "qkv_bias": True})
    assert LlamaConfig.from_dict({**qwen2, "max_window_layers": 21, "use_sliding_window": False}).qkv_bias
    for key in ("num_experts_per_tok", "moe_intermediate_size"):
        with pytest.raises(ValueError, match=key):
            LlamaConfig(model_type="qwen3_moe", extra={k: v for k, v in dict(
                num_experts=4, num_experts_per_tok=2, moe_intermediate_size=8).items() if k != key})
    with pytest.raises(ValueError, match="num_local_experts"):
        LlamaConfig(model_type="mixtral", extra={"num_experts_per_tok": 2})
    # the families' defaults: Mixtral 8x7B's 2 of 8; Qwen3-MoE's 8 of 128, not renormalised, width 768
    for kind, want in (("mixtral", (8, 2, 96, True, True, False)), ("qwen3_moe", (128, 8, 768, False, False, False)),
                       ("granitemoe", (8, 2, 96, True, False, True)),
                       ("qwen2_moe", (60, 4, 1408, False, False, False))):
        e = LlamaConfig.from_dict({**TINY, "model_type": kind}).experts
        assert (e.count, e.top_k, e.intermediate_size, e.renormalize, e.float32_weights, e.softmax_of_top_k) == want
    assert type(Llama(LlamaConfig.from_dict({**MIXTRAL, "model_type": "mixtral"})).model.layers[0].mlp) is not MLP
    # OLMoE: its norms span hidden_size, so the heads must too; clip_qkv is its key alone; its defaults: 8 of 64
    olmoe = {**TINY, "model_type": "olmoe", "num_experts": 4, "num_experts_per_tok": 2}
    for bad, match in (({"head_dim": 8}, "head_dim \\* num_attention_heads"), ({"clip_qkv": -1.0}, "'clip_qkv'"),
                       ({"moe_intermediate_size": 8}, "'moe_intermediate_size'")):
        with pytest.raises(ValueError, match=match):
            LlamaConfig.from_dict({**olmoe, **bad})
    with pytest.raises(ValueError, match="'clip_qkv'"):
        LlamaConfig.from_dict({**base, "clip_qkv": 1.0})
    assert LlamaConfig.from_dict({**base, "clip_qkv": None}).clip_qkv is None
    c = LlamaConfig.from_dict({**TINY, "model_type": "olmoe", "clip_qkv": 8})
    e = c.experts
    assert (e.count, e.top_k, e.intermediate_size, e.renormalize, e.float32_weights, c.clip_qkv) == (
        64, 8, 96, False, False, 8.0)
    assert c.qk_norm and c.qk_norm_full and not LlamaConfig.from_dict(base).qk_norm_full
    # GraniteMoeShared: its shared expert's width (default 0: none, as transformers'), ungated; the key is its own
    shared = {**MIXTRAL, "model_type": "granitemoeshared"}
    assert LlamaConfig.from_dict(shared).experts.shared_intermediate_size == 0
    e = LlamaConfig.from_dict({**shared, "shared_intermediate_size": 8}).experts
    assert (e.shared_intermediate_size, e.shared_gated, e.softmax_of_top_k) == (8, False, True)
    assert LlamaConfig.from_dict(qwen2).experts.shared_gated
    assert "shared_expert_gate" not in Llama(LlamaConfig.from_dict({**shared, "shared_intermediate_size": 8})
                                             ).model.layers[0].mlp._modules
    for bad in ({**MIXTRAL, "model_type": "granitemoe", "shared_intermediate_size": 8},
                {**shared, "shared_intermediate_size": -1}):
        with pytest.raises(ValueError, match="'shared_intermediate_size'"):
            LlamaConfig.from_dict(bad)


@pytest.mark.parametrize("case", ["mixtral", "qwen3_moe-gguf", "granitemoe", "qwen2_moe-gguf", "olmoe",
                                  "granitemoeshared"])
def test_gguf_file_loads_as_llama_cpp_writes_it(tmp_path, case):
    """A GGUF of a mixture of experts as llama.cpp's converter writes it (llama with expert_count: Mixtral;
    qwen3moe; granitemoe; qwen2moe, its shared expert as ffn_*_shexp: each layer's router as ffn_gate_inp, its experts
    stacked as ffn_{gate,up,down}_exps) loads
    with the logits of its model; its conversion cache holds the family's checkpoint names (transformers reads it)."""
    if case == "qwen3_moe-gguf":  # llama.cpp's qwen3moe: every layer sparse, renormalised
        hf, ours = pair("qwen3_moe", mlp_only_layers=[])
    elif case == "qwen2_moe-gguf":  # llama.cpp's qwen2moe: every layer sparse, not renormalised, an untied head
        hf, ours = pair("qwen2_moe", mlp_only_layers=[], norm_topk_prob=False, tie_word_embeddings=False)
    else:
        hf, ours = pair(case)
    c = ours.config  # granitemoe's multipliers as llama.cpp's keys
    meta = {"embedding_scale": c.embedding_multiplier, "attention.scale": c.attention_scale,
            "residual_scale": c.residual_multiplier, "logit_scale": c.logits_scaling} if case.startswith("granite") else {}
    path = write_gguf(tmp_path / "m.gguf", ours, meta)
    loaded = Llama.from_pretrained(path, cache_dir=tmp_path / "cache")
    assert loaded.config.model_type == ours.config.model_type and loaded.config.experts == ours.config.experts
    ids = torch.randint(0, 101, (2, 24), generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        assert (loaded(ids) - hf(ids).logits).abs().max().item() <= TOL
    entry = next((tmp_path / "cache").glob("gguf-*"))
    back = type(hf).from_pretrained(entry, attn_implementation="eager").eval()
    with torch.no_grad():
        assert (back(ids).logits - loaded(ids)).abs().max().item() <= TOL


def test_gguf_expert_keys_must_agree(tmp_path):
    """A dense architecture's file with experts, a qwen3moe without them, or experts' tensors without the keys
    raise naming what is wrong; so does a granite file whose RoPE is switched off (llama.cpp's granite and
    granitemoe read rope.scaling.finetuned = false as no RoPE)."""
    _, granite = pair("granitemoe")
    with pytest.raises(ValueError, match="granitemoe.rope.scaling.finetuned"):
        Llama.from_pretrained(write_gguf(tmp_path / "g.gguf", granite, {"rope.scaling.finetuned": False}),
                              cache_dir=False)
    _, ours = pair("qwen3_moe", mlp_only_layers=[])
    with pytest.raises(ValueError, match="expert_count"):
        Llama.from_pretrained(write_gguf(tmp_path / "a.gguf", ours, drop=("expert_count",)), cache_dir=False)
    with pytest.raises(ValueError, match="qwen3.expert_count"):
        Llama.from_pretrained(write_gguf(tmp_path / "b.gguf", ours, arch="qwen3"), cache_dir=False)


@pytest.mark.parametrize("case", ["mixtral", "qwen2_moe"])
def test_gguf_experts_run_on_their_blocks(tmp_path, monkeypatch, case):
    """A mixture's Q8_0 experts (stacked ffn_*_exps in the file) run on their own blocks: ``gguf_copy`` puts each
    expert's gate_up and down projections on the file's rows (the float32 model's logits bitwise), and
    ``load_gguf_int8`` builds the int8-activation model bitwise equal to ``gguf_copy(..., activations="int8")``
    without dequantising the stacked experts (qwen2moe: its shared expert on blocks too)."""
    import gguf
    from triforce.models.quant import Int8DotLinear, Q8Linear, gguf_copy, load_gguf_int8

    def q8(name, a):
        if "exps" in name or name.endswith(("attn_q.weight", "gate_shexp.weight", "up_shexp.weight")):
            return gguf.quants.quantize(a, gguf.GGMLQuantizationType.Q8_0), gguf.GGMLQuantizationType.Q8_0
        return a, None
    _, ours = pair(case, **({} if case == "mixtral" else dict(  # (Q8_0 rows: a multiple of 32 wide)
        mlp_only_layers=[], norm_topk_prob=False, tie_word_embeddings=False, moe_intermediate_size=64)))
    path = write_gguf(tmp_path / "q8.gguf", ours, quant=q8)
    model = Llama.from_pretrained(path, cache_dir=False)
    on_blocks = gguf_copy(model, path)
    dequantised, dequantize = [], gguf.quants.dequantize
    monkeypatch.setattr(gguf.quants, "dequantize", lambda data, kind: dequantised.append(data.ndim) or dequantize(
        data, kind))
    packed = load_gguf_int8(path)
    assert dequantised and 3 not in dequantised
    experts = [(layer.mlp.experts, p.mlp.experts) for layer, p in zip(on_blocks.model.layers, packed.model.layers)]
    assert all(type(m) is Q8Linear for e, _ in experts for x in e for m in (x.gate_up_proj, x.down_proj))
    assert all(type(m) is Int8DotLinear for _, e in experts for x in e for m in (x.gate_up_proj, x.down_proj))
    if case == "qwen2_moe":
        assert all(type(layer.mlp.shared_expert.up_proj) is Q8Linear for layer in on_blocks.model.layers)
    ids = torch.randint(0, 101, (2, 20), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        assert torch.equal(on_blocks(ids), model(ids))
        assert torch.equal(packed(ids), gguf_copy(model, path, activations="int8")(ids))


def test_the_shared_experts_gate_is_row_invariant():
    """Qwen2-MoE's shared-expert gate, a sigmoid of one value per row: ATen's float32 sigmoid gives some values other
    bits in its vector loop than in its scalar tail (so a pass of 32 rows or more would differ from one-row steps);
    ``_row_sigmoid`` gives every row the bits of the row alone, at any row count, and a 48-row pass of a Qwen2-MoE
    model the bits of its steps."""
    from triforce.models.llama import _row_sigmoid

    z = torch.randn(600, 1, generator=torch.Generator().manual_seed(8)) * 4
    alone = torch.cat([_row_sigmoid(z[i:i + 1]) for i in range(600)])
    assert not torch.equal(torch.sigmoid(z), torch.cat([torch.sigmoid(z[i:i + 1]) for i in range(600)]))
    for n in (1, 31, 33, 257, 600):
        assert torch.equal(_row_sigmoid(z[:n]), alone[:n])
    assert_pass_equals_steps(pair("qwen2_moe")[1], torch.float32, tokens=24)


# ---- triforce_C::moe_experts (csrc/cpu/moe.cpp): every chosen expert in one native call

needs_op = pytest.mark.skipif(not (_rowwise_available() and hasattr(torch.ops.triforce_C, "moe_experts")),
                              reason="the C++ extension is not built")


def project(x, w, scales):
    """The row-wise op of a projection's format (what its module calls on the CPU)."""
    ops = torch.ops.triforce_C
    if w.dtype == torch.uint8:
        return ops.rowwise_linear_q4_1(x, w) if scales is None else ops.rowwise_linear_i8(x, w, scales)
    return ops.rowwise_linear(x, w) if scales is None else ops.rowwise_linear_q8(x, w, scales)


def experts_one_by_one(x, index, weight, gate_up, gate_up_scales, down, down_scales, activation, gate_up_bias=None,
                       down_bias=None, swiglu_alpha=None, swiglu_limit=None):
    """What SparseMoE computes without the op: each chosen expert's rows through the row-wise ops (plus the
    projection's bias, if any, as Linear adds it), its output times the weights rounded to the dtype and added to
    the rows, in increasing expert order."""
    out = torch.zeros_like(x)
    for e in torch.unique(index).tolist():
        token, slot = torch.where(index == e)
        h = project(x[token], gate_up[e], gate_up_scales[e])
        if gate_up_bias is not None and gate_up_bias[e] is not None:
            h.add_(gate_up_bias[e])
        width = h.shape[1] // 2
        gate, up = h[:, :width].contiguous(), h[:, width:].contiguous()
        a = (torch.ops.triforce_C.swiglu_clamped_mul(gate, up, swiglu_alpha, swiglu_limit)
             if activation == "swiglu_clamped" else getattr(torch.ops.triforce_C, f"{activation}_mul")(gate, up))
        y = project(a, down[e], down_scales[e])
        if down_bias is not None and down_bias[e] is not None:
            y.add_(down_bias[e])
        out.index_put_((token,), (y * weight[token, slot, None]).to(x.dtype), accumulate=True)
    return out


def quantised(w, fmt):
    """``(weight, scales)`` of a float32 weight in a quantised format (``float``: itself, no scales)."""
    from triforce.models.quant import Int8DotLinear, Q4Linear, quantize_q4_1, quantize_q8
    if fmt == "q8":
        return quantize_q8(w)
    if fmt == "q4_1":
        return quantize_q4_1(w), None
    if fmt == "i8":
        mod = Int8DotLinear.from_q4(Q4Linear(quantize_q4_1(w), w.shape[1]))
        return mod.codes, mod.scales
    return w, None


def random_experts(seed, N, k, H, widths, dtype, weight_dtype, chosen=None, formats=None):
    """The op's arguments but the activation: x [N, H], index [N, k] (chosen experts only, repeats within a row
    allowed), weights, the experts' gate-up weights and scales, down weights and scales (None for an expert no row
    chose); ``formats``: per expert, the (gate-up, down) formats of :func:`quantised` (default float)."""
    g = torch.Generator().manual_seed(seed)
    E = len(widths)
    chosen = list(range(E)) if chosen is None else chosen
    formats = formats or [("float", "float")] * E
    x = torch.randn(N, H, generator=g).to(dtype)
    index = torch.tensor(chosen)[torch.randint(len(chosen), (N, k), generator=g)]
    weight = torch.rand(N, k, generator=g).to(weight_dtype)
    lists = [[None] * E for _ in range(4)]
    for e, I in enumerate(widths):
        if e in chosen:
            up = torch.randn(2 * I, H, generator=g).div(H ** 0.5).to(dtype)
            down = torch.randn(H, I, generator=g).div(max(I, 1) ** 0.5).to(dtype)
            (lists[0][e], lists[1][e]), (lists[2][e], lists[3][e]) = (quantised(w, f) for w, f in zip((up, down),
                                                                                                       formats[e]))
    return (x, index, weight, *lists)


@needs_op
@given(N=st.integers(0, 40), k=st.integers(1, 4), H=st.integers(1, 80), widths=st.lists(st.integers(0, 50), min_size=1,
       max_size=6), dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float16]),
       float32_weights=st.booleans(), activation=st.sampled_from(["silu", "gelu_tanh"]), seed=st.integers(0, 2**31 - 1))
@example(N=300, k=4, H=33, widths=[20, 17, 0], dtype=torch.bfloat16, float32_weights=True, activation="silu", seed=1)
def test_moe_experts_gives_the_bits_of_the_experts_one_by_one(N, k, H, widths, dtype, float32_weights, activation,
                                                              seed):
    """Any rows, experts of any widths (0 included), a row choosing an expert twice, float32 or dtype weights,
    an expert no row chose passed as None; an expert with more than 256 rows (the kernel's row chunks): bitwise
    the experts one by one, and every row bitwise that row alone."""
    chosen = [e for e in range(len(widths)) if e % 3 != 1] or [0]
    args = random_experts(seed, N, k, H, widths, dtype, torch.float32 if float32_weights else dtype, chosen)
    assert_op_matches_one_by_one(args, activation)


def assert_op_matches_one_by_one(args, activation, *extra, **clamp):
    """The op against :func:`experts_one_by_one` on ``args`` (and ``extra``: the biases; ``clamp``: the clamped
    SwiGLU's constants), and rows of it alone."""
    out = torch.ops.triforce_C.moe_experts(*args, activation, *extra, **clamp)
    x, index, weight = args[:3]
    assert out.dtype == x.dtype and out.shape == x.shape
    assert torch.equal(out, experts_one_by_one(*args, activation, *extra, **clamp))
    N = x.shape[0]
    for t in range(0, N, max(1, N // 5)):
        alone = torch.ops.triforce_C.moe_experts(x[t:t + 1], index[t:t + 1], weight[t:t + 1], *args[3:], activation,
                                                 *extra, **clamp)
        assert torch.equal(alone[0], out[t])


@needs_op
@given(N=st.integers(0, 40), k=st.integers(1, 4), H=st.integers(1, 80), widths=st.lists(st.integers(0, 50), min_size=1,
       max_size=6), dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float16]),
       float32_weights=st.booleans(), activation=st.sampled_from(["silu", "swiglu_clamped"]),
       biased=st.lists(st.tuples(st.booleans(), st.booleans()), min_size=6, max_size=6),
       alpha=st.sampled_from([1.702, 0.5, 3.0]), limit=st.sampled_from([7.0, 0.3, 1.0]), seed=st.integers(0, 2**31 - 1))
@example(N=300, k=4, H=33, widths=[20, 17, 0], dtype=torch.bfloat16, float32_weights=True, activation="swiglu_clamped",
         biased=[(True, True)] * 6, alpha=1.702, limit=0.3, seed=1)
def test_moe_experts_with_biases_and_the_clamped_swiglu(N, k, H, widths, dtype, float32_weights, activation, biased,
                                                        alpha, limit, seed):
    """GPT-OSS's experts: biases on any of the projections (each added to its product and rounded, as Linear adds
    it: before the activation, before the weight) and the clamped SwiGLU (limits that clamp most values or none):
    bitwise the experts one by one, every row bitwise alone."""
    chosen = [e for e in range(len(widths)) if e % 3 != 1] or [0]
    args = random_experts(seed, N, k, H, widths, dtype, torch.float32 if float32_weights else dtype, chosen)
    g = torch.Generator().manual_seed(seed + 1)
    biases = [[None] * len(widths), [None] * len(widths)]
    for e in chosen:
        for j, n in enumerate((2 * widths[e], H)):
            if biased[e][j]:
                biases[j][e] = torch.randn(n, generator=g).to(dtype)
    clamp = {"swiglu_alpha": alpha, "swiglu_limit": limit} if activation == "swiglu_clamped" else {}
    assert_op_matches_one_by_one(args, activation, *biases, **clamp)


FORMATS = ["float", "q8", "q4_1", "i8"]


@needs_op
@given(N=st.integers(1, 40), k=st.integers(1, 3), H=st.sampled_from([32, 64]), I=st.sampled_from([32, 64]),
       formats=st.lists(st.tuples(st.sampled_from(FORMATS), st.sampled_from(FORMATS)), min_size=1, max_size=4),
       seed=st.integers(0, 2**31 - 1))
@example(N=300, k=2, H=64, I=32, formats=[("i8", "i8"), ("q8", "q4_1"), ("float", "i8")], seed=2)
def test_moe_experts_on_quantised_experts(N, k, H, I, formats, seed):
    """Float32 rows, each expert's projections in any of the row-wise formats (int8 with float32 scales, Q4_1 blocks,
    int8 codes for integer dot products, float32), mixed as a GGUF file may mix them: bitwise the experts one by
    one through the formats' ops (the integer-dot formats round the packed rows once: the same bits as each
    expert's rows alone), every row bitwise alone."""
    args = random_experts(seed, N, k, H, [I] * len(formats), torch.float32, torch.float32, formats=formats)
    assert_op_matches_one_by_one(args, "silu")


def module_by_module(moe, rows):
    """``moe``'s output for ``rows`` with its experts run one by one (and its shared expert, gated or not)."""
    out = moe._experts_one_by_one(rows, *moe.route(rows))
    if "shared_expert" in moe._modules:
        shared = moe.shared_expert(rows)
        if "shared_expert_gate" in moe._modules:
            shared = _row_sigmoid(moe.shared_expert_gate(rows)) * shared
        out = out + shared
    return out


@needs_op
@pytest.mark.parametrize("case", ["mixtral", "qwen3_moe", "granitemoe", "qwen2_moe", "olmoe", "granitemoeshared"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_sparse_layers_take_the_op_with_the_bits_of_their_modules(case, dtype, monkeypatch):
    """A sparse layer's MLP runs its experts in one moe_experts call for a step, a pass and a 200-row forward
    outside a prefill, with the bits of its experts run module by module, and so does the int8 copy's (float32);
    in a prefill's bulk products only while no expert has more than 128 rows (300 rows: one has); autograd and a
    hooked expert run module by module."""
    model = pair(case)[1].to(dtype)
    moe = next(layer.mlp for layer in model.model.layers if type(layer.mlp) is SparseMoE)
    calls = []
    real = torch.ops.triforce_C.moe_experts
    monkeypatch.setattr(torch.ops.triforce_C, "moe_experts", lambda *a: calls.append(a[0].shape[0]) or real(*a),
                        raising=False)
    g = torch.Generator().manual_seed(4)
    with torch.no_grad():
        for n in (1, 5, 200):
            x = torch.randn(1, n, model.config.hidden_size, generator=g).to(dtype)
            rows = x[0]
            assert torch.equal(moe(x)[0], module_by_module(moe, rows))
            assert calls[-1] == n
        calls.clear()
        with _bulk_linears():  # a prefill: experts of up to 128 rows take it (their Linears the row-wise kernel)
            for n in (300, 200):  # (300: some expert has 150 rows or more)
                x = torch.randn(1, n, model.config.hidden_size, generator=g).to(dtype)
                w, index = moe.route(x[0])
                native = int(torch.bincount(index.flatten()).max()) <= 128
                assert native == (n == 200)  # (300 rows: 600 or 900 pairs over 4 or 6 experts; 200: ~110 at most)
                out = moe(x)[0]
                assert calls == ([200] if native else [])
                if native:
                    assert torch.equal(out, module_by_module(moe, x[0]))
        bulk = list(calls)
        handle = moe.experts[0].register_forward_hook(lambda *a: None)
        moe(torch.randn(1, 64, model.config.hidden_size).to(dtype))  # 64 random rows: expert 0 is among the chosen
        handle.remove()
        assert calls == bulk
    moe(torch.randn(1, 3, model.config.hidden_size).to(dtype).requires_grad_())
    assert calls == bulk
    if dtype == torch.float32:  # the int8 copy's experts take it too, with the bits of its modules
        with torch.no_grad():
            copy = next(layer.mlp for layer in int8_copy(model).model.layers if type(layer.mlp) is SparseMoE)
            rows = torch.randn(7, model.config.hidden_size, generator=g)
            assert torch.equal(copy(rows[None])[0], module_by_module(copy, rows))
        assert calls == bulk + [7]


@needs_op
def test_moe_experts_rejects_bad_arguments():
    x, index, weight, gate_up, gate_up_scales, down, down_scales = random_experts(0, 3, 2, 8, [4, 6], torch.float32,
                                                                                  torch.float32)
    op = torch.ops.triforce_C.moe_experts
    nones = [None, None]
    q, s = quantised(torch.randn(8, 32), "q8")
    bad = [
        ((x.double(), index, weight, gate_up, nones, down, nones, "silu"), "float32, bfloat16 or float16"),
        ((x, index.int(), weight, gate_up, nones, down, nones, "silu"), "index must be int64"),
        ((x, index[:2], weight, gate_up, nones, down, nones, "silu"), "index must be int64"),
        ((x, index, weight[:, :1], gate_up, nones, down, nones, "silu"), "weight must be"),
        ((x, index, weight.half(), gate_up, nones, down, nones, "silu"), "float32 or x's dtype"),
        ((x, index, weight, gate_up, nones, down, nones, "relu"), "activation must be"),
        ((x, index, weight, gate_up, nones, down[:1], nones, "silu"), "2 gate_up weights, 2 gate_up scales, 1 down"),
        ((x, index, weight, gate_up, nones[:1], down, nones, "silu"), "1 gate_up scales"),
        ((x, index + 1, weight, gate_up, nones, down, nones, "silu"), "outside the 2 experts"),
        ((x, index, weight, [None, gate_up[1]], nones, down, nones, "silu"), "is chosen but"),
        ((x, index, weight, [gate_up[0].half(), gate_up[1]], nones, down, nones, "silu"), "x and w alike"),
        ((x, index, weight, [gate_up[0][:7], gate_up[1]], nones, down, nones, "silu"), "7 rows, not 2I"),
        ((x, index, weight, gate_up, nones, [down[0][:, :3], down[1]], nones, "silu"), "x has 4 columns, w 3"),
        ((x, index, weight, gate_up, nones, [down[0][:7], down[1]], nones, "silu"), "has 7 outputs, x 8"),
        ((x.bfloat16(), index, weight, [q, q], [s, s], down, nones, "silu"), "x float32"),
        ((x, index, weight, gate_up, nones, down, nones, "silu", nones[:1]), "1 gate_up biases for 2 experts"),
        ((x, index, weight, gate_up, nones, down, nones, "silu", None, nones * 2), "4 down biases for 2 experts"),
        ((x, index, weight, gate_up, nones, down, nones, "silu", [torch.zeros(7), None]), r"contiguous Float \[8\]"),
        ((x, index, weight, gate_up, nones, down, nones, "silu", None, [None, torch.zeros(8).half()]),
         "expert 1's biases must be"),
        ((x, index, weight, gate_up, nones, down, nones, "swiglu_clamped"), "limit finite and > 0, got 0 and 0"),
        ((x, index, weight, gate_up, nones, down, nones, "swiglu_clamped", None, None, float("nan"), 7.0),
         "alpha must be finite"),
    ]
    for args, message in bad:
        with pytest.raises(RuntimeError, match=message):
            op(*args)


def test_flex_olmo_defaults():
    """A FlexOlmo config without the keys takes FlexOlmoConfig's (FlexOlmo-7x7B's shape: 5 of 7 experts, not
    renormalised, RoPE base 5e5, MHA)."""
    c, want = LlamaConfig.from_dict({"model_type": "flex_olmo"}), transformers.FlexOlmoConfig()
    for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                 "num_key_value_heads", "max_position_embeddings", "rms_norm_eps", "tie_word_embeddings"):
        assert getattr(c, name) == getattr(want, name), name
    e = c.experts
    assert (e.count, e.top_k, e.renormalize, e.intermediate_size) == (want.num_experts, want.num_experts_per_tok,
                                                                      want.norm_topk_prob, want.intermediate_size)
    assert c.rope_theta == want.rope_parameters["rope_theta"] and c.post_norms and c.float32_norm
