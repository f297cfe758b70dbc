"""BLOOM (``model_type="bloom"``: bigscience's bloom-560m ... bloom, bloomz): ALiBi instead of RoPE
(``verify_attention``'s ``alibi_slopes``), a LayerNorm on the embeddings, torch's LayerNorm with a bias, a per-head
``query_key_value``, an ungated MLP of GELU's tanh form, biases everywhere, a tied head; its config's names
(``n_layer``, ``n_head``) and checkpoints' names (``transformer.*``, bigscience's unprefixed ones too); against
transformers' BloomForCausalLM."""
import numpy as np
import pytest
import torch

from triforce.models import LlamaConfig

from .test_engines import TINY_CASES, assert_greedy_equals_autoregressive
from .test_families import (assert_edited_save_reads_the_same, assert_our_save_reads_back,
                            assert_saved_names_are_transformers, model_type_and_ours)
from .test_model import TOL
from .test_sliding_window import assert_every_path_matches, assert_pass_equals_steps

transformers = pytest.importorskip("transformers")

BASE = dict(vocab_size=101, hidden_size=64, n_layer=3, n_head=4, layer_norm_epsilon=1e-3, initializer_range=0.2)
CASES = {"four-heads": {}, "six-heads-untied": {"hidden_size": 48, "n_head": 6, "tie_word_embeddings": False}}


def bloom(**kw):
    """A tiny random transformers BloomForCausalLM and ours."""
    return model_type_and_ours("bloom", **{**BASE, **kw})


@pytest.mark.parametrize("case", list(CASES))
def test_every_path_and_our_save_match_transformers(tmp_path, case):
    hf, ours = bloom(**CASES[case])
    c = ours.config
    assert (c.intermediate_size, c.attention_bias, c.mlp_bias, c.activation, c.gated_mlp, c.rms_norm_eps) == (
        4 * c.hidden_size, True, True, "gelu_tanh", False, 1e-3)
    assert c.rope_layers == (False,) * 3 and c.position_offset is None and c.embed_layernorm
    assert_every_path_matches(hf, ours)
    assert_our_save_reads_back(tmp_path, hf, ours, keys=("hidden_size", "n_layer", "n_head", "layer_norm_epsilon",
                                                         "tie_word_embeddings"))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_pass_gives_the_bits_of_one_token_steps(dtype):
    assert_pass_equals_steps(bloom(**CASES["six-heads-untied"])[1], dtype)


@pytest.mark.parametrize("heads", [1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 24, 32, 71, 96, 112])
def test_the_slopes_are_transformers(heads):
    """Each head's slope, bitwise BloomModel's (``_get_alibi_slopes``: powers of 2 ** (-8 / p), and the extra heads'
    odd powers of 2 ** (-4 / p) where the count is no power of 2)."""
    from transformers.models.bloom.modeling_bloom import _get_alibi_slopes

    c = LlamaConfig.from_dict({"model_type": "bloom", "hidden_size": 8 * heads, "n_head": heads})
    assert torch.equal(torch.tensor(c.alibi_slopes), _get_alibi_slopes(heads, torch.device("cpu")))


def test_its_checkpoint_names_read_and_are_written_and_unprefixed_ones_read(tmp_path):
    """Its checkpoints' names (transformer.word_embeddings, word_embeddings_layernorm, h.*.self_attention.
    query_key_value, dense, mlp.dense_h_to_4h, ln_f) read and written; BloomModel's unprefixed names, as bigscience's
    checkpoints hold them, read the same."""
    hf, ours = bloom()
    assert_saved_names_are_transformers(tmp_path, hf, ours, ["transformer.word_embeddings.weight",
                                                            "transformer.word_embeddings_layernorm.bias",
                                                            "transformer.h.0.self_attention.query_key_value.weight",
                                                            "transformer.h.2.self_attention.dense.bias",
                                                            "transformer.h.1.mlp.dense_4h_to_h.weight",
                                                            "transformer.ln_f.weight"])

    def unprefixed(sd):
        sd = {k.removeprefix("transformer."): t for k, t in sd.items()}
        assert "word_embeddings_layernorm.weight" in sd and "h.2.input_layernorm.bias" in sd
        return sd

    assert_edited_save_reads_the_same(tmp_path, ours, unprefixed)


