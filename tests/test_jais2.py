"""Jais 2 (``model_type="jais2"``: Jais-2-8B-Chat, Jais-2-70B-Chat): Llama's attention with an ungated MLP of ReLU
squared (``up_proj``, ``down_proj``, Arcee's) on torch's LayerNorm with a bias (``layer_norm_eps``), biases on every
projection by ``attention_bias`` and ``mlp_bias`` (both true by default). Against transformers' Jais2ForCausalLM."""
import pytest
import torch

from triforce.models import LlamaConfig
from triforce.models.llama import FeedForward

from .test_engines import TINY_CASES, assert_greedy_equals_autoregressive
from .test_families import TINY, assert_saved_reads_back, tiny_family, transformers_and_ours
from .test_sliding_window import assert_every_path_matches, assert_pass_equals_steps

transformers = pytest.importorskip("transformers")

CASES = {"default": {}, "eps-no-biases-tied": dict(layer_norm_eps=1e-2, attention_bias=False, mlp_bias=False,
                                                   tie_word_embeddings=True, num_key_value_heads=2)}


def pair(case="default"):
    """transformers' Jais2ForCausalLM of ``case`` (random weights, biases and norms randomised) and ours."""
    kw = {k: v for k, v in TINY.items() if k != "rms_norm_eps"}  # (not Jais2Config's key)
    return transformers_and_ours("Jais2", **{**kw, "num_hidden_layers": 3, "num_key_value_heads": 4, **CASES[case]})


@pytest.mark.parametrize("case", list(CASES))
def test_every_path_and_our_save_match_transformers(tmp_path, case):
    hf, ours = pair(case)
    c = ours.config
    assert type(ours.model.layers[0].mlp) is FeedForward and (c.activation, c.gated_mlp) == ("relu2", False)
    assert c.torch_layer_norm == "plain" and c.rms_norm_eps == hf.config.layer_norm_eps
    assert c.attention_bias == c.mlp_bias == hf.config.attention_bias
    assert_every_path_matches(hf, ours)
    assert_saved_reads_back(tmp_path, hf, ours)
    assert "rms_norm_eps" not in c.to_dict() and c.to_dict()["layer_norm_eps"] == hf.config.layer_norm_eps


def test_the_norms_eps_is_read():
    """The LayerNorm's eps is the config's layer_norm_eps: read as another value, the logits move."""
    from triforce.models.loading import _build

    hf, ours = pair("eps-no-biases-tied")
    ids = torch.randint(0, 101, (2, 20), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        other = _build(ours.config.replace(rms_norm_eps=1e-5), hf.state_dict(), None, None)
        assert (other(ids) - hf(ids).logits).abs().max().item() > 1e-3


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_pass_gives_the_bits_of_one_token_steps(dtype):
    assert_pass_equals_steps(pair()[1], dtype)


def test_defaults_and_bad_configs():
    """A config without the keys takes Jais2Config's (the 8B shape, MHA, biases everywhere, ReLU squared, untied);
    another activation or Llama's norm key raises."""
    c, want = LlamaConfig.from_dict({"model_type": "jais2"}), transformers.Jais2Config()
    for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                 "num_key_value_heads", "head_dim", "max_position_embeddings", "tie_word_embeddings",
                 "attention_bias", "mlp_bias"):
        assert getattr(c, name) == getattr(want, name), name
    assert c.rms_norm_eps == want.layer_norm_eps and c.rope_theta == want.rope_parameters["rope_theta"]
    with pytest.raises(ValueError, match="hidden_act"):
        LlamaConfig.from_dict({"model_type": "jais2", "hidden_act": "silu"})


@pytest.mark.parametrize("method,opts", [TINY_CASES[i] for i in (0, 3, 4, 6)],
                         ids=[f"{TINY_CASES[i][0]}-{i}" for i in (0, 3, 4, 6)])
def test_greedy_equals_autoregressive(method, opts):
    assert_greedy_equals_autoregressive(tiny_family("jais2", 0), tiny_family("jais2", 1), method, opts)


@pytest.mark.parametrize("case", list(CASES))
def test_gguf_as_llama_cpp_writes_it(tmp_path, case):
    """A jais2 GGUF as llama.cpp's converter writes a Jais2ForCausalLM checkpoint (its TextModel: the gguf package's
    names, the rows as the checkpoint holds them, every bias; the LayerNorms' eps as attention.layer_norm_epsilon) gives
    transformers' logits; its blocks compute the loaded model bitwise."""
    from .test_families import assert_converted_gguf_is_the_checkpoint, converted_kv

    hf, _ = pair(case)
    ours = assert_converted_gguf_is_the_checkpoint(tmp_path, hf, "jais2", converted_kv(
        hf.config, eps_key="attention.layer_norm_epsilon"))
    c = ours.config
    assert c.model_type == "jais2" and (c.attention_bias, c.mlp_bias) == (hf.config.attention_bias,) * 2
