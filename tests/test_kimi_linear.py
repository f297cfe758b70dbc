"""Kimi Linear (``model_type="kimi_linear"``: KimiLinearForCausalLM): Kimi Delta Attention layers (the gated delta
rule with a decay per key channel: :class:`~triforce.models.llama.KimiDeltaAttention`) beside DeepSeek-V3's latent
attention without RoPE, V3's mixtures; against transformers, and the KDA state through the caches' steps, trees,
rollbacks and drafts."""
import pytest
import torch

from triforce.models import Llama, LlamaConfig
from triforce.models.llama import KimiDeltaAttention, LatentAttention

from .test_deepseek import random_correction_biases_
from .test_engines import TINY_CASES, assert_greedy_equals_autoregressive
from .test_families import randomize_
from .test_lfm2 import (assert_draft_caches_exact, assert_parts_count, assert_rollbacks_restore_the_state,
                        assert_rows_kept_apart)
from .test_mamba2 import (assert_a_deep_rollback_replays, assert_layer_skip_is_lossless, assert_matches_both_ways,
                          drawn_pair)
from .test_qwen3_5 import assert_as_close_to_float64_as_transformers
from .test_sliding_window import assert_pass_equals_steps

transformers = pytest.importorskip("transformers")

KIMI = dict(vocab_size=101, hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=3,
            num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=16, qk_rope_head_dim=8, v_head_dim=16,
            qk_nope_head_dim=16,
            num_experts=4, num_experts_per_tok=2, linear_head_dim=16, linear_num_heads=2, pad_token_id=0,
            bos_token_id=1, eos_token_id=2, layer_types=["linear_attention", "full_attention", "linear_attention"])
CASES = {"plain": {},
         # (queries through a low rank, two groups of experts, two shared experts, a dense MLP on every layer but the
         # last, 3 taps, not renormalised)
         "low-rank-grouped": dict(q_lora_rank=12, num_expert_group=2, topk_group=1, num_shared_experts=2,
                                  mlp_layer_types=["dense", "dense", "sparse"], linear_conv_kernel_dim=3,
                                  moe_renormalize=False)}


def pair(case="plain", std=0.1):
    """transformers' KimiLinearForCausalLM of ``case`` (its projections drawn at ``std``: at 0.1 float32's rounding
    moves the logits by a few 1e-6 in either implementation, at 0.2 by past TOL in each, which
    test_as_close_to_float64_as_transformers covers; the routers' correction biases drawn) and ours from its config
    and weights."""
    from triforce.models.loading import _build

    hf, _ = drawn_pair("KimiLinear", "self_attn", std=std, **{**KIMI, **CASES[case]})
    with torch.no_grad():
        for key, p in hf.named_parameters():
            if key.endswith("dt_bias"):
                p.normal_(0, 0.5)
        for key, b in hf.named_buffers():
            if key.endswith("e_score_correction_bias"):
                b.normal_(0, 0.1)
    return hf, _build(LlamaConfig.from_dict(hf.config.to_dict()), hf.state_dict(), None, None)


def tiny(seed, types=("linear_attention", "full_attention", "linear_attention")):
    """A tiny random Kimi Linear model (vocabulary 64, hidden 32; KDA layers of 2 heads of 8; a latent attention of 4
    heads over 16 + 8; 2 of 4 experts from the second layer on)."""
    torch.manual_seed(seed)
    extra = dict(kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=8, n_routed_experts=4,
                 num_experts_per_tok=2, moe_intermediate_size=24, n_shared_experts=1, linear_head_dim=8,
                 linear_num_heads=2, layer_types=list(types))
    config = LlamaConfig(model_type="kimi_linear", vocab_size=64, hidden_size=32, intermediate_size=48,
                         num_hidden_layers=len(types), num_attention_heads=4, max_position_embeddings=1024,
                         initializer_range=0.3, extra=extra)
    return random_correction_biases_(randomize_(Llama(config), seed).eval(), std=0.3)


