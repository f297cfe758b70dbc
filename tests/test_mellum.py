"""Mellum 2 (``model_type="mellum"``: JetBrains' Mellum2-12B-A2.5B): Qwen3-MoE's layer with a window on the
``layer_types``' sliding layers, a RoPE per layer type (OLMo 3's way) and its dense and sparse layers listed; against
transformers' MellumForCausalLM."""
import pytest
import torch

from triforce.models import Llama, LlamaConfig
from triforce.models.llama import SparseMoE

from .test_engines import TINY_CASES, assert_greedy_equals_autoregressive
from .test_families import assert_our_save_reads_back, assert_saved_names_are_transformers, model_type_and_ours
from .test_model import TOL
from .test_sliding_window import assert_every_path_matches, assert_pass_equals_steps

transformers = pytest.importorskip("transformers")

BASE = dict(vocab_size=101, hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, max_position_embeddings=512, sliding_window=6, moe_intermediate_size=32,
            num_experts=8, num_experts_per_tok=3)
TYPES = ["sliding_attention", "full_attention", "sliding_attention", "sliding_attention"]
CASES = {"default": {}, "windows-dense-bases-tied": {
    "layer_types": TYPES, "mlp_layer_types": ["dense", "sparse", "sparse", "sparse"], "norm_topk_prob": False,
    "tie_word_embeddings": True, "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 5e5},
                                                     "sliding_attention": {"rope_type": "default", "rope_theta": 1e3}}}}


def mellum(**kw):
    """A tiny random transformers MellumForCausalLM and ours."""
    return model_type_and_ours("mellum", **{**BASE, **kw})


@pytest.mark.parametrize("case", list(CASES))
def test_every_path_and_our_save_match_transformers(tmp_path, case):
    hf, ours = mellum(**CASES[case])
    c = ours.config
    sliding = tuple(t == "sliding_attention" for t in hf.config.layer_types)
    assert c.layer_windows == tuple(6 if s else 0 for s in sliding) and c.rope_layers == tuple(not s for s in sliding)
    assert c.local_rope_theta == hf.config.rope_parameters["sliding_attention"]["rope_theta"]
    assert [type(layer.mlp) is SparseMoE for layer in ours.model.layers] == [
        t == "sparse" for t in hf.config.mlp_layer_types]
    assert_every_path_matches(hf, ours)
    back = assert_our_save_reads_back(tmp_path, hf, ours)
    for key in ("layer_types", "mlp_layer_types", "rope_parameters", "norm_topk_prob"):
        assert getattr(back, key) == getattr(hf.config, key), key
    assert_pass_equals_steps(ours, torch.float32)


def test_its_checkpoint_names_read_and_are_written_and_its_prediction_head_skipped(tmp_path):
    """transformers saves Mellum with its experts one by one: read and written so; a checkpoint's mtp.* weights (its
    prediction head) skipped on loading, as transformers skips them."""
    import safetensors.torch

    hf, ours = mellum(**CASES["windows-dense-bases-tied"])
    assert_saved_names_are_transformers(tmp_path, hf, ours, ["model.layers.1.mlp.experts.0.gate_proj.weight"])
    path = tmp_path / "hf" / "model.safetensors"
    sd = safetensors.torch.load_file(path)
    sd["mtp.layers.0.input_layernorm.weight"] = torch.ones(64)
    safetensors.torch.save_file(sd, path, metadata={"format": "pt"})
    ids = torch.randint(0, 101, (2, 30), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        assert torch.equal(Llama.from_pretrained(tmp_path / "hf")(ids), ours(ids))


@pytest.mark.parametrize("change", [{"layer_types": ["full_attention"] * 4},
                                    {"rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 5e5},
                                                         "sliding_attention": {"rope_type": "default",
                                                                               "rope_theta": 5e5}}}],
                         ids=["no-window", "one-base"])
def test_the_window_and_the_sliding_base_matter(change):
    """Without its window, or with the full layers' base on the sliding ones, the logits move past TOL."""
    from triforce.models.loading import _build

    hf, ours = mellum(**CASES["windows-dense-bases-tied"])
    ids = torch.randint(0, 101, (2, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        other = _build(LlamaConfig.from_dict({**hf.config.to_dict(), **change}), hf.state_dict(), None, None)
        assert (other(ids) - hf(ids).logits).abs().max().item() > 100 * TOL


def test_defaults():
    """A config without the keys takes MellumConfig's: its shape, every layer full and sparse, base 5e5 (1e4 on sliding
    layers), 64 experts of 896, eight chosen and renormalised."""
    c, want = LlamaConfig.from_dict({"model_type": "mellum"}), transformers.AutoConfig.for_model("mellum")
    for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                 "num_key_value_heads", "head_dim", "max_position_embeddings", "rms_norm_eps", "tie_word_embeddings",
                 "bos_token_id", "eos_token_id", "pad_token_id"):
        assert getattr(c, name) == getattr(want, name), name
    assert c.rope_theta == want.rope_parameters["full_attention"]["rope_theta"] and c.rope_scaling is None
    assert c.local_rope_theta == want.rope_parameters["sliding_attention"]["rope_theta"]
    assert not any(c.layer_windows) and c.rope_layers == (True,) * c.num_hidden_layers
    e = c.experts
    assert (e.count, e.top_k, e.intermediate_size, e.renormalize) == (
        want.num_local_experts, want.num_experts_per_tok, want.moe_intermediate_size, want.norm_topk_prob)
    assert e.layers == (True,) * c.num_hidden_layers


@pytest.mark.parametrize("extra,match", [
    ({"sliding_window": None, "layer_types": TYPES}, "sliding_window"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 1e4}}, "one dict per layer type"),
    ({"rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 5e5},
                          "sliding_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4}}},
     "sliding_attention"),
    ({"rope_local_base_freq": 1e4}, "rope_local_base_freq"), ({"mlp_layer_types": ["sparse"]}, "mlp_layer_types"),
    ({"num_nextn_predict_layers": 2}, "num_nextn_predict_layers")])
def test_what_would_not_be_read_so_raises(extra, match):
    """A sliding layer without a window, one RoPE for both layer types (MellumConfig's rotary reads them per type), a
    scaled RoPE on the sliding layers, Gemma 3's key, a layer list of the wrong length and two prediction layers
    (MellumConfig refuses them) raise."""
    with pytest.raises(ValueError, match=match):
        LlamaConfig.from_dict({"model_type": "mellum", **BASE, **extra})


@pytest.mark.parametrize("method,opts", [TINY_CASES[i] for i in (0, 3, 4, 6)],
                         ids=[f"{TINY_CASES[i][0]}-{i}" for i in (0, 3, 4, 6)])
def test_greedy_equals_autoregressive(method, opts):
    """The engines over a Mellum model (a window of 6 the prompts and drafts cross, two RoPE bases) give its greedy
    tokens (a layer-skip draft for the two-model methods)."""
    _, ours = mellum(**CASES["windows-dense-bases-tied"])
    assert_greedy_equals_autoregressive(ours, ours.layer_skip(2), method, opts)
