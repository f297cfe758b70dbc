"""Nemotron (``model_type="nemotron"``: Nemotron-Mini-4B-Instruct, Minitron-4B / 8B, Nemotron-4): LayerNorm1P (torch's
LayerNorm with a bias, its weight applied as ``1 + w``), RoPE on the first half of each head, an ungated MLP of ReLU
squared. Against transformers' NemotronForCausalLM, and from GGUF as llama.cpp's converter writes it (the norms'
weights stored as ``1 + w``)."""
import pytest
import torch

from triforce.models import LlamaConfig
from triforce.models.llama import FeedForward, LayerNorm1P, RMSNorm

from .test_engines import TINY_CASES, assert_greedy_equals_autoregressive
from .test_families import TINY, assert_saved_reads_back, tiny_family, transformers_and_ours
from .test_sliding_window import assert_every_path_matches, assert_pass_equals_steps

transformers = pytest.importorskip("transformers")

CASES = {"half-rope": {}, "biases-quarter-rope": dict(attention_bias=True, mlp_bias=True, head_dim=32,
                                                     partial_rotary_factor=0.25, tie_word_embeddings=True)}


def pair(case="half-rope", **kw):
    """transformers' NemotronForCausalLM of ``case`` (random weights, biases and norms randomised) and ours."""
    return transformers_and_ours("Nemotron", **{**TINY, "num_hidden_layers": 3, **CASES[case], **kw})


@pytest.mark.parametrize("case", list(CASES))
def test_logits_and_every_path_match_transformers(tmp_path, case):
    """Every path gives transformers' logits (LayerNorm1P, partial RoPE, the ungated MLP); the checkpoint we save
    (norm_eps, the q / k dims back in the checkpoint's order) reads back in transformers as the same model."""
    hf, ours = pair(case)
    c = ours.config
    layer = ours.model.layers[0]
    assert type(layer.mlp) is FeedForward and type(layer.input_layernorm) is LayerNorm1P
    assert c.rotary_dim == int(c.head_dim * hf.config.rope_parameters["partial_rotary_factor"])
    assert_every_path_matches(hf, ours)
    assert_saved_reads_back(tmp_path, hf, ours)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_pass_gives_the_bits_of_one_token_steps(dtype):
    assert_pass_equals_steps(pair("biases-quarter-rope")[1], dtype)


def test_defaults_and_bad_configs():
    """A config without the keys takes NemotronConfig's (half of each head RoPE'd, ReLU squared, eps 1e-5 by
    norm_eps); another activation raises."""
    c = LlamaConfig.from_dict({**TINY, "model_type": "nemotron", "norm_eps": 1e-6})
    assert (c.rotary_dim, c.rms_norm_eps, c.activation, c.gated_mlp) == (8, 1e-6, "relu2", False)
    assert c.to_dict()["norm_eps"] == 1e-6 and LlamaConfig.from_dict(c.to_dict()).to_dict() == c.to_dict()
    with pytest.raises(ValueError, match="'hidden_act'"):
        LlamaConfig.from_dict({**TINY, "model_type": "nemotron", "hidden_act": "silu"})


@pytest.mark.parametrize("method,opts", TINY_CASES, ids=[f"{m}-{i}" for i, (m, _) in enumerate(TINY_CASES)])
def test_greedy_equals_autoregressive(method, opts):
    assert_greedy_equals_autoregressive(tiny_family("nemotron", 0), tiny_family("nemotron", 1), method, opts)


def test_int8_drafts_and_trained_heads_see_the_model():
    """The int8 draft copy drafts losslessly; Hidden Transfer heads' training forward runs the upper layers
    (LayerNorm1P, partial RoPE, the ungated MLP) as decoding runs them."""
    from triforce.models.quant import int8_copy

    from .test_heads import assert_perturbed_heads_train_as_they_decode

    model = tiny_family("nemotron", 0)
    assert_greedy_equals_autoregressive(model, int8_copy(model), "speculative", {"gamma": 3})
    assert_perturbed_heads_train_as_they_decode(model)
    # untrained heads' norms start at the final norm's factor, 1 + w (LayerNorm1P stores w)
    from triforce.heads import make_heads

    heads = make_heads("mlp", model.config, depth=2).init_from(model)
    norms = [m for m in heads.modules() if isinstance(m, RMSNorm)]
    assert norms and all(torch.equal(m.weight, model.model.norm.weight.float() + 1) for m in norms)


def write_nemotron_gguf(path, hf, rotary_dim: int, quant=None):
    """A nemotron GGUF of transformers' NemotronForCausalLM ``hf`` as llama.cpp's converter writes it: the norms'
    weights as ``1 + w`` (its layernorm1p), the gguf package's names, ``rotary_dim`` as rope.dimension_count, the
    LayerNorms' eps as attention.layer_norm_epsilon; ``quant``: as :func:`write_gguf_file`'s."""
    import gguf

    from .test_families import converted_kv, write_gguf_file

    c = hf.config
    kv = converted_kv(c, rotated=rotary_dim)
    kv["attention.layer_norm_epsilon"] = float(kv.pop("attention.layer_norm_rms_epsilon"))
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.NEMOTRON, c.num_hidden_layers)
    tensors = {}
    for name, t in hf.state_dict().items():
        if name == "lm_head.weight" and c.tie_word_embeddings:
            continue
        t = t.detach().float() + (1 if name.endswith("norm.weight") else 0)  # (the converter's layernorm1p)
        tensors[names.get_name(name, try_suffixes=(".weight", ".bias"))] = t.numpy()
    return write_gguf_file(path, "nemotron", kv, tensors, c, quant)


@pytest.mark.parametrize("case", list(CASES))
def test_gguf_as_llama_cpp_writes_it(tmp_path, case):
    """A nemotron GGUF as llama.cpp's converter writes it (the norms' weights as 1 + w, their biases beside them;
    rope.dimension_count the RoPE'd dims, NEOX RoPE so q / k rows as the checkpoint holds them; the LayerNorms' eps as
    attention.layer_norm_epsilon) gives transformers' logits; its blocks compute the loaded model bitwise."""
    import numpy as np

    from triforce.models import Llama

    from .test_families import QT, assert_blocks_compute_the_loaded_model, quantizer
    from .test_model import TOL

    hf, ours = pair(case)
    rotary = ours.config.rotary_dim
    ids = torch.randint(0, 101, (2, 40), generator=torch.Generator().manual_seed(3))
    loaded = Llama.from_pretrained(write_nemotron_gguf(tmp_path / "f32.gguf", hf, rotary), cache_dir=False)
    with torch.no_grad():
        ref = hf(ids).logits
        assert (loaded(ids) - ref).abs().max().item() <= TOL
    q = write_nemotron_gguf(tmp_path / "q.gguf", hf, rotary, quantizer(np.random.default_rng(0),
                                                                      types=(QT.Q8_0, QT.Q5_0)))
    assert (assert_blocks_compute_the_loaded_model(q, ids) - ref).abs().max().item() > TOL
    assert loaded.config.rotary_dim == rotary and type(loaded.model.norm) is LayerNorm1P
