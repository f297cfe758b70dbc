"""Qwen3.5 (``model_type="qwen3_5_text"``: Qwen3_5ForCausalLM; Qwen3_5ForConditionalGeneration read text-only): its
gated DeltaNet layers (:class:`~triforce.models.llama.GatedDeltaNet`) and gated attention against transformers, and
the caches' DeltaNet states through steps, trees, rollbacks (replayed from a checkpoint), evictions and retrieval."""
import pytest
import torch

import triforce.models.cache as cache_module
from triforce.models import Llama, LlamaConfig
from triforce.models.llama import Attention, GatedDeltaNet

from .test_engines import TINY_CASES, assert_greedy_equals_autoregressive
from .test_families import TOL, TINY, assert_save_loads, randomize_, tiny_family
from .test_lfm2 import (assert_draft_caches_exact, assert_parts_count, assert_rollbacks_restore_the_state,
                        assert_rows_kept_apart)
from .test_mamba2 import (assert_a_deep_rollback_replays, assert_matches_both_ways,
                          assert_rollback_before_the_checkpoints_raises, stacked_experts_gguf)
from .test_sliding_window import assert_pass_equals_steps

transformers = pytest.importorskip("transformers")

# The DeltaNet layers' projections' draw: at 0.1 float32's rounding moves the logits by a few 1e-6 in either
# implementation (ours, transformers' chunked or recurrent form, each against transformers in float64); at 0.2 by ~2e-5
# in each, past TOL, which test_as_close_to_float64_as_transformers covers
STD = 0.1
TYPES = ["linear_attention", "full_attention", "linear_attention"]
QWEN3_5 = dict(TINY, num_hidden_layers=3, head_dim=16, layer_types=TYPES, linear_num_key_heads=2,
               linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=12, linear_conv_kernel_dim=4)
CASES = {"untied": {},
         # (a bias on every attention projection, the gate's share of q_proj's too; one value head per key head; 3 taps;
         # tied; its M-RoPE keys, which on text are its RoPE)
         "biased-tied": dict(attention_bias=True, tie_word_embeddings=True, linear_num_value_heads=2,
                             linear_conv_kernel_dim=3, rope_parameters={
                                 "rope_type": "default", "rope_theta": 1e6, "partial_rotary_factor": 0.5,
                                 "mrope_section": [2, 1, 1], "mrope_interleaved": True})}
EXTRA = {"layer_types": TYPES, "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 8,
         "linear_value_head_dim": 8}


def delta_pair(config_class="Qwen3_5TextConfig", model_class="Qwen3_5ForCausalLM", std=STD, **kw):
    """transformers' model of ``config`` (eager attention; the DeltaNet layers' projections and convolution drawn larger
    than its initialisation so that they count, A_log moved, biases and norms randomised) and ours built from its
    config and weights."""
    from triforce.models.loading import _build

    torch.manual_seed(0)
    config = getattr(transformers, config_class)(**kw, attn_implementation="eager")
    hf = randomize_(getattr(transformers, model_class)(config).eval())
    with torch.no_grad():
        for key, p in hf.named_parameters():
            if ".linear_attn." in key and key.endswith("weight") and "norm" not in key:
                p.normal_(0, std)
            if key.endswith("A_log"):
                p.add_(torch.randn_like(p) * 0.3)
    return hf, _build(LlamaConfig.from_dict(hf.config.to_dict()), hf.state_dict(), None, None)


def pair(case="untied"):
    return delta_pair(**{**QWEN3_5, **CASES[case]})


def tiny(seed, types=tuple(TYPES)):
    return tiny_family("qwen3_5_text", seed, layers=len(types), head_dim=8, extra={**EXTRA, "layer_types": list(types)})


@pytest.mark.parametrize("case", list(CASES))
def test_every_path_and_saves_match_transformers(tmp_path, case):
    """Every path (the plain forward, a chunked prefill, a verify pass, one-token steps, a tree whose branches each run
    the state from their own parent) gives transformers' logits; our save reads back in transformers, its save in
    ours."""
    hf, ours = pair(case)
    assert [type(layer.self_attn) for layer in ours.model.layers] == [GatedDeltaNet, Attention, GatedDeltaNet]
    assert ours.config.kv_heads_per_layer == (0, 2, 0)
    assert_matches_both_ways(tmp_path, hf, ours)