@pytest.mark.parametrize("case", list(CASES))
def test_every_path_and_saves_match_transformers(tmp_path, case):
    """Every path (a plain forward, a chunked prefill, a verify pass, one-token steps, a tree whose branches each run
    the state from their own parent) gives transformers' logits; saves both ways."""
    hf, ours = pair(case)
    kinds = [type(layer.self_attn) for layer in ours.model.layers]
    assert kinds == [KimiDeltaAttention, LatentAttention, KimiDeltaAttention]
    assert ours.config.kv_heads_per_layer == (0, 1, 0) and not any(ours.config.rope_layers)
    assert ours.config.delta.channel_decay and ours.config.experts.layers == (
        (False, True, True) if case == "plain" else (False, False, True))
    assert_matches_both_ways(tmp_path, hf, ours)


def test_as_close_to_float64_as_transformers():
    """Drawn at 0.2, where float32's rounding alone moves the logits past TOL: ours stay as close to transformers'
    model in float64 as transformers' own float32 forward (its chunked form, and its one-token recurrent form run over
    the whole input), within a factor of 1.5 (measured: ours 1.5e-5, its chunked form 2.9e-5, its recurrence
    1.3e-5)."""
    from transformers.models.kimi_linear import modeling_kimi_linear as theirs

    hf, ours = pair(std=0.2)
    assert_as_close_to_float64_as_transformers(hf, ours, theirs, "chunk_kimi_delta_attention",
                                               "recurrent_kimi_delta_attention")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_pass_gives_the_bits_of_one_token_steps(dtype):
    assert_pass_equals_steps(pair()[1], dtype)


def test_each_part_moves_the_logits():
    """The forget gate's A_log, dt_bias and low rank, beta's projection, the convolution, the output norm and its
    gate: each counts; so does the state a cached step starts from."""
    hf, ours = pair()
    ids = torch.randint(0, 101, (2, 16), generator=torch.Generator().manual_seed(4))
    m = ours.model.layers[0].self_attn
    fg = m.forget_gate
    assert_parts_count(hf, ours, ids, (fg.A_log, fg.dt_bias, fg.f_b_proj.weight, m.b_proj.weight, m.conv1d.weight,
                                       m.o_norm.weight, m.g_b_proj.weight), lambda cache: cache.ssm[0].zero_())


