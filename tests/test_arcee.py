"""Arcee (``model_type="arcee"``: AFM-4.5B): Llama's layer with an ungated MLP of ReLU squared (``up_proj``,
``down_proj``), YaRN RoPE in its checkpoints. Against transformers' ArceeForCausalLM, and from GGUF as llama.cpp's
converter writes it (Llama's permuted q / k rows)."""
import pytest
import torch

from triforce.models import Llama, LlamaConfig
from triforce.models.llama import FeedForward

from .test_engines import TINY_CASES, assert_greedy_equals_autoregressive
from .test_families import TINY, assert_saved_reads_back, tiny_family, transformers_and_ours
from .test_model import TOL
from .test_sliding_window import assert_every_path_matches, assert_pass_equals_steps

transformers = pytest.importorskip("transformers")

YARN = {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 32, "rope_theta": 10000.0}
CASES = {"yarn": dict(rope_parameters=YARN), "biases-tied": dict(attention_bias=True, mlp_bias=True,
                                                                 tie_word_embeddings=True)}


def pair(case="yarn", **kw):
    """transformers' ArceeForCausalLM of ``case`` (random weights, biases and norms randomised) and ours."""
    return transformers_and_ours("Arcee", **{**TINY, "num_hidden_layers": 3, **CASES[case], **kw})


@pytest.mark.parametrize("case", list(CASES))
def test_logits_and_every_path_match_transformers(tmp_path, case):
    """Every path gives transformers' logits (the ungated ReLU-squared MLP, YaRN past its original context); the
    checkpoint we save reads back in transformers as the same model."""
    hf, ours = pair(case)
    assert type(ours.model.layers[0].mlp) is FeedForward and ours.config.activation == "relu2"
    assert_every_path_matches(hf, ours)
    assert_saved_reads_back(tmp_path, hf, ours)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_pass_gives_the_bits_of_one_token_steps(dtype):
    assert_pass_equals_steps(pair("biases-tied")[1], dtype)


def test_defaults_and_bad_configs():
    """A config without the keys takes ArceeConfig's (ReLU squared, no biases, untied); another activation raises."""
    d = LlamaConfig.from_dict({"model_type": "arcee"})
    assert (d.hidden_size, d.intermediate_size, d.activation, d.gated_mlp) == (2560, 18432, "relu2", False)
    with pytest.raises(ValueError, match="'hidden_act'"):
        LlamaConfig.from_dict({**TINY, "model_type": "arcee", "hidden_act": "silu"})


@pytest.mark.parametrize("method,opts", TINY_CASES, ids=[f"{m}-{i}" for i, (m, _) in enumerate(TINY_CASES)])
def test_greedy_equals_autoregressive(method, opts):
    assert_greedy_equals_autoregressive(tiny_family("arcee", 0), tiny_family("arcee", 1), method, opts)


def test_gguf_as_llama_cpp_writes_it(tmp_path):
    """An arcee GGUF as llama.cpp's converter writes it (Llama's: q / k rows permuted for interleaved pairs, YaRN's
    keys; no ffn_gate) gives transformers' logits past YaRN's original context."""
    from .test_config import write_gguf

    hf, ours = pair()
    meta = {"rope.scaling.type": "yarn", "rope.scaling.factor": 2.0, "rope.scaling.original_context_length": 32}
    path = write_gguf(tmp_path / "m.gguf", ours, meta=meta, arch="arcee")
    loaded = Llama.from_pretrained(path, cache_dir=False)
    ids = torch.randint(0, 101, (2, 40), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        assert (loaded(ids) - hf(ids).logits).abs().max().item() <= TOL
    assert loaded.config.rope_scaling["rope_type"] == "yarn" and type(loaded.model.layers[0].mlp) is FeedForward


def test_int8_drafts_and_trained_heads_see_the_model():
    """The int8 draft copy drafts losslessly; Hidden Transfer heads' training forward runs the upper layers (the
    ungated ReLU-squared MLP) as decoding runs them."""
    from triforce.models.quant import int8_copy

    from .test_heads import assert_perturbed_heads_train_as_they_decode

    model = tiny_family("arcee", 0)
    assert_greedy_equals_autoregressive(model, int8_copy(model), "speculative", {"gamma": 3})
    assert_perturbed_heads_train_as_they_decode(model)
