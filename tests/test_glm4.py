"""GLM-4 (``model_type="glm4"``): Gemma 3's four norms around the blocks under GLM's names, Llama's RMSNorm, biases on
q, k and v only, RoPE on the first half of each head on adjacent pairs of dims (the checkpoint's q / k dims reordered on
loading, back on saving), the gate and up projections fused in the checkpoint. Against transformers' Glm4ForCausalLM;
GLM-4 of 2024 (``glm``: the same layer with Llama's two norms) against GlmForCausalLM."""
import pytest
import torch

from triforce.models import Llama, LlamaConfig

from .test_engines import TINY_CASES, assert_greedy_equals_autoregressive
from .test_families import TINY, tiny_family, transformers_and_ours
from .test_model import TOL
from .test_sliding_window import assert_every_path_matches, assert_pass_equals_steps

transformers = pytest.importorskip("transformers")

GLM4 = dict(TINY, num_hidden_layers=3, head_dim=16, pad_token_id=None, eos_token_id=None)


def pair(**kw):
    return transformers_and_ours("Glm4", **{**GLM4, **kw})


@pytest.mark.parametrize("kw", [{}, {"attention_bias": False, "tie_word_embeddings": True},
                                {"partial_rotary_factor": 1.0}, {"partial_rotary_factor": 0.25, "head_dim": 32},
                                {"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4,
                                                     "partial_rotary_factor": 0.5}}],
                         ids=["default", "no-bias-tied", "whole-head", "quarter", "linear"])