def test_the_decay_is_per_key_channel():
    """The forget gate's decay differs across a head's key channels (its dt_bias per channel): a model whose decays
    were one per head (each channel's replaced by its head's mean) computes other logits."""
    hf, ours = pair()
    ids = torch.randint(0, 101, (1, 12), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ref = ours(ids)
        fg = ours.model.layers[0].self_attn.forget_gate
        fg.dt_bias.copy_(fg.dt_bias.view(2, 16).mean(1, keepdim=True).expand(2, 16).reshape(-1))
        fg.f_b_proj.weight.copy_(fg.f_b_proj.weight.view(2, 16, -1).mean(1, keepdim=True).expand(2, 16, -1)
                                 .reshape(32, -1))
        assert (ours(ids) - ref).abs().max() > 1e-3


def test_rollbacks_drafts_and_rows_keep_the_state():
    """Rollbacks (past checkpoints: replayed with each token's per-channel decays), a tree's commit_path, ragged rows
    and row selection, and (on a KDA-only model) StreamingLLM and retrieval caches: bitwise."""
    model = tiny(0)
    ids, want = assert_rollbacks_restore_the_state(model, length=42)
    assert_a_deep_rollback_replays(model, ids, want)
    assert_rows_kept_apart(model)
    assert_draft_caches_exact(tiny(3, types=("linear_attention", "linear_attention")))


@pytest.mark.parametrize("method,opts", [TINY_CASES[i] for i in (0, 2, 3, 4, 6)],
                         ids=[f"{TINY_CASES[i][0]}-{i}" for i in (0, 2, 3, 4, 6)])
def test_greedy_equals_autoregressive(method, opts):
    assert_greedy_equals_autoregressive(tiny(0), tiny(1), method, opts)


def test_layer_skip_draft_is_lossless():
    assert_layer_skip_is_lossless(tiny(0))


def test_config_reads_as_transformers_reads_it():
    """KimiLinearConfig's defaults and names (num_experts, num_experts_per_token, moe_renormalize, model_max_length,
    ...), its checkpoints' linear_attn_config (1-based layer lists) and first_k_dense_replace; bad values refused;
    to_dict writes its names back."""
    want = transformers.KimiLinearConfig()
    c = LlamaConfig.from_dict(want.to_dict())
    d, m, e = c.delta, c.mla, c.experts
    assert (d.k_heads, d.k_dim, d.kernel, d.layers) == (want.linear_num_heads, want.linear_head_dim,
                                                        want.linear_conv_kernel_dim,
                                                        tuple(t == "linear_attention" for t in want.layer_types))
    assert (m.kv_lora_rank, m.qk_rope_head_dim, m.v_head_dim, m.q_lora_rank) == (512, 64, 128, None)
    assert (e.count, e.top_k, e.layers) == (want.num_experts, want.num_experts_per_token,
                                           tuple(t == "sparse" for t in want.mlp_layer_types))
    assert c.max_position_embeddings == want.model_max_length and c.attention_scale == (128 + 64) ** -0.5
    back = c.to_dict()
    assert back["num_experts"] == want.num_experts and "n_routed_experts" not in back
    checkpoint = {"model_type": "kimi_linear", "num_hidden_layers": 4, "first_k_dense_replace": 2,
                  "linear_attn_config": {"full_attn_layers": [2, 4], "kda_layers": [1, 3], "num_heads": 8,
                                         "head_dim": 64, "short_conv_kernel_size": 3}}
    c = LlamaConfig.from_dict(checkpoint)
    assert c.delta.layers == (True, False, True, False) and (c.delta.k_heads, c.delta.k_dim, c.delta.kernel) == (
        8, 64, 3)
    assert c.experts.layers == (False, False, True, True)
    hf = transformers.KimiLinearConfig(**{k: v for k, v in checkpoint.items() if k != "model_type"})
    assert hf.layer_types == ["linear_attention", "full_attention", "linear_attention", "full_attention"]
    for bad, match in (({"linear_attn_config": {"num_heads": 2, "other": 1}}, "linear_attn_config"),
                       ({"linear_attn_config": {"full_attn_layers": [1], "kda_layers": [1]}}, "number each"),
                       ({"linear_head_dim": 0}, "linear_head_dim"), ({"scoring_func": "softmax"}, "scoring_func")):
        with pytest.raises(ValueError, match=match):
            LlamaConfig.from_dict({"model_type": "kimi_linear", "num_hidden_layers": 4, **bad})


def test_moonshotai_checkpoint_layout_loads(tmp_path):
    """moonshotai's checkpoint layout (the forget gate's weights under self_attn, q / k / v convolutions apart, the
    mixture under block_sparse_moe with each expert's w1 / w3 / w2), which transformers converts on loading: ours reads
    it to the bitwise logits of the model built from transformers' layout, and transformers reads it to the same
    weights."""
    from safetensors.torch import save_file

    hf, ours = pair()
    original = {}
    for name, t in hf.state_dict().items():
        t = t.detach().clone()
        name = name.replace(".forget_gate.", ".")
        if name.endswith("self_attn.conv1d.weight"):
            for part, w in zip("qkv", t.chunk(3)):
                original[name.replace("conv1d", f"{part}_conv1d")] = w.clone()
            continue
        if ".mlp.experts." in name:
            stem = name.replace(".mlp.experts.", ".block_sparse_moe.experts.").rsplit(".", 1)[0]
            for e, w in enumerate(t):
                if name.endswith("gate_up_proj"):
                    gate, up = w.chunk(2)
                    original[f"{stem}.{e}.w1.weight"], original[f"{stem}.{e}.w3.weight"] = gate.clone(), up.clone()
                else:
                    original[f"{stem}.{e}.w2.weight"] = w.clone()
            continue
        if ".mlp.gate." in name or ".mlp.shared_experts." in name:
            name = name.replace(".mlp.", ".block_sparse_moe.")
        original[name] = t
    assert any("w1.weight" in k for k in original) and any("q_conv1d" in k for k in original)
    hf.config.save_pretrained(tmp_path)
    save_file(original, tmp_path / "model.safetensors", metadata={"format": "pt"})
    ids = torch.randint(0, 101, (2, 16), generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        assert torch.equal(Llama.from_pretrained(tmp_path)(ids), ours(ids))
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="eager").eval()
    theirs = hf.state_dict()
    assert all(torch.equal(t, theirs[k]) for k, t in back.state_dict().items())


def test_gguf_kimi_linear_as_llama_cpp_writes_it(tmp_path):
    """A kimi-linear GGUF (KimiLinearModel's converter: head_count_kv per layer, 0 on the KDA layers and 1 on the latent
    attention's; kda.head_dim, ssm.conv_kernel; deepseek2's latent keys and mixture keys, no value_length, no
    expert_weights_norm (llama.cpp renormalises always); the three convolutions apart, A as -exp(A_log), the forget
    gate's low rank as ssm_f_a / ssm_f_b, dt_bias as ssm_dt.bias, kv_b_proj split per head) loads with transformers'
    logits; Q8_0 / Q5_0 blocks bitwise."""
    import dataclasses

    from .test_families import assert_gguf_file_loads, stacked_expert_tensors, write_stacked_experts_gguf

    hf, ours = pair()
    c = hf.config
    R, r, H, nope, v = c.kv_lora_rank, c.qk_rope_head_dim, c.num_attention_heads, c.qk_nope_head_dim, c.v_head_dim
    kv = {"context_length": c.model_max_length, "embedding_length": c.hidden_size,
          "feed_forward_length": c.intermediate_size, "block_count": c.num_hidden_layers,
          "attention.head_count": H, "attention.head_count_kv": [int(t == "full_attention") for t in c.layer_types],
          "attention.layer_norm_rms_epsilon": float(c.rms_norm_eps), "vocab_size": c.vocab_size,
          "leading_dense_block_count": c.mlp_layer_types.index("sparse"),
          "expert_feed_forward_length": c.moe_intermediate_size, "expert_count": c.num_experts,
          "expert_used_count": c.num_experts_per_token, "expert_shared_count": c.num_shared_experts,
          "expert_weights_scale": float(c.routed_scaling_factor), "expert_gating_func": 2,
          "expert_group_used_count": c.topk_group, "attention.kv_lora_rank": R, "rope.dimension_count": r,
          "attention.key_length": R + r, "attention.key_length_mla": nope + r, "attention.value_length_mla": v,
          "ssm.conv_kernel": c.linear_conv_kernel_dim, "kda.head_dim": c.linear_head_dim}

    def special(name, t, i):
        if name.endswith("kv_b_proj.weight"):
            k_b, v_b = t.view(H, nope + v, R).split([nope, v], dim=1)
            return {f"blk.{i}.attn_k_b.weight": k_b.transpose(1, 2), f"blk.{i}.attn_v_b.weight": v_b}
        if name.endswith("self_attn.conv1d.weight"):
            return {f"blk.{i}.ssm_conv1d_{p}.weight": w.reshape(1, -1, 1, w.shape[-1])
                    for p, w in zip("qkv", t.chunk(3))}
        part = {"forget_gate.f_a_proj.weight": "ssm_f_a.weight", "forget_gate.f_b_proj.weight": "ssm_f_b.weight",
                "forget_gate.dt_bias": "ssm_dt.bias", "forget_gate.A_log": "ssm_a"}
        key = next((k for k in part if name.endswith(k)), None)
        if key is None:
            return None
        return {f"blk.{i}.{part[key]}": -torch.exp(t) if key.endswith("A_log") else t}

    tensors = stacked_expert_tensors(hf, "kimi-linear", special)
    assert "blk.0.ssm_conv1d_q.weight" in tensors and "blk.1.attn_k_b.weight" in tensors
    loaded = assert_gguf_file_loads(hf, lambda path, quant: write_stacked_experts_gguf(
        path, hf, "kimi-linear", kv, tensors=tensors, quant=quant), tmp_path, 101)
    assert loaded.config.model_type == "kimi_linear" and loaded.config.delta == ours.config.delta
    got, want = loaded.config.experts, ours.config.experts  # (the file's scale a float32; no groups: one group)
    assert loaded.config.mla == ours.config.mla and got.scale == pytest.approx(want.scale, rel=1e-6)
    assert dataclasses.replace(got, scale=want.scale, groups=want.groups) == want and want.groups == (1, 1)
