"""GPT-BigCode (``model_type="gpt_bigcode"``: StarCoder, StarCoderBase, SantaCoder in transformers' layout,
tiny_starcoder_py): GPT-2's layer and learned positions with nn.Linear weights, one key / value head by default
(``multi_query``) or every head's own (``c_attn`` per head); against transformers' GPTBigCodeForCausalLM."""
import pytest
import torch

from triforce.models import LlamaConfig

from .test_engines import TINY_CASES, assert_greedy_equals_autoregressive
from .test_families import assert_our_save_reads_back, assert_saved_names_are_transformers, model_type_and_ours
from .test_model import TOL
from .test_sliding_window import assert_every_path_matches, assert_pass_equals_steps

transformers = pytest.importorskip("transformers")

BASE = dict(vocab_size=101, n_embd=64, n_layer=3, n_head=4, n_positions=512, bos_token_id=1, eos_token_id=2,
            initializer_range=0.2)
CASES = {"multi-query": {},
         "multi-head-relu": {"multi_query": False, "activation_function": "relu", "n_inner": 80}}


def bigcode(**kw):
    """A tiny random transformers GPTBigCodeForCausalLM and ours."""
    return model_type_and_ours("gpt_bigcode", **{**BASE, **kw})


@pytest.mark.parametrize("case", list(CASES))
def test_every_path_and_our_save_match_transformers(tmp_path, case):
    hf, ours = bigcode(**CASES[case])
    c = ours.config
    assert (c.position_offset, c.num_key_value_heads, c.intermediate_size, c.attention_bias, c.mlp_bias) == (
        0, 1 if hf.config.multi_query else 4, hf.config.n_inner or 4 * hf.config.n_embd, True, True)
    assert_every_path_matches(hf, ours)
    assert_our_save_reads_back(tmp_path, hf, ours, keys=("n_embd", "n_layer", "n_head", "n_positions", "n_inner",
                                                         "multi_query", "activation_function", "scale_attn_weights",
                                                         "tie_word_embeddings"))
    assert_pass_equals_steps(ours, torch.float32)


def test_a_pass_gives_the_bits_of_one_token_steps_in_bfloat16():
    _, ours = bigcode()
    assert_pass_equals_steps(ours, torch.bfloat16)


@pytest.mark.parametrize("case", list(CASES))
def test_its_checkpoint_names_read_and_are_written(tmp_path, case):
    hf, ours = bigcode(**CASES[case])
    assert_saved_names_are_transformers(tmp_path, hf, ours, ["transformer.wpe.weight",
                                                            "transformer.h.0.attn.c_attn.weight",
                                                            "transformer.h.0.attn.c_attn.bias",
                                                            "transformer.h.1.mlp.c_proj.weight"])