def test_logits_and_every_path_match_transformers(tmp_path, kw):
    """The plain forward, a chunked prefill, a verify pass, steps and a tree over the cache give transformers'
    logits; the checkpoint we save (GLM's names, its q / k dims in its order, gate and up fused) reads back in
    transformers as the same model, bit for bit, and in ours."""
    hf, ours = pair(**kw)
    c = ours.config
    factor = kw.get("partial_rotary_factor", 0.25 if "head_dim" in kw else 0.5)
    assert c.rotary_dim == int(c.head_dim * factor) and c.rope_interleaved and c.sandwich_norms
    assert c.qkv_bias == kw.get("attention_bias", True) and not c.out_bias
    assert ours.model.layers[0].self_attn.o_proj.bias is None
    assert_every_path_matches(hf, ours)
    ours.save_pretrained(tmp_path)
    from safetensors import safe_open
    with safe_open(tmp_path / "model.safetensors", "pt") as f:
        names = set(f.keys())
    assert names == set(hf.state_dict()) - ({"lm_head.weight"} if c.tie_word_embeddings else set())
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="eager").eval()
    assert type(back).__name__ == "Glm4ForCausalLM"
    assert all(torch.equal(t, hf.state_dict()[k]) for k, t in back.state_dict().items())
    again = Llama.from_pretrained(tmp_path)
    ids = torch.randint(0, 101, (2, 30), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        assert torch.equal(again(ids), ours(ids))


def test_the_layout_and_norms_matter():
    """Each part the tests above check moves the logits by far more than the tolerance when it is wrong: the
    checkpoint's q / k dims read as half-split pairs instead of adjacent ones, the norm GLM names
    post_attention_layernorm taken as the one after the attention (the name Gemma gives that one), a bias on o."""
    from triforce.models.loading import _build, rotary_order

    hf, ours = pair()
    ids = torch.randint(0, 101, (1, 30), generator=torch.Generator().manual_seed(2))
    config = ours.config
    with torch.no_grad():
        ref = hf(ids).logits
        assert (ours(ids) - ref).abs().max().item() <= TOL
        sd = dict(hf.state_dict())
        half = config.replace(extra={**config.extra, "partial_rotary_factor": 0.5})
        order = rotary_order(half)
        assert order[:4].tolist() == [0, 2, 4, 6] and order[8:12].tolist() == [1, 3, 5, 7]
        flat = _build(config, sd, None, None)
        for layer, theirs in zip(flat.model.layers, hf.model.layers):  # the dims as the checkpoint holds them
            for name in ("q_proj", "k_proj"):
                getattr(layer.self_attn, name).weight.copy_(getattr(theirs.self_attn, name).weight)
                getattr(layer.self_attn, name).bias.copy_(getattr(theirs.self_attn, name).bias)
        assert (flat(ids) - ref).abs().max().item() > 10 * TOL
        swapped = _build(config, sd, None, None)
        for layer in swapped.model.layers:
            layer.post_attention_layernorm, layer.pre_feedforward_layernorm = (layer.pre_feedforward_layernorm,
                                                                               layer.post_attention_layernorm)
        assert (swapped(ids) - ref).abs().max().item() > 10 * TOL


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_pass_gives_the_bits_of_one_token_steps(dtype):
    assert_pass_equals_steps(pair()[1], dtype)


def test_defaults_and_bad_configs():
    """A config without the keys takes Glm4Config's defaults (RoPE on half of each head, q/k/v biases, 2 KV heads,
    head_dim 128); an explicit whole-head factor stays one; keys GLM-4 does not read raise."""
    c = LlamaConfig.from_dict({**TINY, "model_type": "glm4", "head_dim": 16})
    want = transformers.Glm4Config(**TINY, head_dim=16)
    assert c.rotary_dim == 8 and c.attention_bias and want.attention_bias and not c.out_bias
    assert c.rms_norm_eps == want.rms_norm_eps and c.rope_theta == want.rope_parameters["rope_theta"]
    d = LlamaConfig.from_dict({"model_type": "glm4"})
    assert (d.num_key_value_heads, d.head_dim, d.rotary_dim, d.pad_token_id) == (2, 128, 64, 151329)
    whole = LlamaConfig.from_dict({**TINY, "model_type": "glm4", "head_dim": 16,
                                   "rope_parameters": {"rope_type": "default", "partial_rotary_factor": 1.0}})
    assert whole.rotary_dim == 16
    for bad, match in (({"mlp_bias": True}, "'mlp_bias'"), ({"partial_rotary_factor": 0.1}, "partial_rotary_factor"),
                       ({"sliding_window": 8}, "'sliding_window'")):
        with pytest.raises(ValueError, match=match):
            LlamaConfig.from_dict({**TINY, "model_type": "glm4", "head_dim": 16, **bad})


def tiny_glm4(seed):
    return tiny_family("glm4", seed, head_dim=16, attention_bias=True)


@pytest.mark.parametrize("method,opts", TINY_CASES, ids=[f"{m}-{i}" for i, (m, _) in enumerate(TINY_CASES)])
def test_greedy_equals_autoregressive(method, opts):
    assert_greedy_equals_autoregressive(tiny_glm4(0), tiny_glm4(1), method, opts)


def test_heads_training_forward_equals_decoding():
    """The Hidden Transfer heads' training forward runs GLM-4's layers (four norms, half-head RoPE) as decoding does."""
    from .test_heads import assert_perturbed_heads_train_as_they_decode

    m = tiny_glm4(0)
    assert_perturbed_heads_train_as_they_decode(m)


@pytest.mark.parametrize("kw", [{}, {"partial_rotary_factor": 1.0, "tie_word_embeddings": True}],
                         ids=["half", "whole-head-tied"])
def test_gguf_as_llama_cpp_writes_it(tmp_path, kw):
    """A glm4 GGUF as llama.cpp's converter writes a Glm4ForCausalLM checkpoint (the gguf package's glm4 names: Gemma's
    for the four norms, gate and up as one ffn_up; q / k rows as the checkpoint holds them; rope.dimension_count the
    rotated dims) gives transformers' logits on the checkpoint; in Q8_0 / Q5_0 blocks, gguf_copy's blocks (split and
    reordered alike) compute bitwise the loaded model, and load_gguf_int8 bitwise gguf_copy's int8 copy."""
    from .test_families import assert_converted_gguf_is_the_checkpoint, converted_kv

    hf, _ = pair(**kw)
    c = hf.config
    kv = converted_kv(c, rotated=int(c.head_dim * c.rope_parameters.get("partial_rotary_factor", 0.5)))
    ours = assert_converted_gguf_is_the_checkpoint(tmp_path, hf, "glm4", kv)
    assert ours.config.model_type == "glm4" and ours.config.rotary_dim == kv["rope.dimension_count"]


# ---- GLM-4 of 2024 (model_type "glm": glm-4-9b-hf, glm-4-9b-chat-hf, glm-edge): GLM-4's layer with Llama's two norms
def glm_pair(**kw):
    return transformers_and_ours("Glm", **{**GLM4, "pad_token_id": 0, **kw})


@pytest.mark.parametrize("kw", [{}, {"attention_bias": False, "tie_word_embeddings": True}],
                         ids=["default", "no-bias-tied"])
def test_glm_2024_every_path_matches_transformers(tmp_path, kw):
    """GlmForCausalLM: every path gives transformers' logits; our save reads back as GlmForCausalLM, bit for bit."""
    hf, ours = glm_pair(**kw)
    c = ours.config
    assert c.model_type == "glm" and not c.sandwich_norms and c.rope_interleaved and c.rotary_dim == 8
    assert c.qkv_bias == kw.get("attention_bias", True) and not c.out_bias
    assert_every_path_matches(hf, ours)
    ours.save_pretrained(tmp_path)
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="eager").eval()
    assert type(back).__name__ == "GlmForCausalLM"
    assert all(torch.equal(t, hf.state_dict()[k]) for k, t in back.state_dict().items())
    d = LlamaConfig.from_dict({"model_type": "glm"})  # (GlmConfig's defaults: glm-4-9b's shape)
    assert (d.num_key_value_heads, d.head_dim, d.rotary_dim, d.attention_bias) == (2, 128, 64, True)


