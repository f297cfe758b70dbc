"""GPT-NeoX (``model_type="gpt_neox"``: Pythia, GPT-NeoX-20B, Dolly v2, RedPajama-INCITE): torch's LayerNorm with a
bias, by default the attention and the MLP in parallel, each on its own norm of the block's input; q, k and v as one
per-head interleaved ``query_key_value``; RoPE on the first ``rotary_pct`` of each head; an ungated MLP of the exact
GELU (``gelu_fast``: its tanh form); an untied head (``embed_out``). Against transformers' GPTNeoXForCausalLM, and from
GGUF as llama.cpp's converter writes it (``gptneox``: q, k, v de-interleaved into one ``attn_qkv``)."""
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from triforce.models import Llama, LlamaConfig
from triforce.models.llama import BiasLayerNorm, FeedForward
from triforce.models.loading import neox_qkv_join, neox_qkv_split

from .test_engines import TINY_CASES, assert_greedy_equals_autoregressive
from .test_families import TINY, TOL, assert_saved_reads_back, tiny_family, transformers_and_ours
from .test_sliding_window import assert_every_path_matches, assert_pass_equals_steps

transformers = pytest.importorskip("transformers")

BASE = {k: v for k, v in TINY.items() if k not in ("rms_norm_eps", "num_key_value_heads")} | {"num_hidden_layers": 3}
CASES = {"pythia": {}, "sequential-half-rope-gelu-fast": dict(use_parallel_residual=False, rotary_pct=0.5,
                                                             hidden_act="gelu_fast", rotary_emb_base=5000.0),
         "tied-no-attention-bias": dict(tie_word_embeddings=True, attention_bias=False, hidden_dropout=0.1)}


def pair(case="pythia", **kw):
    """transformers' GPTNeoXForCausalLM of ``case`` (random weights, biases and norms randomised) and ours."""
    return transformers_and_ours("GPTNeoX", **{**BASE, **CASES[case], **kw})


def test_query_key_value_split_and_join():
    """The checkpoint's query_key_value rows, per head [q_h; k_h; v_h], split into the q, k and v projections (head
    h's rows of each in place h) and join back bitwise."""
    heads, D, hidden = 3, 4, 5
    t = torch.arange(heads * 3 * D * hidden, dtype=torch.float32).reshape(heads * 3 * D, hidden)
    q, k, v = neox_qkv_split(t, heads)
    for h in range(heads):
        for i, part in enumerate((q, k, v)):
            assert torch.equal(part[h * D:(h + 1) * D], t[(3 * h + i) * D:(3 * h + i + 1) * D])
    assert torch.equal(neox_qkv_join([q, k, v], heads), t)
    bias = torch.arange(heads * 3 * D, dtype=torch.float32)
    assert torch.equal(neox_qkv_join(neox_qkv_split(bias, heads), heads), bias)


@pytest.mark.parametrize("case", list(CASES))
def test_logits_and_every_path_match_transformers(tmp_path, case):
    """Every path gives transformers' logits (the two norms of the parallel block or the sequential one, the
    interleaved query_key_value, partial RoPE, the exact GELU or gelu_fast, the biases); the checkpoint we save
    (gpt_neox.*, query_key_value interleaved again, embed_out) reads back in transformers as the same model."""
    hf, ours = pair(case)
    c, layer = ours.config, ours.model.layers[0]
    assert type(layer.mlp) is FeedForward and type(layer.input_layernorm) is BiasLayerNorm
    assert type(layer.post_attention_layernorm) is BiasLayerNorm
    assert (c.parallel_block, c.parallel_norms) == (hf.config.use_parallel_residual,) * 2
    assert c.activation == ("gelu" if hf.config.hidden_act == "gelu" else "gelu_tanh")
    assert c.rotary_dim == int(16 * hf.config.rope_parameters["partial_rotary_factor"])
    assert (c.qkv_bias, c.out_bias, c.mlp_bias) == (hf.config.attention_bias, hf.config.attention_bias, True)
    assert_every_path_matches(hf, ours)
    assert_saved_reads_back(tmp_path, hf, ours)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_pass_gives_the_bits_of_one_token_steps(dtype):
    """The exact GELU on the CPU takes each row alone (triforce_C::gelu_mul): a pass computes its steps' bits."""
    assert_pass_equals_steps(pair()[1], dtype)