def test_unscaled_scores_match_transformers_in_float64():
    """scale_attn_weights false: the scores unscaled (scale 1). Unscaled, this tiny model's softmax is peaked enough
    that transformers' own float32 logits are ~1e-5 off its float64 ones, so ours are held to its float64 forward
    (ours: ~4e-6 off), and the scale matters."""
    hf, ours = bigcode(scale_attn_weights=False)
    assert ours.config.attention_scale == 1.0
    ids = torch.randint(0, 101, (2, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = hf.double()(ids).logits
        assert (ours(ids).double() - ref).abs().max().item() <= TOL
        _, scaled = bigcode()
        assert (scaled(ids).double() - ref).abs().max().item() > 100 * TOL


def test_the_multi_head_layout_matters():
    """Without multi_query, c_attn's rows are per head [q_h; k_h; v_h]: read as GPT-2's [q; k; v] (the rows so
    rearranged give transformers' logits no longer) the logits move past TOL (the tests above can fail)."""
    from triforce.models.loading import _build

    hf, _ = bigcode(**CASES["multi-head-relu"])
    ids = torch.randint(0, 101, (2, 40), generator=torch.Generator().manual_seed(1))
    sd = dict(hf.state_dict())
    for i in range(3):
        for kind in ("weight", "bias"):
            name = f"transformer.h.{i}.attn.c_attn.{kind}"
            sd[name] = sd[name].unflatten(0, (4, 3, 16)).transpose(0, 1).flatten(0, 2).contiguous()
    with torch.no_grad():
        other = _build(LlamaConfig.from_dict(hf.config.to_dict()), sd, None, None)
        assert (other(ids) - hf(ids).logits).abs().max().item() > 100 * TOL


def test_gguf_as_llama_cpp_writes_it(tmp_path):
    """A starcoder GGUF (llama.cpp's name for GPT-BigCode) as llama.cpp's converter writes the multi-query checkpoint
    (attn_qkv's rows [q; k; v] as they are; position_embd) gives transformers' logits; its blocks compute the loaded
    model bitwise (with TRIFORCE_LLAMA_CPP=1, llama.cpp's logits on the file too)."""
    from .test_families import assert_converted_gguf_is_the_checkpoint
    from .test_gpt2 import gguf_kv

    hf, _ = bigcode()
    loaded = assert_converted_gguf_is_the_checkpoint(tmp_path, hf, "starcoder", gguf_kv(hf.config))
    assert (loaded.config.model_type, loaded.config.num_key_value_heads) == ("gpt_bigcode", 1)


def test_defaults():
    """A config without the keys takes GPTBigCodeConfig's (one KV head; GELU's tanh form; tied)."""
    c, want = LlamaConfig.from_dict({"model_type": "gpt_bigcode"}), transformers.AutoConfig.for_model("gpt_bigcode")
    assert (c.vocab_size, c.hidden_size, c.num_hidden_layers, c.num_attention_heads, c.max_position_embeddings) == (
        want.vocab_size, want.n_embd, want.n_layer, want.n_head, want.n_positions)
    assert (c.num_key_value_heads, c.intermediate_size, c.rms_norm_eps, c.tie_word_embeddings, c.activation) == (
        want.num_key_value_heads, 4 * want.n_embd, want.layer_norm_epsilon, want.tie_word_embeddings, "gelu_tanh")
    back = transformers.GPTBigCodeConfig.from_dict(c.to_dict())
    assert (back.multi_query, back.n_inner, back.activation_function) == (True, None, "gelu_pytorch_tanh")


@pytest.mark.parametrize("extra,match", [({"num_key_value_heads": 2}, "num_key_value_heads"),
                                         ({"multi_query": False, "num_key_value_heads": 1}, "num_key_value_heads"),
                                         ({"multi_query": "yes"}, "multi_query"),
                                         ({"rope_theta": 5e5}, "rope_theta"),
                                         ({"attention_bias": True}, "attention_bias"),
                                         ({"scale_attn_by_inverse_layer_idx": False}, "scale_attn_by_inverse"),
                                         ({"activation_function": "silu"}, "hidden_act")])
def test_what_would_not_be_read_so_raises(extra, match):
    """KV heads that disagree with multi_query, keys GPTBigCodeConfig does not read (RoPE's, the bias switches,
    GPT-2's scale per layer), another activation: each raises naming the key."""
    with pytest.raises(ValueError, match=match):
        LlamaConfig.from_dict({"model_type": "gpt_bigcode", **BASE, **extra})


@pytest.mark.parametrize("method,opts", [TINY_CASES[i] for i in (0, 2, 3, 4, 6)],
                         ids=[f"{TINY_CASES[i][0]}-{i}" for i in (0, 2, 3, 4, 6)])
def test_greedy_equals_autoregressive(method, opts):
    """The engines over a multi-query GPT-BigCode model give its greedy tokens (a layer-skip draft for the two-model
    methods)."""
    _, ours = bigcode()
    assert_greedy_equals_autoregressive(ours, ours.layer_skip(2), method, opts)