@pytest.mark.parametrize("kw", [{}, {"partial_rotary_factor": 1.0, "attention_bias": False,
                                 "tie_word_embeddings": True}], ids=["half-biased", "whole-head-tied"])
def test_glm_2024_chatglm_gguf_as_llama_cpp_writes_it(tmp_path, kw):
    """A chatglm GGUF (llama.cpp's architecture for ChatGLM2 / 3 and glm-4-9b-chat in THUDM's layout: q, k, v as one
    attn_qkv, rows [q; k; v] with their biases; gate and up as one ffn_up; rope.dimension_count the rotated dims)
    written from a GlmForCausalLM's weights gives transformers' logits on them, read as glm; its blocks compute the
    loaded model bitwise (with TRIFORCE_LLAMA_CPP=1 llama.cpp runs each file too)."""
    from .test_families import assert_converted_gguf_is_the_checkpoint, converted_kv

    hf, ours = glm_pair(**kw)
    c = hf.config
    sd = {k: t.detach().float() for k, t in hf.state_dict().items()}
    tensors = {"token_embd.weight": sd["model.embed_tokens.weight"], "output_norm.weight": sd["model.norm.weight"],
               **({} if c.tie_word_embeddings else {"output.weight": sd["lm_head.weight"]})}
    for i in range(c.num_hidden_layers):
        p, b = f"model.layers.{i}.", f"blk.{i}."
        for kind in ("weight", "bias") if c.attention_bias else ("weight",):
            tensors[f"{b}attn_qkv.{kind}"] = torch.cat([sd[f"{p}self_attn.{x}_proj.{kind}"] for x in "qkv"])
        for theirs, mine in (("attn_norm", "input_layernorm"), ("attn_output", "self_attn.o_proj"),
                             ("ffn_norm", "post_attention_layernorm"), ("ffn_up", "mlp.gate_up_proj"),
                             ("ffn_down", "mlp.down_proj")):
            tensors[f"{b}{theirs}.weight"] = sd[f"{p}{mine}.weight"]
    kv = converted_kv(c, rotated=ours.config.rotary_dim)
    loaded = assert_converted_gguf_is_the_checkpoint(tmp_path, hf, "chatglm", kv, convert=lambda name, t: None,
                                                     tensors={k: t.numpy() for k, t in tensors.items()})
    assert loaded.config.model_type == "glm" and loaded.config.rotary_dim == ours.config.rotary_dim
    assert loaded.config.attention_bias == c.attention_bias


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_glm_2024_pass_gives_the_bits_of_one_token_steps(dtype):
    assert_pass_equals_steps(glm_pair()[1], dtype)


@pytest.mark.parametrize("method,opts", [TINY_CASES[i] for i in (0, 3, 4, 6)],
                         ids=[f"{TINY_CASES[i][0]}-{i}" for i in (0, 3, 4, 6)])
def test_glm_2024_greedy_equals_autoregressive(method, opts):
    assert_greedy_equals_autoregressive(tiny_family("glm", 0, head_dim=16, attention_bias=True),
                                        tiny_family("glm", 1, head_dim=16, attention_bias=True), method, opts)