def test_transformers_directory_and_old_checkpoints_load(tmp_path):
    """transformers' own save of the model loads with its logits; so does an old checkpoint's (Pythia's first ones:
    the causal mask and its fill as attention buffers, RoPE's inv_freq, the head as embed_out), whose buffers are
    dropped as transformers drops them."""
    from safetensors.torch import load_file, save_file

    hf, _ = pair()
    hf.save_pretrained(tmp_path / "hf")
    ids = torch.randint(0, 101, (2, 24), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        ref = hf(ids).logits
        assert (Llama.from_pretrained(tmp_path / "hf")(ids) - ref).abs().max().item() <= TOL
    sd = load_file(tmp_path / "hf" / "model.safetensors")
    sd = {("embed_out.weight" if k == "lm_head.weight" else k): v for k, v in sd.items()}
    for i in range(hf.config.num_hidden_layers):
        sd[f"gpt_neox.layers.{i}.attention.bias"] = torch.ones(1, 1, 8, 8, dtype=torch.bool).tril()
        sd[f"gpt_neox.layers.{i}.attention.masked_bias"] = torch.tensor(-1e9)
        sd[f"gpt_neox.layers.{i}.attention.rotary_emb.inv_freq"] = torch.ones(2)
    (tmp_path / "old").mkdir()
    save_file(sd, tmp_path / "old" / "model.safetensors")
    (tmp_path / "old" / "config.json").write_text((tmp_path / "hf" / "config.json").read_text())
    with torch.no_grad():
        assert (Llama.from_pretrained(tmp_path / "old")(ids) - ref).abs().max().item() <= TOL


def test_defaults_and_bad_configs():
    """A config without the keys takes GPTNeoXConfig's (a quarter of each head RoPE'd at base 10000, the parallel block
    on two norms, biases everywhere, the exact GELU, eps by layer_norm_eps); rotary_pct and rotary_emb_base are the
    common keys' other names and round-trip as the checkpoints write them; keys GPT-NeoX does not have raise."""
    c = LlamaConfig.from_dict({**BASE, "model_type": "gpt_neox", "layer_norm_eps": 1e-6, "classifier_dropout": 0.1})
    assert (c.rotary_dim, c.rope_theta, c.rms_norm_eps, c.parallel_block, c.parallel_norms, c.activation) == (
        4, 10000.0, 1e-6, True, True, "gelu")
    assert (c.qkv_bias, c.out_bias, c.mlp_bias, c.num_key_value_heads, c.tie_word_embeddings) == (True, True, True, 4,
                                                                                                False)
    d = c.to_dict()
    assert (d["rotary_pct"], d["rotary_emb_base"], d["layer_norm_eps"]) == (0.25, 10000.0, 1e-6)
    assert not {"mlp_bias", "num_key_value_heads", "head_dim", "rope_theta", "rms_norm_eps"} & d.keys()
    assert LlamaConfig.from_dict(d).to_dict() == d
    c = LlamaConfig.from_dict({**BASE, "model_type": "gpt_neox", "rotary_pct": 1.0, "rotary_emb_base": 5e5,
                               "use_parallel_residual": False, "hidden_act": "gelu_new"})
    assert (c.rotary_dim, c.rope_theta, c.parallel_block, c.parallel_norms, c.activation) == (16, 5e5, False, False,
                                                                                            "gelu_tanh")
    for bad, match in (({"num_key_value_heads": 2}, "num_key_value_heads"), ({"head_dim": 8}, "head_dim"),
                       ({"mlp_bias": True}, "'mlp_bias'"), ({"hidden_act": "silu"}, "'hidden_act'"),
                       ({"rotary_pct": 0.5, "partial_rotary_factor": 0.25}, "rotary_pct"),
                       ({"rotary_emb_base": 1e4, "rope_parameters": {"rope_theta": 5e5}}, "rope_theta"),
                       ({"use_parallel_residual": 1}, "'use_parallel_residual'")):
        with pytest.raises(ValueError, match=match):
            LlamaConfig.from_dict({**BASE, "model_type": "gpt_neox", **bad})
    with pytest.raises(ValueError, match="multi-head attention"):
        LlamaConfig(model_type="gpt_neox", hidden_size=64, num_attention_heads=4, num_key_value_heads=2, mlp_bias=True)


def tiny_neox(seed):
    return tiny_family("gpt_neox", seed, num_key_value_heads=4, attention_bias=True, mlp_bias=True,
                       extra={"use_parallel_residual": seed == 0})


@pytest.mark.parametrize("method,opts", TINY_CASES, ids=[f"{m}-{i}" for i, (m, _) in enumerate(TINY_CASES)])
def test_greedy_equals_autoregressive(method, opts):
    assert_greedy_equals_autoregressive(tiny_neox(0), tiny_neox(1), method, opts)


def test_int8_drafts_and_trained_heads_see_the_model():
    """The int8 draft copy drafts losslessly; Hidden Transfer heads' training forward runs the upper layers (the
    parallel block's two norms, partial RoPE, the exact GELU) as decoding runs them."""
    from triforce.models.quant import int8_copy

    from .test_heads import assert_perturbed_heads_train_as_they_decode

    model = tiny_neox(0)
    assert_greedy_equals_autoregressive(model, int8_copy(model), "speculative", {"gamma": 3})
    assert_perturbed_heads_train_as_they_decode(model)


def converted(hf):
    """The ``gptneox.*`` metadata llama.cpp's converter writes for ``hf`` (no KV head count, key length or RoPE base:
    llama.cpp's defaults, MHA and 10000; the vocabulary's size, which its tokens give), and its rewrite of
    query_key_value (rows [q; k; v], as converted)."""
    c = hf.config
    kv = {"context_length": c.max_position_embeddings, "embedding_length": c.hidden_size,
          "feed_forward_length": c.intermediate_size, "block_count": c.num_hidden_layers,
          "rope.dimension_count": int(c.hidden_size // c.num_attention_heads
                                      * c.rope_parameters["partial_rotary_factor"]),
          "attention.head_count": c.num_attention_heads, "use_parallel_residual": c.use_parallel_residual,
          "attention.layer_norm_epsilon": float(c.layer_norm_eps),
          "vocab_size": c.vocab_size}  # (the converter writes the tokens instead: llama.cpp's n_vocab either way)

    def convert(name, t):
        return torch.cat(neox_qkv_split(t, c.num_attention_heads)) if "query_key_value" in name else t
    return kv, convert


@pytest.mark.parametrize("case", ["pythia", "tied-no-attention-bias"])
def test_gguf_as_llama_cpp_writes_it(tmp_path, case):
    """A gptneox GGUF as llama.cpp's converter writes it (attn_qkv rows [q; k; v] with its bias, the LayerNorms'
    biases, rope.dimension_count the RoPE'd dims, use_parallel_residual) gives transformers' logits; its blocks compute
    the loaded model bitwise."""
    from .test_families import assert_converted_gguf_is_the_checkpoint

    hf, ours = pair(case)
    loaded = assert_converted_gguf_is_the_checkpoint(tmp_path, hf, "gptneox", *converted(hf))
    c = loaded.config
    assert (c.model_type, c.rotary_dim, c.parallel_block, c.qkv_bias, c.activation) == (
        "gpt_neox", ours.config.rotary_dim, ours.config.parallel_block, ours.config.qkv_bias, "gelu")


@given(data=st.data())
def test_drawn_checkpoints_and_their_gguf_files_load_as_transformers_model(data):
    """Property: a drawn tiny GPT-NeoX checkpoint (2, 4 or 8 heads; RoPE on a quarter, half or all of each head; the
    parallel block or the sequential one; attention biases or none; the exact GELU or gelu_fast; tied or not) gives
    transformers' logits on 32 tokens, a 6-token pass the bits of its steps, and its GGUF (float32, the exact GELU:
    transformers' logits; Q8_0 / Q5_0 blocks: the loaded model bitwise)."""
    from .test_families import assert_drawn_checkpoint_loads, write_converted_gguf

    draw = data.draw
    act = draw(st.sampled_from(["gelu", "gelu_fast"]))
    kw = dict(BASE, num_attention_heads=draw(st.sampled_from([2, 4, 8])), num_hidden_layers=2,
              rotary_pct=draw(st.sampled_from([0.25, 0.5, 1.0])), use_parallel_residual=draw(st.booleans()),
              attention_bias=draw(st.booleans()), tie_word_embeddings=draw(st.booleans()), hidden_act=act)
    hf, ours = transformers_and_ours("GPTNeoX", **kw)
    kv, convert = converted(hf)
    # (a GGUF file has no hidden_act: llama.cpp and this reader take the exact GELU's name; float32 compares a
    # gelu_fast checkpoint's file with transformers' exact-GELU twin)
    twin = transformers_and_ours("GPTNeoX", **{**kw, "hidden_act": "gelu"})[0] if act != "gelu" else None
    assert_drawn_checkpoint_loads(draw, hf, ours,
                                  lambda path, quant: write_converted_gguf(path, hf, "gptneox", kv, quant=quant,
                                                                           convert=convert),
                                  want=None if twin is None else lambda ids: twin(ids).logits)
