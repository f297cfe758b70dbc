"""Llama 4's language model (``model_type="llama4_text"``: Llama4ForCausalLM, the text half of Llama 4 Scout /
Maverick, and Llama4ForConditionalGeneration's checkpoints read text-only): RoPE on adjacent pairs in float32, the RoPE
layers' chunked attention (``attention_chunk_size``) and q/k L2 norms after RoPE, the NoPE layers' query temperature,
mixtures whose chosen experts take the token times the sigmoid of its router logit beside a shared expert, dense
layers of ``intermediate_size_mlp``; against transformers' Llama4ForCausalLM."""
import json

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from triforce.models import FullCache, Llama, LlamaConfig
from triforce.models.llama import MLP, SparseMoE

from .test_engines import TINY_CASES, assert_greedy_equals_autoregressive
from .test_families import TOL, assert_save_loads, assert_saved_reads_back, randomize_, tiny_family
from .test_sliding_window import assert_every_path_matches, assert_pass_equals_steps

transformers = pytest.importorskip("transformers")

BASE = dict(vocab_size=101, hidden_size=64, intermediate_size=32, intermediate_size_mlp=48, num_hidden_layers=4,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_local_experts=4, num_experts_per_tok=1,
            interleave_moe_layer_step=2, attention_chunk_size=7, floor_scale=8, attn_scale=0.5,
            max_position_embeddings=128, rms_norm_eps=1e-5, rope_parameters={"rope_type": "default",
                                                                              "rope_theta": 10000.0})
