"""StableLM (``model_type="stablelm"``: stablelm-2-1_6b / zephyr, stablelm-2-12b, stablelm-3b-4e1t, stablelm-zephyr-3b):
Llama's gated MLP on torch's LayerNorm with a bias, RoPE on the first ``partial_rotary_factor`` (0.25) of each head,
q / k / v biases by ``use_qkv_bias``, the attention and the MLP in parallel on one norm with ``use_parallel_residual``,
per-head q / k LayerNorms with ``qk_layernorm`` (12B's). Against transformers' StableLmForCausalLM, and from GGUF as
llama.cpp's converter writes it."""
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from triforce.models import LlamaConfig
from triforce.models.llama import MLP, BiasLayerNorm, LayerNorm

from .test_engines import TINY_CASES, assert_greedy_equals_autoregressive
from .test_families import TINY, assert_saved_reads_back, tiny_family, transformers_and_ours
from .test_sliding_window import assert_every_path_matches, assert_pass_equals_steps

transformers = pytest.importorskip("transformers")

BASE = {k: v for k, v in TINY.items() if k != "rms_norm_eps"} | {"num_hidden_layers": 3}
CASES = {"quarter-rope": {}, "qkv-bias-parallel-half": dict(use_qkv_bias=True, use_parallel_residual=True,
                                                            partial_rotary_factor=0.5),
         "tied": dict(tie_word_embeddings=True),
         "12b-qk-layernorm": dict(qk_layernorm=True, use_parallel_residual=True, partial_rotary_factor=0.5)}


def pair(case="quarter-rope", **kw):
    """transformers' StableLmForCausalLM of ``case`` (random weights, biases and norms randomised) and ours."""
    return transformers_and_ours("StableLm", **{**BASE, **CASES[case], **kw})


@pytest.mark.parametrize("case", list(CASES))
def test_logits_and_every_path_match_transformers(tmp_path, case):
    """Every path gives transformers' logits (the LayerNorms, partial RoPE, the q / k / v biases, the parallel block,
    the per-head q / k LayerNorms, stacked ``[heads, head_dim]`` and reordered with the RoPE'd dims); the checkpoint we
    save (the per-head norms apart again) reads back in transformers as the same model."""
    hf, ours = pair(case)
    c, layer = ours.config, ours.model.layers[0]
    assert type(layer.mlp) is MLP and type(layer.input_layernorm) is BiasLayerNorm
    att = layer.self_attn
    assert (att.q_norm is None) == (not hf.config.qk_layernorm)
    if att.q_norm is not None:
        assert type(att.q_norm) is LayerNorm
        assert (att.q_norm.weight.shape, att.k_norm.weight.shape) == ((4, 16), (2, 16))
    assert (c.qkv_bias, c.out_bias, c.parallel_block) == (hf.config.use_qkv_bias, False,
                                                          hf.config.use_parallel_residual)
    assert_every_path_matches(hf, ours)
    assert_saved_reads_back(tmp_path, hf, ours)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_pass_gives_the_bits_of_one_token_steps(dtype):
    assert_pass_equals_steps(pair("qkv-bias-parallel-half")[1], dtype)


def test_defaults_and_bad_configs():
    """A config without the keys takes StableLmConfig's (a quarter of each head RoPE'd, no biases, two norms a layer,
    no q / k norms, eps by layer_norm_eps); other bias keys raise."""
    c = LlamaConfig.from_dict({**BASE, "model_type": "stablelm", "layer_norm_eps": 1e-6, "hidden_dropout": 0.1})
    assert (c.rotary_dim, c.rms_norm_eps, c.qkv_bias, c.parallel_block, c.qk_norm) == (4, 1e-6, False, False, False)
    assert LlamaConfig.from_dict(c.to_dict()).to_dict() == c.to_dict()
    for bad, match in (({"qk_layernorm": 1}, "'qk_layernorm'"), ({"attention_bias": True}, "'attention_bias'"),
                       ({"use_parallel_residual": 1}, "'use_parallel_residual'")):
        with pytest.raises(ValueError, match=match):
            LlamaConfig.from_dict({**BASE, "model_type": "stablelm", **bad})


def tiny_stablelm(seed):
    return tiny_family("stablelm", seed, extra={"use_qkv_bias": True, "use_parallel_residual": seed == 0})


@pytest.mark.parametrize("method,opts", TINY_CASES, ids=[f"{m}-{i}" for i, (m, _) in enumerate(TINY_CASES)])
def test_greedy_equals_autoregressive(method, opts):
    assert_greedy_equals_autoregressive(tiny_stablelm(0), tiny_stablelm(1), method, opts)