FLOAT64_CASES = {"qwen3_5": ("qwen3_5", "Qwen3_5TextConfig", "Qwen3_5ForCausalLM", 0.2, "QWEN3_5"),
                 # (Qwen3-Next's mixture at the draw of 0.1: one token's logits 4.6e-5 off float64 in transformers'
                 # float32, which is why its every-path tests draw 0.05)
                 "qwen3_next": ("qwen3_next", "Qwen3NextConfig", "Qwen3NextForCausalLM", 0.1, "NEXT")}


@pytest.mark.parametrize("case", list(FLOAT64_CASES))
def test_as_close_to_float64_as_transformers(case):
    """With weights large enough that float32's rounding alone moves the logits past TOL, ours stay as close to
    transformers' model in float64 as transformers' own float32 forward (its chunked form, and its one-token recurrent
    form run over the whole input), within a factor of 1.5."""
    import importlib

    module, config_class, model_class, std, kw = FLOAT64_CASES[case]
    theirs = importlib.import_module(f"transformers.models.{module}.modeling_{module}")
    hf, ours = delta_pair(config_class, model_class, std=std, **globals()[kw])
    assert_as_close_to_float64_as_transformers(hf, ours, theirs, "torch_chunk_gated_delta_rule",
                                               "torch_recurrent_gated_delta_rule")