CASES = {
    # chunks of 7 positions on layers 0-2, layer 3 NoPE with its temperature from position 7 on, mixtures on 1 and 3
    "default": {},
    # no q/k norms nor temperature, two experts a token, mixtures listed, the NoPE layers listed, biases, a tied head,
    # Llama 3's RoPE scaling
    "listed-top2-biased-tied": dict(use_qk_norm=False, attn_temperature_tuning=False, num_experts_per_tok=2,
                                    moe_layers=[0, 2], no_rope_layers=[1, 0, 1, 1], attention_bias=True,
                                    tie_word_embeddings=True, attention_chunk_size=5,
                                    rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                                     "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                     "original_max_position_embeddings": 16}),
    # MobileLLM-R1's shape (llama4_text, dense): no experts, no mixture layer, every layer full attention with RoPE
    # and q/k norms, no temperature
    "dense-mobilellm": dict(num_local_experts=0, num_experts_per_tok=0, moe_layers=[], interleave_moe_layer_step=0,
                            layer_types=["full_attention"] * 4, no_rope_layers=[1] * 4, attn_temperature_tuning=False,
                            tie_word_embeddings=True),
}


def pair(case="default", **kw):
    """transformers' Llama4ForCausalLM of ``case`` (random weights, biases and norms randomised) and ours."""
    from triforce.models.loading import _build

    torch.manual_seed(0)
    config = transformers.Llama4TextConfig(**{**BASE, **CASES[case], **kw}, attn_implementation="eager")
    hf = randomize_(transformers.Llama4ForCausalLM(config).eval())
    return hf, _build(LlamaConfig.from_dict(hf.config.to_dict()), hf.state_dict(), None, None)


@pytest.mark.parametrize("case", list(CASES))
def test_logits_and_every_path_match_transformers(tmp_path, case):
    """Every path gives transformers' logits on 40 tokens (chunks crossed by the chunked prefill, a verify pass and a
    tree's branch); the checkpoint we save (feed_forward.*, the experts stacked, the RoPE pairs adjacent again) reads
    back in transformers as the same model."""
    hf, ours = pair(case)
    c, layers = ours.config, ours.model.layers
    want = hf.config
    assert c.layer_chunks == tuple(want.attention_chunk_size if t == "chunked_attention" else 0
                                   for t in want.layer_types)
    assert c.rope_layers == tuple(bool(x) for x in want.no_rope_layers)
    assert [type(layer.mlp) for layer in layers] == [SparseMoE if i in want.moe_layers else MLP for i in range(4)]
    assert [layer.self_attn.l2_eps is not None for layer in layers] == [
        want.use_qk_norm and bool(r) for r in want.no_rope_layers]
    assert [layer.self_attn.nope_temperature is not None for layer in layers] == [
        want.attn_temperature_tuning and not r for r in want.no_rope_layers]
    assert_every_path_matches(hf, ours)
    assert_saved_reads_back(tmp_path, hf, ours)


def test_each_part_moves_the_logits():
    """The chunks, the q/k norms, the temperature and the experts' scaled inputs are each read: with any one of them
    dropped the logits on 40 tokens are no longer transformers'."""
    hf, ours = pair()
    ids = torch.randint(0, 101, (2, 40), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        ref = hf(ids).logits
        assert (ours(ids) - ref).abs().max() <= TOL
        for attr, off in (("chunk", 0), ("l2_eps", None), ("nope_temperature", None)):
            kept = [layer.self_attn.__dict__[attr] for layer in ours.model.layers]
            for layer in ours.model.layers:
                layer.self_attn.__dict__[attr] = off
            assert (ours(ids) - ref).abs().max() > 1e-3, attr
            for layer, k in zip(ours.model.layers, kept):
                layer.self_attn.__dict__[attr] = k
        moe = ours.model.layers[1].mlp
        moe.scaled_inputs = False  # (the weights then on the outputs: SwiGLU is not linear in its input)
        assert (ours(ids) - ref).abs().max() > 1e-3
        moe.scaled_inputs = True
        cache = FullCache(ours.config, 2, 64)
        cache.chunks = (0,) * 4  # (a full cache that forgot the chunks)
        assert (ours(ids, cache=cache) - ref).abs().max() > 1e-3


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_pass_gives_the_bits_of_one_token_steps(dtype):
    """A 10-token pass after a 20-token prefill crosses the chunk boundary at 21 and 28 (chunks of 7) and runs the
    NoPE layer's temperature past position 7: bitwise its one-token steps."""
    assert_pass_equals_steps(pair()[1], dtype)


def _reference_chunked(q, k, v, starts, positions, mask, chunk, scale):
    """float64 attention of ``q`` ``[B, T, Hq, D]`` over ``k``, ``v`` ``[B, N, Hkv, D]`` (row b's prefix ``starts[b]``
    slots, its T new tokens after it): query t at position p sees the prefix slots and the new tokens (by ``mask``
    ``[B, T, T]``) at positions ``>= p - p % chunk``."""
    B, T, H, D = q.shape
    g = H // k.shape[2]
    out = torch.zeros(B, T, H, D, dtype=torch.float64)
    for b in range(B):
        s = int(starts[b])
        key_pos = torch.cat([torch.arange(s), positions[b]])
        for t in range(T):
            p = int(positions[b, t])
            seen = key_pos >= p - p % chunk
            seen[s:] &= mask[b, t]
            kk, vv = k[b, : s + T].double()[seen], v[b, : s + T].double()[seen]
            for h in range(H):
                w = torch.softmax(kk[:, h // g] @ q[b, t, h].double() * scale, 0)
                out[b, t, h] = w @ vv[:, h // g]
    return out


@settings(deadline=None, max_examples=25)
@given(chunk=st.integers(1, 9), T=st.integers(1, 12), tree=st.booleans(), same=st.booleans(),
       starts=st.lists(st.integers(0, 30), min_size=2, max_size=2), seed=st.integers(0, 2**31 - 1))
def test_chunked_attention_matches_its_definition(chunk, T, tree, same, starts, seed):
    """A full cache's chunked layer (``cache.chunked_attention``: one call, a run of queries per chunk, or the masked
    calls of trees and rows of different lengths): each query sees only its own chunk's earlier positions (a tree node
    its ancestors' there), as a float64 statement of the rule says."""
    from triforce.models.cache import TokenTree

    if same:
        starts = [starts[0]] * 2
    g = torch.Generator().manual_seed(seed)
    config = LlamaConfig(model_type="llama4_text", vocab_size=16, hidden_size=32, intermediate_size=16,
                         num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                         max_position_embeddings=64, extra={"attention_chunk_size": chunk, "intermediate_size_mlp": 16})
    cache = FullCache(config, 2, 48)
    cache.k[0].normal_(generator=g)
    cache.v[0].normal_(generator=g)
    cache.lengths.copy_(torch.tensor(starts, dtype=torch.int32))
    cache._bound = max(starts)
    parents = None
    if tree:
        parents = torch.tensor([[-1] + [int(torch.randint(0, t, (1,), generator=g)) for t in range(1, T)]] * 2)
        parents = TokenTree(parents)
    step = cache.begin(T, tree_parents=parents)
    q = torch.randn(2, T, 4, 8, generator=g)
    new_k, new_v = torch.randn(2, T, 2, 8, generator=g), torch.randn(2, T, 2, 8, generator=g)
    out = cache.attend(0, q, new_k, new_v, step)
    mask = parents.mask if tree else torch.ones(T, T, dtype=torch.bool).tril().expand(2, T, T)
    want = _reference_chunked(q, cache.k[0], cache.v[0], starts, step.positions, mask, chunk, 8 ** -0.5)
    assert (out.double() - want).abs().max() < 1e-5


def test_config_keys_and_defaults():
    """Llama4TextConfig's defaults (Scout's shape: 16 experts, every layer a mixture, chunks of 8192, NoPE every 4th
    layer) and its keys read; keys it would read otherwise, or values transformers refuses, raise."""
    c, want = LlamaConfig.from_dict({"model_type": "llama4_text"}), transformers.Llama4TextConfig()
    assert (c.vocab_size, c.hidden_size, c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads,
            c.head_dim) == (want.vocab_size, want.hidden_size, want.num_hidden_layers, want.num_attention_heads,
                            want.num_key_value_heads, want.head_dim)
    assert (c.intermediate_size, c.dense_intermediate_size) == (want.intermediate_size, want.intermediate_size_mlp)
    assert (c.max_position_embeddings, c.rms_norm_eps, c.rope_theta, c.bos_token_id, c.eos_token_id,
            c.tie_word_embeddings) == (want.max_position_embeddings, want.rms_norm_eps,
                                       want.rope_parameters["rope_theta"], want.bos_token_id, want.eos_token_id,
                                       want.tie_word_embeddings)
    assert c.rope_layers == tuple(bool(x) for x in want.no_rope_layers)
    assert c.layer_chunks == tuple(8192 if t == "chunked_attention" else 0 for t in want.layer_types)
    assert c.experts.layers == tuple(i in want.moe_layers for i in range(48)) and c.experts.count == 16
    assert c.nope_temperature == (want.attn_scale, want.floor_scale) and c.l2_qk_norm == c.rope_layers
    back = LlamaConfig.from_dict(c.to_dict())
    assert back.to_dict() == c.to_dict() and c.to_dict()["architectures"] == ["Llama4ForCausalLM"]
    assert LlamaConfig.from_dict({"model_type": "llama4_text", "num_hidden_layers": 4,
                                  "no_rope_layers": []}).rope_layers == (True, True, True, False)
    for extra, match in (({"layer_types": ["sliding_attention"] * 48}, "layer_types"),
                         ({"attention_chunk_size": None}, "attention_chunk_size"),
                         ({"sliding_window": 4096}, "sliding_window"), ({"moe_layers": [48]}, "moe_layers"),
                         ({"no_rope_layers": [1, 0]}, "no_rope_layers"), ({"num_experts_per_tok": 17}, "17"),
                         ({"mlp_bias": True}, "mlp_bias"), ({"floor_scale": 0}, "floor_scale"),
                         ({"num_local_experts": 0}, "num_local_experts"),  # (0 experts with mixture layers)
                         ({"interleave_moe_layer_step": 0}, "interleave_moe_layer_step")):  # (0 without moe_layers)
        with pytest.raises(ValueError, match=match):
            LlamaConfig.from_dict({"model_type": "llama4_text", **extra})
    dense = LlamaConfig.from_dict({"model_type": "llama4_text", "num_local_experts": 0, "num_experts_per_tok": 0,
                                   "moe_layers": [], "interleave_moe_layer_step": 0})  # (MobileLLM-R1's: dense)
    assert dense.experts is None and dense.dense_intermediate_size == want.intermediate_size_mlp


@pytest.mark.parametrize("method,opts", [TINY_CASES[i] for i in (0, 3, 4, 6)],
                         ids=[f"{TINY_CASES[i][0]}-{i}" for i in (0, 3, 4, 6)])
def test_greedy_equals_autoregressive(method, opts):
    """Chunks of 6 positions, the temperature from position 3: the engines' generations cross both many times."""
    extra = {"intermediate_size_mlp": 48, "num_local_experts": 4, "interleave_moe_layer_step": 2,
             "attention_chunk_size": 6, "floor_scale": 4, "no_rope_layer_interval": 3}
    target, draft = (tiny_family("llama4_text", seed, extra=extra)
                     for seed in (0, 1))
    assert any(target.config.layer_chunks) and target.model.layers[2].self_attn.nope_temperature is not None
    assert_greedy_equals_autoregressive(target, draft, method, opts)


@pytest.mark.parametrize("method,opts", [TINY_CASES[i] for i in (2, 4)],
                         ids=[f"{TINY_CASES[i][0]}-{i}" for i in (2, 4)])
def test_dense_greedy_equals_autoregressive(method, opts):
    """MobileLLM-R1's shape (no experts, full attention with RoPE and q/k norms on every layer): lossless too."""
    extra = {"intermediate_size_mlp": 48, "num_local_experts": 0, "num_experts_per_tok": 0, "moe_layers": [],
             "interleave_moe_layer_step": 0, "layer_types": ["full_attention"] * 3, "no_rope_layers": [1] * 3,
             "attn_temperature_tuning": False}
    target, draft = (tiny_family("llama4_text", seed, extra=extra) for seed in (0, 1))
    assert target.config.experts is None and not any(target.config.layer_chunks)
    assert_greedy_equals_autoregressive(target, draft, method, opts)


def test_transformers_directories_load(tmp_path):
    """transformers' own saves load with its logits: Llama4ForCausalLM's, and Llama4ForConditionalGeneration's (its
    language model read, its vision model and projector not)."""
    hf, _ = pair("listed-top2-biased-tied")
    ids = torch.randint(0, 101, (2, 24), generator=torch.Generator().manual_seed(5))
    assert_save_loads(hf, tmp_path / "causal", ids)
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, image_size=28,
                  patch_size=14, vision_output_dim=32, projector_input_dim=32, projector_output_dim=32)
    hf2, _ = pair()
    config = transformers.Llama4Config(text_config=hf2.config.to_dict(), vision_config=vision)
    torch.manual_seed(0)
    wrapped = transformers.Llama4ForConditionalGeneration(config).eval()
    wrapped.language_model.load_state_dict(hf2.state_dict())
    wrapped.save_pretrained(tmp_path / "wrapped")
    assert json.loads((tmp_path / "wrapped" / "config.json").read_text())["model_type"] == "llama4"
    with torch.no_grad():
        ref = hf2(ids).logits
        assert (Llama.from_pretrained(tmp_path / "wrapped")(ids) - ref).abs().max().item() <= TOL


def write_llama4_gguf(path, hf, quant=None, meta=None):
    """A GGUF of transformers' Llama4ForCausalLM ``hf`` as llama.cpp's converter writes the checkpoint (Llama4Model:
    llama's keys with the dense MLP's width as feed_forward_length, interleave_moe_layer_step and the experts' width;
    the stacked experts transposed into ffn_{gate,up,down}_exps [E, out, in]; q / k rows as they are). ``meta``: keys
    added."""
    from .test_families import write_stacked_experts_gguf

    c = hf.config

    def special(name, t, i):
        if name.endswith("feed_forward.experts.gate_up_proj"):
            gate, up = t.transpose(-1, -2).chunk(2, dim=1)
            return {f"blk.{i}.ffn_gate_exps.weight": gate, f"blk.{i}.ffn_up_exps.weight": up}
        if name.endswith("feed_forward.experts.down_proj"):
            return {f"blk.{i}.ffn_down_exps.weight": t.transpose(-1, -2)}
        return None

    from .test_families import converted_kv, stacked_expert_tensors

    kv = {**converted_kv(c), "feed_forward_length": c.intermediate_size_mlp,
          "expert_count": c.num_local_experts, "expert_used_count": c.num_experts_per_tok,
          "expert_feed_forward_length": c.intermediate_size, "interleave_moe_layer_step": c.interleave_moe_layer_step,
          **(meta or {})}
    tensors = stacked_expert_tensors(hf, "llama4", special)
    ours = LlamaConfig.from_dict(c.to_dict())
    if ours.rope_type == "llama3":  # (the converter's rope_freqs: each pair's factor on its frequency)
        from triforce.models.rope import rope_inv_freq

        tensors["rope_freqs.weight"] = rope_inv_freq(ours.replace(rope_scaling=None)) / rope_inv_freq(ours)
    return write_stacked_experts_gguf(path, hf, "llama4", kv, quant, tensors=tensors)


@pytest.mark.parametrize("rope", ["default", "llama3"])
def test_gguf_llama4_as_llama_cpp_writes_and_runs_it(tmp_path, rope):
    """A llama4 GGUF loads as llama.cpp runs it, which is transformers' Scout: its settings the file does not carry
    (chunks and the temperature's floor of 8192, the temperature's 0.1, every fourth layer NoPE, three of every four
    chunked, q/k norms unless 128 experts) as Llama4TextConfig's defaults; transformers' logits; the conversion cache
    read back by transformers; Q8_0 / Q5_0 blocks bitwise."""
    from .test_families import assert_mixture_gguf_loads

    scout = dict(attention_chunk_size=8192, floor_scale=8192, attn_scale=0.1, no_rope_layers=None, layer_types=None,
                 interleave_moe_layer_step=2, use_qk_norm=True, attn_temperature_tuning=True, intermediate_size=64,
                 intermediate_size_mlp=96, num_hidden_layers=8)
    if rope == "llama3":  # (Scout's: its rope_freqs tensor in the file)
        scout["rope_parameters"] = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 16.0,
                                    "low_freq_factor": 1.0, "high_freq_factor": 1.0,
                                    "original_max_position_embeddings": 8192}
    hf, ours = pair(**scout)
    loaded = assert_mixture_gguf_loads(tmp_path, hf, ours, write_llama4_gguf)
    c, want = loaded.config, ours.config
    assert (c.layer_chunks, c.rope_layers, c.l2_qk_norm, c.nope_temperature, c.experts.layers) == (
        want.layer_chunks, want.rope_layers, want.l2_qk_norm, want.nope_temperature, want.experts.layers)
    default = transformers.Llama4TextConfig()
    assert c.nope_temperature == (default.attn_scale, default.floor_scale)
    assert c.layer_chunks[0] == default.attention_chunk_size and not c.layer_chunks[3]


def test_gguf_llama4_reads_its_other_forms_and_refuses_others(tmp_path):
    """128 experts (Maverick): no q/k norms; sliding_window 0: no chunk, the last layer NoPE, no temperature (as
    llama.cpp runs such a file); a pattern of 2; a chunked layers' RoPE base of their own and no experts raise."""
    from triforce.models.loading import read_gguf

    hf, _ = pair(num_local_experts=4, interleave_moe_layer_step=2, intermediate_size=64, intermediate_size_mlp=96,
                 no_rope_layers=None, layer_types=None)
    config, _ = read_gguf(write_llama4_gguf(tmp_path / "a.gguf", hf, meta={"attention.sliding_window": 0}))
    assert not any(config.layer_chunks) and config.rope_layers == (True, True, True, False)
    assert config.nope_temperature is None
    config, _ = read_gguf(write_llama4_gguf(tmp_path / "b.gguf", hf, meta={"attention.sliding_window_pattern": 2}))
    assert [bool(x) for x in config.layer_chunks] == [True, False, True, False]
    for meta, match in (({"rope.freq_base_swa": 10.0}, "freq_base_swa"), ({"expert_count": 0}, "expert_count")):
        with pytest.raises(ValueError, match=match):
            read_gguf(write_llama4_gguf(tmp_path / "c.gguf", hf, meta=meta))