@pytest.mark.parametrize("case", list(CASES))
def test_gguf_as_llama_cpp_writes_it(tmp_path, case):
    """A stablelm GGUF as llama.cpp's converter writes it (the LayerNorms' biases; q / k / v biases where the checkpoint
    has them; rope.dimension_count the RoPE'd dims, NEOX RoPE; use_parallel_residual, and no ffn_norm where it is
    true, which is what llama.cpp reads; 12B's per-head q / k norms stacked as attn_q_norm / attn_k_norm) gives
    transformers' logits; its blocks compute the loaded model bitwise."""
    from .test_families import assert_converted_gguf_is_the_checkpoint

    hf, ours = pair(case)
    loaded = assert_converted_gguf_is_the_checkpoint(tmp_path, hf, "stablelm", *converted(hf, ours))
    c = loaded.config
    assert (c.model_type, c.rotary_dim, c.qkv_bias, c.parallel_block, c.qk_norm) == (
        "stablelm", ours.config.rotary_dim, ours.config.qkv_bias, ours.config.parallel_block, ours.config.qk_norm)


def converted(hf, ours):
    """``(kv, convert, tensors)`` of llama.cpp's converter for StableLM ``hf``: its metadata, and 12B's per-head q / k
    norms stacked into one ``[heads, head_dim]`` tensor each (attn_q_norm / attn_k_norm), the per-head ones left out."""
    from .test_families import converted_kv

    kv = converted_kv(hf.config, rotated=ours.config.rotary_dim, eps_key="attention.layer_norm_epsilon")
    kv["use_parallel_residual"] = hf.config.use_parallel_residual
    sd, tensors = hf.state_dict(), {}
    for i in range(hf.config.num_hidden_layers) if hf.config.qk_layernorm else ():
        for p, heads in (("q", hf.config.num_attention_heads), ("k", hf.config.num_key_value_heads)):
            tensors[f"blk.{i}.attn_{p}_norm.weight"] = torch.stack([
                sd[f"model.layers.{i}.self_attn.{p}_layernorm.norms.{h}.weight"] for h in range(heads)]).float().numpy()
    return kv, (lambda name, t: None if "_layernorm.norms." in name else t), tensors


@given(data=st.data())
def test_drawn_checkpoints_and_their_gguf_files_load_as_transformers_model(data):
    """Property: a drawn tiny StableLM checkpoint (RoPE on a quarter, half or all of each head of 8 / 16 / 32 over 1,
    2 or 4 KV heads; q / k / v biases or none; the parallel block or two norms; per-head q / k LayerNorms or none;
    tied or not) gives transformers' logits on 32 tokens, a 6-token pass the bits of its steps, and its GGUF (float32:
    transformers' logits; Q8_0 / Q5_0 blocks: the loaded model bitwise)."""
    from .test_families import assert_drawn_checkpoint_loads, write_converted_gguf

    draw = data.draw
    heads = 64 // draw(st.sampled_from([8, 16, 32]))
    kw = dict(BASE, num_attention_heads=heads, num_key_value_heads=min(heads, draw(st.sampled_from([1, 2, 4]))),
              partial_rotary_factor=draw(st.sampled_from([0.25, 0.5, 1.0])), use_qkv_bias=draw(st.booleans()),
              use_parallel_residual=draw(st.booleans()), tie_word_embeddings=draw(st.booleans()), num_hidden_layers=2,
              qk_layernorm=draw(st.booleans()))
    hf, ours = transformers_and_ours("StableLm", **kw)
    kv, convert, tensors = converted(hf, ours)
    assert_drawn_checkpoint_loads(draw, hf, ours, lambda path, quant: write_converted_gguf(
        path, hf, "stablelm", kv, quant=quant, convert=convert, tensors=tensors))


def test_gguf_norms_stored_in_blocks(tmp_path):
    """A file whose per-head q / k norms are themselves in Q8_0 blocks (llama.cpp's quantize keeps norms in float;
    another tool might not): the norms load dequantised, and gguf_copy takes blocks of the projections only, which
    compute the loaded model bitwise (a norm's blocks taken as a projection's rows raised before)."""
    import gguf

    from .test_families import assert_blocks_compute_the_loaded_model, write_converted_gguf

    hf, ours = pair("12b-qk-layernorm", hidden_size=128)  # (head_dim 32: a norm's row is one Q8_0 block)

    def quant(name, t):
        if t.ndim == 2 and t.shape[1] % 32 == 0:
            return gguf.quants.quantize(t, gguf.GGMLQuantizationType.Q8_0), gguf.GGMLQuantizationType.Q8_0
        return t, None
    kv, convert, tensors = converted(hf, ours)
    path = write_converted_gguf(tmp_path / "q.gguf", hf, "stablelm", kv, quant=quant, convert=convert, tensors=tensors)
    kinds = {t.name: t.tensor_type.name for t in gguf.GGUFReader(str(path)).tensors}
    assert kinds["blk.0.attn_q_norm.weight"] == kinds["blk.0.attn_k_norm.weight"] == "Q8_0"
    ids = torch.randint(0, 101, (2, 24), generator=torch.Generator().manual_seed(2))
    assert_blocks_compute_the_loaded_model(path, ids)