def assert_as_close_to_float64_as_transformers(hf, ours, theirs, chunked: str, recurrent: str):
    """``ours`` as close to transformers' ``hf`` run in float64 as ``hf``'s own float32 forward, its chunked form
    (``theirs.<chunked>``) and its one-token recurrent form (``theirs.<recurrent>``, put in its place) run over the
    whole input, within a factor of 1.5; both farther than TOL (else the every-path tests cover it)."""
    import copy

    for m in hf.modules():  # (its experts' loop: float64 has no grouped matmul)
        if hasattr(m, "config"):
            m.config._experts_implementation = "eager"
    ids = torch.randint(0, 101, (2, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        exact = copy.deepcopy(hf).double()(ids).logits
        errors = [(hf(ids).logits.double() - exact).abs().max().item()]
        kept = getattr(theirs, chunked)
        try:
            setattr(theirs, chunked, getattr(theirs, recurrent))
            errors.append((hf(ids).logits.double() - exact).abs().max().item())
        finally:
            setattr(theirs, chunked, kept)
        ours_error = (ours(ids).double() - exact).abs().max().item()
    assert min(errors) > 1e-5 and ours_error <= 1.5 * min(errors), (ours_error, errors)


def test_each_part_moves_the_logits():
    """A_log, dt_bias, the convolution, the gated norm's weight, the z, b and a projections and the attention's gate
    count; so does the state a cached step starts from: zeroed, the next step's logits move."""
    hf, ours = pair()
    ids = torch.randint(0, 101, (2, 16), generator=torch.Generator().manual_seed(4))
    m = ours.model.layers[2].self_attn
    assert_parts_count(hf, ours, ids, (m.A_log, m.dt_bias, m.conv1d.weight, m.norm.weight, m.in_proj_z.weight,
                                       m.in_proj_b.weight, m.in_proj_a.weight,
                                       ours.model.layers[1].self_attn.gate_proj.weight),
                       lambda cache: cache.ssm[2].zero_())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("case", list(CASES))
def test_a_pass_gives_the_bits_of_one_token_steps(dtype, case):
    assert_pass_equals_steps(pair(case)[1], dtype)


def test_rollback_and_commit_path_rebuild_the_state():
    """Rolled back to any accepted length after a pass, over several forwards, past a checkpoint (the state replayed
    from the last one before it), and after a tree's commit_path, the next steps' logits are bitwise those of a cache
    that only ever saw the accepted tokens."""
    model = tiny(0)
    ids, want = assert_rollbacks_restore_the_state(model, length=42)
    assert_a_deep_rollback_replays(model, ids, want)


def test_a_rollback_before_every_checkpoint_raises(monkeypatch):
    assert_rollback_before_the_checkpoints_raises(monkeypatch, tiny(0))


def test_drafts_caches_run_the_state_exactly():
    """On a model of DeltaNet layers only, StreamingLLM and retrieval caches give the full cache's logits bitwise."""
    assert_draft_caches_exact(tiny(3, types=("linear_attention", "linear_attention")))


def test_ragged_rows_and_row_selection_keep_each_rows_state():
    assert_rows_kept_apart(tiny(0))


def test_the_gpus_path_of_the_state_is_exact(monkeypatch):
    """With the caches' value checks off (a GPU's path), rollbacks, commit_path, the draft caches and ragged rows stay
    bitwise."""
    monkeypatch.setattr(cache_module, "check_values", lambda t: False)
    assert_rollbacks_restore_the_state(tiny(0), length=42)
    assert_rows_kept_apart(tiny(0))
    assert_draft_caches_exact(tiny(3, types=("linear_attention", "linear_attention")))


@pytest.mark.parametrize("method,opts", [TINY_CASES[i] for i in (0, 2, 3, 4, 6)],
                         ids=[f"{TINY_CASES[i][0]}-{i}" for i in (0, 2, 3, 4, 6)])
def test_greedy_equals_autoregressive(method, opts):
    assert_greedy_equals_autoregressive(tiny(0), tiny(1), method, opts)


def test_config_reads_its_layers_as_transformers_reads_them():
    """Qwen3_5TextConfig's defaults (every fourth layer attention; its DeltaNet widths; RoPE on a quarter of each
    head); its layer_types from full_attention_interval; refusals."""
    want = transformers.Qwen3_5TextConfig()
    c = LlamaConfig.from_dict({"model_type": "qwen3_5_text"})
    d = c.delta
    assert d.layers == tuple(t == "linear_attention" for t in want.layer_types) and d.layers.count(False) == 8
    assert (d.k_heads, d.v_heads, d.k_dim, d.v_dim, d.kernel) == (
        want.linear_num_key_heads, want.linear_num_value_heads, want.linear_key_head_dim, want.linear_value_head_dim,
        want.linear_conv_kernel_dim)
    assert c.rotary_dim == 64 and c.head_dim == 256 and c.gemma_norm and c.attn_output_gate
    assert c.kv_heads_per_layer == tuple(0 if t else 4 for t in d.layers)
    c = LlamaConfig.from_dict({"model_type": "qwen3_5_text", "num_hidden_layers": 6, "full_attention_interval": 3})
    assert c.delta.layers == (True, True, False, True, True, False)
    for bad, match in (({"layer_types": ["linear_attention", "sliding_attention"]}, "layer_types"),
                       ({"linear_num_key_heads": 3}, "linear_num_value_heads"),
                       ({"attn_output_gate": False}, "attn_output_gate"),
                       ({"linear_key_head_dim": 0}, "linear_key_head_dim"),
                       ({"use_sliding_window": True}, "use_sliding_window")):
        with pytest.raises(ValueError, match=match):
            LlamaConfig.from_dict({"model_type": "qwen3_5_text", "num_hidden_layers": 2, **bad})


@pytest.mark.parametrize("tied", [True, False])
def test_qwen3_5_image_text_checkpoints_read_their_language_model(tmp_path, tied):
    """Qwen3.5's checkpoints (Qwen3_5ForConditionalGeneration: model.language_model.*, a vision tower not read) give
    the wrapper's logits on text, tied by the wrapper's key."""
    torch.manual_seed(0)
    vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64, patch_size=4,
                  spatial_merge_size=1, temporal_patch_size=1)
    config = transformers.Qwen3_5Config(text_config=QWEN3_5, vision_config=vision, tie_word_embeddings=tied)
    hf = randomize_(transformers.Qwen3_5ForConditionalGeneration(config).eval())
    hf.save_pretrained(tmp_path)
    ours = Llama.from_pretrained(tmp_path)
    assert ours.config.model_type == "qwen3_5_text" and ours.config.tie_word_embeddings == tied
    ids = torch.randint(0, 101, (2, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert (ours(ids) - hf(input_ids=ids).logits).abs().max().item() <= TOL


def test_mtp_weights_are_dropped(tmp_path):
    """Its checkpoints' multi-token prediction weights (mtp.*) are not part of the forward: dropped on loading, as
    transformers drops them."""
    from safetensors.torch import load_file, save_file

    hf, ours = pair()
    hf.save_pretrained(tmp_path)
    path = next(tmp_path.glob("*.safetensors"))
    sd = load_file(path)
    sd["mtp.fc.weight"] = torch.zeros(64, 128)
    save_file(sd, path, metadata={"format": "pt"})
    ids = torch.randint(0, 101, (1, 8), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.equal(Llama.from_pretrained(tmp_path)(ids), ours(ids))


@pytest.mark.parametrize("shape", [(2, 5, 2, 4, 8, 6), (1, 3, 1, 3, 5, 7), (3, 1, 2, 2, 16, 4)])
def test_delta_scan_is_the_recurrence(shape):
    """``delta_scan`` against the gated delta rule in float64; a T-token call bitwise T one-token calls and the same
    with one thread; tokens past a row's count leave its state; a replay (no queries) moves the state alike."""
    from triforce.models.cache import delta_scan

    b, T, Hk, Hv, K, V = shape
    g = torch.Generator().manual_seed(sum(shape))
    q, k = (torch.nn.functional.normalize(torch.randn(b, T, Hk, K, generator=g), dim=-1) for _ in range(2))
    v = torch.randn(b, T, Hv, V, generator=g)
    beta, decay = torch.rand(b, T, Hv, generator=g), torch.exp(-torch.rand(b, T, Hv, generator=g))
    state = torch.randn(b, Hv, K, V, generator=g)
    s64, want = state.double(), []
    qh, kh = (t.double().repeat_interleave(Hv // Hk, dim=2) for t in (q, k))
    for t in range(T):
        s64 = s64 * decay[:, t, :, None, None].double()
        delta = (v[:, t].double() - torch.einsum("bhkv,bhk->bhv", s64, kh[:, t])) * beta[:, t, :, None].double()
        s64 = s64 + kh[:, t, ..., None] * delta[:, :, None, :]
        want.append(torch.einsum("bhkv,bhk->bhv", s64, qh[:, t]))
    got = state.clone()
    y = delta_scan(got, q, k, v, beta, decay)
    assert torch.allclose(y.double(), torch.stack(want, 1), atol=1e-4, rtol=1e-4)
    assert torch.allclose(got.double(), s64, atol=1e-4, rtol=1e-4)
    steps, one = state.clone(), []
    for t in range(T):
        sl = slice(t, t + 1)
        one.append(delta_scan(steps, q[:, sl], k[:, sl], v[:, sl], beta[:, sl], decay[:, sl]))
    assert torch.equal(torch.cat(one, 1), y) and torch.equal(steps, got)
    replay = state.clone()
    assert delta_scan(replay, None, k, v, beta, decay) is None and torch.equal(replay, got)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        single = state.clone()
        assert torch.equal(delta_scan(single, q, k, v, beta, decay), y) and torch.equal(single, got)
    finally:
        torch.set_num_threads(threads)
    counts = torch.arange(b) % (T + 1)
    part = state.clone()
    delta_scan(part, q, k, v, beta, decay, counts)
    for i in range(b):
        ref, n = state[i:i + 1].clone(), int(counts[i])
        delta_scan(ref, q[i:i + 1, :n], k[i:i + 1, :n], v[i:i + 1, :n], beta[i:i + 1, :n], decay[i:i + 1, :n])
        assert torch.equal(part[i:i + 1], ref)


NEXT = dict(QWEN3_5, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=24,
            shared_expert_intermediate_size=32)
NEXT_CASES = {"sparse": {},
              # (a dense layer by mlp_only_layers, the others sparse every step; not renormalised; biases; tied)
              "dense-layer-biased": dict(mlp_only_layers=[1], norm_topk_prob=False, attention_bias=True,
                                         tie_word_embeddings=True, linear_num_value_heads=2)}


def next_pair(**kw):
    """transformers' Qwen3NextForCausalLM and ours, the DeltaNet projections drawn at 0.05 (at 0.1 transformers' own
    float32 strays: test_as_close_to_float64_as_transformers)."""
    return delta_pair("Qwen3NextConfig", "Qwen3NextForCausalLM", std=0.05, **{**NEXT, **kw})


@pytest.mark.parametrize("case", list(NEXT_CASES))
def test_qwen3_next_every_path_and_saves_match_transformers(tmp_path, case):
    """Qwen3-Next (Qwen3NextForCausalLM): Qwen3.5's layers with Qwen2-MoE's mixture routed as Qwen3-MoE's; its fused
    DeltaNet projections (in_proj_qkvz, in_proj_ba, grouped by key head) split on loading and joined on saving."""
    hf, ours = next_pair(**NEXT_CASES[case])
    assert [type(layer.self_attn) for layer in ours.model.layers] == [GatedDeltaNet, Attention, GatedDeltaNet]
    assert ours.config.experts.layers == ((True, False, True) if case != "sparse" else (True,) * 3)
    assert_matches_both_ways(tmp_path, hf, ours)


def test_qwen3_next_each_part_moves_the_logits():
    """Each of the fused projections' parts counts: the query, key, value and gate rows of in_proj_qkvz, the b and a
    rows of in_proj_ba (split into the model's projections), the shared expert's gate."""
    hf, ours = next_pair()
    ids = torch.randint(0, 101, (2, 16), generator=torch.Generator().manual_seed(4))
    m = ours.model.layers[0].self_attn
    kd = m.key_dim
    assert_parts_count(hf, ours, ids, (m.in_proj_qkv.weight[:kd], m.in_proj_qkv.weight[kd:2 * kd],
                                       m.in_proj_qkv.weight[2 * kd:], m.in_proj_z.weight, m.in_proj_b.weight,
                                       m.in_proj_a.weight, ours.model.layers[0].mlp.shared_expert_gate.weight),
                       lambda cache: cache.ssm[0].zero_())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_qwen3_next_pass_gives_the_bits_of_one_token_steps(dtype):
    assert_pass_equals_steps(next_pair()[1], dtype)


@pytest.mark.parametrize("tied", [True, False])
def test_qwen3_5_moe_every_path_and_image_text_checkpoints(tmp_path, tied):
    """Qwen3.5-MoE (Qwen3_5MoeForCausalLM): every layer Qwen3-Next's mixture, always renormalised; its image + text
    checkpoints (Qwen3_5MoeForConditionalGeneration) read text-only, tied by the wrapper's key."""
    kw = dict(NEXT)
    hf, ours = delta_pair("Qwen3_5MoeTextConfig", "Qwen3_5MoeForCausalLM", **kw)
    assert ours.config.experts.renormalize and ours.config.experts.layers == (True,) * 3
    assert_matches_both_ways(tmp_path / "text", hf, ours)
    torch.manual_seed(0)
    vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64, patch_size=4,
                  spatial_merge_size=1, temporal_patch_size=1)
    config = transformers.Qwen3_5MoeConfig(text_config=kw, vision_config=vision, tie_word_embeddings=tied)
    wrapped = randomize_(transformers.Qwen3_5MoeForConditionalGeneration(config).eval())
    wrapped.save_pretrained(tmp_path / "wrapped")
    loaded = Llama.from_pretrained(tmp_path / "wrapped")
    assert loaded.config.model_type == "qwen3_5_moe_text" and loaded.config.tie_word_embeddings == tied
    ids = torch.randint(0, 101, (2, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert (loaded(ids) - wrapped(input_ids=ids).logits).abs().max().item() <= TOL
    for bad, match in (({"norm_topk_prob": False}, "norm_topk_prob"), ({"decoder_sparse_step": 2}, "decoder_sparse")):
        with pytest.raises(ValueError, match=match):
            LlamaConfig.from_dict({"model_type": "qwen3_5_moe_text", "num_hidden_layers": 4, **bad})


OLMO_HYBRID = dict(TINY, num_hidden_layers=3, layer_types=TYPES, linear_num_key_heads=2, linear_num_value_heads=4,
                   linear_key_head_dim=8, linear_value_head_dim=12, pad_token_id=0, eos_token_id=1)
OLMO_HYBRID_CASES = {"negative-eigenvalues": {},
                     # (beta in (0, 1); biased attention projections; tied; one value head per key head; 3 taps)
                     "plain-biased-tied": dict(linear_allow_neg_eigval=False, attention_bias=True,
                                               tie_word_embeddings=True, linear_num_value_heads=2,
                                               linear_conv_kernel_dim=3),
                     # (its NoPE mode: no rotary embedding on the attention layers)
                     "nope": dict(rope_parameters={"rope_type": "default", "rope_theta": None})}


@pytest.mark.parametrize("case", list(OLMO_HYBRID_CASES))
def test_olmo_hybrid_every_path_and_saves_match_transformers(tmp_path, case):
    """OLMo Hybrid (OlmoHybridForCausalLM): OLMo 3's post-norm attention layers beside pre-norm gated DeltaNet layers
    (separate q / k / v, g, a, b and o projections; beta doubled where linear_allow_neg_eigval; its output norm's eps
    1e-5; no RoPE in its NoPE mode), every path against transformers, saves both ways."""
    hf, ours = delta_pair("OlmoHybridConfig", "OlmoHybridForCausalLM", **{**OLMO_HYBRID, **OLMO_HYBRID_CASES[case]})
    assert ours.config.rope_layers == (case != "nope",) * 3
    layers = ours.model.layers
    assert [type(layer.self_attn) for layer in layers] == [GatedDeltaNet, Attention, GatedDeltaNet]
    assert [layer.post_norms for layer in layers] == [False, True, False]
    assert layers[0].self_attn.spec.beta_scale == (1.0 if case == "plain-biased-tied" else 2.0)
    assert_matches_both_ways(tmp_path, hf, ours)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_olmo_hybrid_pass_gives_the_bits_of_one_token_steps(dtype):
    assert_pass_equals_steps(delta_pair("OlmoHybridConfig", "OlmoHybridForCausalLM", **OLMO_HYBRID)[1], dtype)


def test_olmo_hybrid_config_defaults_and_refusals():
    """OlmoHybridConfig's defaults: its DeltaNet widths from the attention's (heads, 0.75 hidden / heads, twice that),
    every fourth layer attention (the last where fewer than four); its NoPE mode."""
    want = transformers.OlmoHybridConfig()
    d = LlamaConfig.from_dict({"model_type": "olmo_hybrid"}).delta
    assert (d.k_heads, d.v_heads, d.k_dim, d.v_dim, d.kernel, d.beta_scale, d.norm_eps) == (
        want.linear_num_key_heads, want.linear_num_value_heads, want.linear_key_head_dim, want.linear_value_head_dim,
        want.linear_conv_kernel_dim, 2.0, 1e-5)
    assert d.layers == tuple(t == "linear_attention" for t in want.layer_types)
    short = transformers.OlmoHybridConfig(num_hidden_layers=3)
    assert LlamaConfig.from_dict({"model_type": "olmo_hybrid", "num_hidden_layers": 3}).delta.layers == tuple(
        t == "linear_attention" for t in short.layer_types)
    # (a null rope_parameters: transformers' default RoPE; its base null: no RoPE at all)
    assert LlamaConfig.from_dict({"model_type": "olmo_hybrid", "rope_parameters": None}).rope_layers == (True,) * 32
    nope = LlamaConfig.from_dict({"model_type": "olmo_hybrid", "rope_parameters": {"rope_theta": None}})
    assert nope.rope_layers == (False,) * 32 and nope.to_dict()["rope_parameters"]["rope_theta"] is None


@pytest.mark.parametrize("method,opts", [TINY_CASES[i] for i in (2, 6)],
                         ids=[f"{TINY_CASES[i][0]}-{i}" for i in (2, 6)])
def test_olmo_hybrid_greedy_equals_autoregressive(method, opts):
    def tiny_olmo(seed):
        return tiny_family("olmo_hybrid", seed, layers=3, extra={**EXTRA, "linear_allow_neg_eigval": True})
    assert_greedy_equals_autoregressive(tiny_olmo(0), tiny_olmo(1), method, opts)


def write_delta_gguf(path, hf, arch: str, quant=None, legacy=False, meta=None, mtp=False):
    """A GGUF of transformers' ``hf`` (Qwen3.5, Qwen3.5-MoE, Qwen3-Next) as llama.cpp's converter writes it
    (Qwen3_5TextModel, Qwen3_5MoeTextModel, Qwen3NextModel): every norm but the DeltaNet's gated one stored as 1 + w,
    A as -exp(A_log), dt_bias as ssm_dt.bias, the convolution squeezed; qwen35's value heads tiled where key heads serve
    several (value head j of key head g at j * k_heads + g); qwen3next's in_proj_qkvz split into attn_qkv and attn_gate
    (``legacy``: kept as ssm_in, as its first files did); the experts stacked as ffn_*_exps; ssm.* keys and the layer
    interval. ``mtp``: a multi-token prediction block after the model's, as Qwen3.5's newer converter writes it."""
    import numpy as np

    from .test_families import converted_kv, write_converted_gguf

    c = hf.config
    head_dim = c.head_dim
    kv = {**converted_kv(c, rotated=int(head_dim * c.rope_parameters.get("partial_rotary_factor", 0.25))),
          "ssm.conv_kernel": c.linear_conv_kernel_dim, "ssm.state_size": c.linear_key_head_dim,
          "ssm.group_count": c.linear_num_key_heads, "ssm.time_step_rank": c.linear_num_value_heads,
          "ssm.inner_size": c.linear_value_head_dim * c.linear_num_value_heads,
          "full_attention_interval": c.layer_types.index("full_attention") + 1}
    if arch != "qwen35":
        kv.update({"expert_count": c.num_experts, "expert_used_count": c.num_experts_per_tok,
                   "expert_feed_forward_length": c.moe_intermediate_size,
                   "expert_shared_feed_forward_length": c.shared_expert_intermediate_size})
    if arch != "qwen3next":
        kv["rope.dimension_sections"] = [11, 11, 10, 0]
    tensors = {}
    if mtp:  # (block L: an attention block and its nextn.* tensors; block_count counts it)
        L = c.num_hidden_layers
        kv.update(block_count=L + 1, nextn_predict_layers=1)
        g = torch.Generator().manual_seed(9)
        tensors.update({f"blk.{L}.{k}.weight": torch.randn(shape, generator=g).numpy() for k, shape in (
            ("nextn.eh_proj", (c.hidden_size, 2 * c.hidden_size)), ("nextn.enorm", (c.hidden_size,)),
            ("attn_q", (2 * c.num_attention_heads * c.head_dim, c.hidden_size)), ("attn_norm", (c.hidden_size,)))})
    kv.update(meta or {})
    nk, nv = c.linear_num_key_heads, c.linear_num_value_heads
    key_dim, r = nk * c.linear_key_head_dim, nv // nk

    def tiled(t, width=1, dim=0):  # (the converter's _LinearAttentionVReorderBase: grouped -> tiled value heads)
        if arch == "qwen3next" or r == 1:
            return t
        shape = list(t.shape)
        t = t.reshape(shape[:dim] + [nk, r, width] + shape[dim + 1:][:0] + shape[dim + 1:])
        return t.transpose(dim, dim + 1).reshape(shape)

    def convert(name, t):
        i = name.split(".")[2] if name.startswith("model.layers.") else None
        if ".linear_attn." in name:
            part = name.split(".linear_attn.")[1]
            if part in ("in_proj_z.weight", "in_proj_b.weight", "in_proj_a.weight", "A_log", "dt_bias"):
                t = tiled(t, c.linear_value_head_dim if part == "in_proj_z.weight" else 1)
            elif part in ("in_proj_qkv.weight", "conv1d.weight"):
                t = torch.cat([t[:2 * key_dim], tiled(t[2 * key_dim:], c.linear_value_head_dim)])
            elif part == "out_proj.weight":
                t = tiled(t, c.linear_value_head_dim, dim=1)
            if part == "in_proj_qkvz.weight" and not legacy:
                qkvz = t.reshape(nk, -1, t.shape[-1])
                q, k, v, z = (x.reshape(-1, t.shape[-1]) for x in qkvz.split(
                    [c.linear_key_head_dim] * 2 + [r * c.linear_value_head_dim] * 2, dim=1))
                tensors[f"blk.{i}.attn_qkv.weight"] = torch.cat([q, k, v]).numpy()
                tensors[f"blk.{i}.attn_gate.weight"] = z.numpy()
                return None
            if part == "A_log":
                return -torch.exp(t)
            if part == "dt_bias":
                tensors[f"blk.{i}.ssm_dt.bias"] = t.numpy()
                return None
            if part == "conv1d.weight":
                return t.squeeze(1)
            return t
        if name.endswith("norm.weight"):
            return t + 1
        return None if stacked_experts_gguf(tensors, name, t, i) else t

    for name, t in hf.state_dict().items():  # (the tensors written otherwise: into tensors first)
        convert(name, t.detach().float())
    assert all(isinstance(a, np.ndarray) for a in tensors.values())
    return write_converted_gguf(path, hf, arch, kv, tensors=tensors, quant=quant, convert=convert)


GGUF_CASES = {"qwen35": ("qwen35", "Qwen3_5TextConfig", "Qwen3_5ForCausalLM", QWEN3_5, False),
              "qwen35moe": ("qwen35moe", "Qwen3_5MoeTextConfig", "Qwen3_5MoeForCausalLM", NEXT, False),
              "qwen3next": ("qwen3next", "Qwen3NextConfig", "Qwen3NextForCausalLM", NEXT, False),
              "qwen3next-ssm_in": ("qwen3next", "Qwen3NextConfig", "Qwen3NextForCausalLM", NEXT, True),
              # (value heads of 32: ssm_out in blocks, its tiled heads moved block by block)
              "qwen35-block-heads": ("qwen35", "Qwen3_5TextConfig", "Qwen3_5ForCausalLM",
                                     dict(QWEN3_5, linear_value_head_dim=32), False)}


@pytest.mark.parametrize("case", list(GGUF_CASES))
def test_gguf_as_llama_cpp_writes_it(tmp_path, case):
    """qwen35 / qwen35moe / qwen3next files (value heads tiled, norms as 1 + w, A as -exp(A_log), qwen3next's fused
    rows, its older ssm_in) load as the checkpoint: transformers' logits; in Q8_0 / Q5_0 blocks the blocks compute the
    loaded model bitwise; metadata that contradicts itself raises."""
    from triforce.models.loading import read_gguf

    from .test_families import QT, assert_blocks_compute_the_loaded_model, quantizer

    arch, config_class, model_class, kw, legacy = GGUF_CASES[case]
    hf, ours = delta_pair(config_class, model_class, std=0.05, **kw)
    path = write_delta_gguf(tmp_path / "f32.gguf", hf, arch, legacy=legacy)
    loaded = Llama.from_pretrained(path, cache_dir=False)
    assert loaded.config.delta == ours.config.delta and loaded.config.rotary_dim == ours.config.rotary_dim
    ids = torch.randint(0, 101, (2, 30), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        assert (loaded(ids) - hf(ids).logits).abs().max().item() <= TOL
    import numpy as np
    q = write_delta_gguf(tmp_path / "q.gguf", hf, arch, legacy=legacy,
                         quant=quantizer(np.random.default_rng(0), types=(QT.Q8_0, QT.Q5_0)))
    assert_blocks_compute_the_loaded_model(q, ids)
    with pytest.raises(ValueError, match="inner_size"):
        read_gguf(write_delta_gguf(tmp_path / "bad.gguf", hf, arch, meta={"ssm.inner_size": 47}))


def test_gguf_qwen35_multi_token_prediction_block_skipped(tmp_path):
    """A qwen35 file with its multi-token prediction block after the model's (nextn_predict_layers, counted in
    block_count) loads the model's layers only: the file without it, bitwise."""
    hf, _ = delta_pair(std=0.05, **QWEN3_5)
    ids = torch.randint(0, 101, (2, 12), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        plain = Llama.from_pretrained(write_delta_gguf(tmp_path / "a.gguf", hf, "qwen35"), cache_dir=False)(ids)
        loaded = Llama.from_pretrained(write_delta_gguf(tmp_path / "b.gguf", hf, "qwen35", mtp=True), cache_dir=False)
        assert loaded.config.num_hidden_layers == 3 and torch.equal(loaded(ids), plain)


def test_gguf_qwen35_heads_inside_blocks_raise_in_blocks(tmp_path):
    """qwen35's tiled value heads in a quantised ssm_out whose heads are not whole blocks (16 columns of 32) cannot be
    put back in their order in the blocks: gguf_copy raises naming the way out; the float load reads them."""
    import numpy as np

    from triforce.models import gguf_copy

    from .test_families import QT, quantizer

    hf, _ = delta_pair(std=0.05, **dict(QWEN3_5, linear_value_head_dim=16))
    path = write_delta_gguf(tmp_path / "q.gguf", hf, "qwen35", quant=quantizer(np.random.default_rng(0),
                                                                                types=(QT.Q8_0,)))
    loaded = Llama.from_pretrained(path, cache_dir=False)
    with pytest.raises(ValueError, match="whole Q8_0 blocks"):
        gguf_copy(loaded, path)