def test_alibi_and_the_embeddings_norm_matter():
    """Without ALiBi (the plain causal attention), or without the norm of the embeddings, the logits move past TOL (the
    tests above can fail)."""
    hf, ours = bloom()
    ids = torch.randint(0, 101, (2, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = hf(ids).logits
        assert (ours(ids) - ref).abs().max().item() <= TOL
        for layer in ours.model.layers:
            layer.self_attn.alibi = None
        assert (ours(ids) - ref).abs().max().item() > 100 * TOL
        for layer in ours.model.layers:
            layer.self_attn.alibi = ours.config.alibi_slopes
        ours.model.embed_layernorm = torch.nn.Identity()
        assert (ours(ids) - ref).abs().max().item() > 100 * TOL


def test_defaults():
    """A config without the keys takes BloomConfig's (250880 tokens, 2 layers of 64 with 8 heads, eps 1e-5, tied)."""
    c, want = LlamaConfig.from_dict({"model_type": "bloom"}), transformers.AutoConfig.for_model("bloom")
    assert (c.vocab_size, c.hidden_size, c.num_hidden_layers, c.num_attention_heads, c.rms_norm_eps) == (
        want.vocab_size, want.hidden_size, want.n_layer, want.n_head, want.layer_norm_epsilon)
    assert (c.intermediate_size, c.tie_word_embeddings, c.bos_token_id, c.eos_token_id) == (
        4 * want.hidden_size, want.tie_word_embeddings, want.bos_token_id, want.eos_token_id)
    back = transformers.BloomConfig.from_dict(c.to_dict())  # (our config written as BloomConfig's names)
    assert (back.hidden_size, back.n_layer, back.n_head, back.layer_norm_epsilon) == (64, 2, 8, 1e-5)
    assert not {"rope_theta", "num_key_value_heads", "attention_bias", "intermediate_size", "hidden_act",
                "num_hidden_layers", "num_attention_heads"} & set(c.to_dict())


# bloom-560m's config.json as transformers 4.26 wrote it (Megatron-DeepSpeed's keys beside BloomConfig's)
BLOOM_560M = {"apply_residual_connection_post_layernorm": False, "architectures": ["BloomForCausalLM"],
              "attention_dropout": 0.0, "attention_softmax_in_fp32": True, "bias_dropout_fusion": True,
              "bos_token_id": 1, "eos_token_id": 2, "hidden_dropout": 0.0, "hidden_size": 1024,
              "initializer_range": 0.02, "layer_norm_epsilon": 1e-05, "masked_softmax_fusion": True,
              "model_type": "bloom", "n_head": 16, "n_inner": None, "n_layer": 24, "offset_alibi": 100,
              "pad_token_id": 3, "pretraining_tp": 1, "skip_bias_add": True, "skip_bias_add_qkv": False,
              "slow_but_exact": False, "transformers_version": "4.26.0", "unk_token_id": 0, "use_cache": True,
              "vocab_size": 250880}


@pytest.mark.parametrize("d", [BLOOM_560M, {**{k: v for k, v in BLOOM_560M.items() if k not in (
    "hidden_size", "n_head")}, "n_embed": 1024, "num_attention_heads": 16}], ids=["bloom-560m", "old-names"])
def test_bloom_560m_config_reads_as_transformers_reads_it(d):
    c, want = LlamaConfig.from_dict(d), transformers.BloomConfig.from_dict(d)
    assert (c.hidden_size, c.num_attention_heads, c.num_hidden_layers, c.head_dim, c.intermediate_size) == (
        want.hidden_size, want.n_head, want.n_layer, want.hidden_size // want.n_head, 4 * want.hidden_size)
    assert (c.vocab_size, c.pad_token_id, c.rms_norm_eps, c.tie_word_embeddings) == (250880, 3, 1e-5, True)
    assert c.to_dict()["n_head"] == 16


@pytest.mark.parametrize("extra,match", [({"apply_residual_connection_post_layernorm": True}, "apply_residual"),
                                         ({"hidden_act": "gelu"}, "hidden_act"),
                                         ({"intermediate_size": 80}, "intermediate_size"),
                                         ({"n_inner": 80}, "n_inner"),
                                         ({"rope_theta": 5e5}, "rope_theta"),
                                         ({"num_key_value_heads": 2}, "num_key_value_heads"),
                                         ({"num_attention_heads": 8}, "n_head"),
                                         ({"hidden_dropout": 2}, "hidden_dropout")])
def test_what_would_not_be_read_so_raises(extra, match):
    """The residual from the normed input (not implemented), keys BloomConfig does not read (an activation, an MLP
    width, RoPE, KV heads), a name given twice apart, a dropout out of range: each raises naming the key."""
    with pytest.raises(ValueError, match=match):
        LlamaConfig.from_dict({"model_type": "bloom", **BASE, **extra})


def test_hidden_transfer_heads_train_as_they_decode():
    """Hidden Transfer heads' training forward (its own attention over the cached keys) adds ALiBi's bias as the
    decoding tap's cache does."""
    from .test_heads import assert_perturbed_heads_train_as_they_decode

    assert_perturbed_heads_train_as_they_decode(bloom(vocab_size=64)[1])


@pytest.mark.parametrize("method,opts", [TINY_CASES[i] for i in (0, 2, 3, 4, 6)],
                         ids=[f"{TINY_CASES[i][0]}-{i}" for i in (0, 2, 3, 4, 6)])
def test_greedy_equals_autoregressive(method, opts):
    """The engines over a BLOOM model give its greedy tokens (a layer-skip draft for the two-model methods; the
    StreamingLLM and retrieval drafts attend by the distances of the slots they hold)."""
    _, ours = bloom(**CASES["six-heads-untied"])
    assert_greedy_equals_autoregressive(ours, ours.layer_skip(2), method, opts)


def bloom_kv(c) -> dict:
    """The ``bloom.*`` metadata llama.cpp's converter writes for transformers' BloomConfig ``c`` (its context 2048:
    BloomConfig has none)."""
    return {"context_length": 2048, "embedding_length": c.hidden_size, "feed_forward_length": 4 * c.hidden_size,
            "block_count": c.n_layer, "attention.head_count": c.n_head, "attention.head_count_kv": c.n_head,
            "attention.layer_norm_epsilon": float(c.layer_norm_epsilon), "vocab_size": c.vocab_size}


def bloom_gguf_tensors(hf, config, tensors=None) -> dict:
    """``write_converted_gguf``'s ``convert`` and ``tensors`` for transformers' BLOOM ``hf`` as llama.cpp's converter
    writes it: query_key_value's rows regrouped as every query, then every key, then every value; the embeddings'
    LayerNorm as token_embd_norm and each layer's post_attention_layernorm as ffn_norm (the converter strips
    ``transformer.`` first: the gguf package maps those names only so)."""
    from triforce.models.loading import falcon_qkv_split

    own = {"transformer.word_embeddings_layernorm.": "token_embd_norm."}
    own.update({f"transformer.h.{i}.post_attention_layernorm.": f"blk.{i}.ffn_norm."
                for i in range(config.num_hidden_layers)})
    tensors = {**(tensors or {}), **{own[k.rsplit(".", 1)[0] + "."] + k.rsplit(".", 1)[1]: t.detach().float().numpy()
               for k, t in hf.state_dict().items() if k.rsplit(".", 1)[0] + "." in own}}

    def convert(name, t):
        if name.rsplit(".", 1)[0] + "." in own:
            return None
        return torch.cat(falcon_qkv_split(config, t)) if "query_key_value" in name else t

    return {"convert": convert, "tensors": tensors}


@pytest.mark.parametrize("case", list(CASES))
def test_gguf_as_llama_cpp_writes_it(tmp_path, case):
    """A bloom GGUF as llama.cpp's converter writes the checkpoint (query_key_value regrouped from per head [q_h; k_h;
    v_h] to every query, then every key, then every value; the embeddings' LayerNorm as token_embd_norm) gives
    transformers' logits; its blocks compute the loaded model bitwise; its metadata read."""
    from .test_families import assert_converted_gguf_is_the_checkpoint

    hf, ours = bloom(**CASES[case])
    loaded = assert_converted_gguf_is_the_checkpoint(tmp_path, hf, "bloom", bloom_kv(hf.config),
                                                     **bloom_gguf_tensors(hf, ours.config))
    c = loaded.config
    assert (c.model_type, c.alibi, c.embed_layernorm, c.attention_bias, c.mlp_bias) == ("bloom", "bloom", True, True,
                                                                                       True)
    assert c.rms_norm_eps == torch.tensor(1e-3).item()  # (a float32 in the file)
    assert c.alibi_slopes == ours.config.alibi_slopes and c.tie_word_embeddings == hf.config.tie_word_embeddings
    assert (c.num_attention_heads, c.num_key_value_heads, c.max_position_embeddings) == (
        hf.config.n_head, hf.config.n_head, 2048)


@pytest.mark.parametrize("kv,match", [({"attn_q_norm": 1}, "q_norm"),
                                      ({"attention.max_alibi_bias": 8.0}, "max_alibi_bias"),
                                      ({"attention.head_count": None}, "head_count")])
def test_gguf_what_raises(tmp_path, kv, match):
    """A bloom file with a key llama.cpp's bloom does not read (the ALiBi bias: fixed at 8 there), a tensor the model
    has not (q / k norms) or without its heads raises naming it."""
    from triforce.models import Llama

    from .test_families import write_converted_gguf

    hf, ours = bloom()
    keys = {k: v for k, v in {**bloom_kv(hf.config), **kv}.items() if v is not None and k != "attn_q_norm"}
    norm = {"blk.0.attn_q_norm.weight": np.ones(16, np.float32)} if "attn_q_norm" in kv else {}
    path = write_converted_gguf(tmp_path / "f.gguf", hf, "bloom", keys, **bloom_gguf_tensors(hf, ours.config, norm))
    with pytest.raises(ValueError, match=match):
        Llama.from_pretrained(path, cache_dir=False)
