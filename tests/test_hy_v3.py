"""Hunyuan V3 (``model_type="hy_v3"``: Tencent's Hy3): Llama's layer with q/k norms per head, DeepSeek-V3's router
without groups (always renormalised, times ``router_scaling_factor``) and ungated shared experts on its sparse layers;
against transformers' HYV3ForCausalLM."""
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
            num_key_value_heads=2, head_dim=16, max_position_embeddings=512, moe_intermediate_size=32, num_experts=8,
            num_experts_per_tok=3, num_shared_experts=2)
CASES = {"default": {}, "listed-biases-one-shared-tied": {
    "mlp_layer_types": ["sparse", "dense", "sparse", "sparse"], "mlp_bias": True, "attention_bias": True,
    "num_shared_experts": 1, "tie_word_embeddings": True, "router_scaling_factor": 1.5}}


def hy_v3(**kw):
    """A tiny random transformers HYV3ForCausalLM (its correction biases drawn from N(0, 1)) and ours."""
    return model_type_and_ours("hy_v3", ("e_score_correction_bias",), **{**BASE, **kw})


@pytest.mark.parametrize("case", list(CASES))
def test_every_path_and_our_save_match_transformers(tmp_path, case):
    hf, ours = hy_v3(**CASES[case])
    assert [type(layer.mlp) is SparseMoE for layer in ours.model.layers] == [
        t == "sparse" for t in hf.config.mlp_layer_types]
    assert_every_path_matches(hf, ours)
    back = assert_our_save_reads_back(tmp_path, hf, ours)
    assert back.mlp_layer_types == hf.config.mlp_layer_types
    assert back.router_scaling_factor == hf.config.router_scaling_factor
    assert_pass_equals_steps(ours, torch.float32)


def test_its_checkpoint_names_read_and_are_written(tmp_path):
    """transformers saves Hunyuan V3 under its checkpoints' names (mlp.router.gate, mlp.expert_bias, mlp.shared_mlp,
    the experts one by one): read from such a file, and ours written with the same names."""
    assert_saved_names_are_transformers(tmp_path, *hy_v3(), ["model.layers.1.mlp.router.gate.weight",
                                                            "model.layers.1.mlp.expert_bias",
                                                            "model.layers.1.mlp.shared_mlp.up_proj.weight"])


def test_its_prediction_layer_is_dropped_as_transformers_drops_it(tmp_path):
    """A checkpoint holding its multi-token prediction layer past the model's (model.layers.{n}.*): transformers
    ignores it; ours drops it likewise (the same logits)."""
    import safetensors.torch

    hf, ours = hy_v3()
    hf.save_pretrained(tmp_path)
    path = tmp_path / "model.safetensors"
    sd = safetensors.torch.load_file(path)
    sd.update({k.replace("layers.3.", "layers.4."): t + 1 for k, t in sd.items() if k.startswith("model.layers.3.")})
    safetensors.torch.save_file(sd, path, metadata={"format": "pt"})
    ids = torch.randint(0, 101, (2, 30), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        assert torch.equal(Llama.from_pretrained(tmp_path)(ids), ours(ids))


def test_the_router_matters():
    """Without the correction bias or the scaling factor the logits move past TOL (the tests above can fail)."""
    hf, ours = hy_v3()
    ids = torch.randint(0, 101, (2, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = hf(ids).logits
        for attr in ("e_score_correction_bias", "scale"):
            _, other = hy_v3()
            for m in other.modules():
                if type(m) is SparseMoE:
                    if attr == "scale":
                        m.scale = 1.0
                    else:
                        m.gate.e_score_correction_bias.zero_()
            assert (other(ids) - ref).abs().max().item() > 100 * TOL, attr


def test_defaults():
    """A config without the keys takes HYV3Config's: its shape and RoPE base, the first layer dense, 192 experts of
    1536, eight chosen, one shared, times 2.826."""
    c, want = LlamaConfig.from_dict({"model_type": "hy_v3"}), transformers.AutoConfig.for_model("hy_v3")
    for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                 "num_key_value_heads", "head_dim", "max_position_embeddings", "rms_norm_eps", "tie_word_embeddings",
                 "attention_bias", "mlp_bias", "bos_token_id", "eos_token_id", "pad_token_id"):
        assert getattr(c, name) == getattr(want, name), name
    assert c.rope_theta == want.rope_parameters["rope_theta"] and c.rope_scaling is None
    e = c.experts
    assert (e.count, e.top_k, e.intermediate_size, e.shared_intermediate_size, e.scale) == (
        want.num_experts, want.num_experts_per_tok, want.moe_intermediate_size,
        want.moe_intermediate_size * want.num_shared_experts, want.router_scaling_factor)
    assert e.layers == tuple(t == "sparse" for t in want.mlp_layer_types) and e.renormalize


@pytest.mark.parametrize("extra,match", [({"mlp_layer_types": ["sparse"]}, "mlp_layer_types"),
                                         ({"router_scaling_factor": 0}, "router_scaling_factor"),
                                         ({"enable_moe_fp32_combine": None}, "enable_moe_fp32_combine"),
                                         ({"num_experts_per_tok": 0}, "num_experts_per_tok")])
def test_what_would_not_be_read_so_raises(extra, match):
    with pytest.raises(ValueError, match=match):
        LlamaConfig.from_dict({"model_type": "hy_v3", **BASE, **extra})


@pytest.mark.parametrize("method,opts", [TINY_CASES[i] for i in (0, 3, 4, 6)],
                         ids=[f"{TINY_CASES[i][0]}-{i}" for i in (0, 3, 4, 6)])
def test_greedy_equals_autoregressive(method, opts):
    """The engines over a Hunyuan V3 model give its greedy tokens (a layer-skip draft for the two-model methods)."""
    _, ours = hy_v3(**CASES["listed-biases-one-shared-tied"])
    assert_greedy_equals_autoregressive(ours, ours.layer_skip(2), method, opts)
