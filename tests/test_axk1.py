"""A.X-K1 (``model_type="axk1"``: SK Telecom's A.X-K1): DeepSeek-V3's layer (latent attention with a query rank, its
router and shared experts) with an RMSNorm on each sparse MLP's output; against transformers' AXK1ForCausalLM."""
import pytest
import torch

from triforce.models import Llama, LlamaConfig
from triforce.models.llama import LatentAttention, SparseMoE

from .test_engines import TINY_CASES, assert_greedy_equals_autoregressive
from .test_families import assert_our_save_reads_back, assert_saved_names_are_transformers, model_type_and_ours
from .test_model import TOL
from .test_sliding_window import assert_every_path_matches, assert_pass_equals_steps

transformers = pytest.importorskip("transformers")

BASE = dict(vocab_size=101, hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=4, max_position_embeddings=512, kv_lora_rank=16, q_lora_rank=24, qk_rope_head_dim=8,
            qk_nope_head_dim=8, v_head_dim=16, moe_intermediate_size=32, n_routed_experts=8, num_experts_per_tok=2,
            n_group=4, topk_group=2, n_shared_experts=1, bos_token_id=1, eos_token_id=2)
CASES = {"default": {}, "listed-not-renormalised-halves": {
    "mlp_layer_types": ["sparse", "dense", "sparse", "sparse"], "rope_interleave": False, "norm_topk_prob": False,
    "tie_word_embeddings": True}}


def axk1(**kw):
    """A tiny random transformers AXK1ForCausalLM (its correction biases drawn from N(0, 1)) and ours."""
    return model_type_and_ours("axk1", ("e_score_correction_bias",), **{**BASE, **kw})


@pytest.mark.parametrize("case", list(CASES))
def test_every_path_and_our_save_match_transformers(tmp_path, case):
    hf, ours = axk1(**CASES[case])
    assert all(type(layer.self_attn) is LatentAttention for layer in ours.model.layers)
    assert [type(layer.mlp) is SparseMoE for layer in ours.model.layers] == [
        t == "sparse" for t in hf.config.mlp_layer_types]
    assert all(("post_mlp_layernorm" in layer.mlp._modules) == (type(layer.mlp) is SparseMoE)
               for layer in ours.model.layers)
    assert_every_path_matches(hf, ours)
    back = assert_our_save_reads_back(tmp_path, hf, ours)
    for key in ("mlp_layer_types", "q_lora_rank", "rope_interleave", "n_group", "topk_group", "norm_topk_prob"):
        assert getattr(back, key) == getattr(hf.config, key), key
    assert_pass_equals_steps(ours, torch.float32)


def test_its_checkpoint_names_read_and_are_written(tmp_path):
    """transformers saves A.X-K1 under its checkpoints' names (each sparse layer's post_mlp_layernorm at the layer, the
    experts one by one): read from such a file, and ours written with the same names."""
    assert_saved_names_are_transformers(tmp_path, *axk1(), ["model.layers.1.post_mlp_layernorm.weight",
                                                           "model.layers.1.mlp.experts.0.gate_proj.weight"])


def test_a_dense_layers_norm_is_dropped_as_transformers_drops_it(tmp_path):
    """A checkpoint holding a post_mlp_layernorm on a dense layer: transformers' model has no module for it and ignores
    it on loading; ours drops it likewise (the same logits)."""
    import safetensors.torch

    hf, ours = axk1()
    hf.save_pretrained(tmp_path)
    path = tmp_path / "model.safetensors"
    sd = safetensors.torch.load_file(path)
    sd["model.layers.0.post_mlp_layernorm.weight"] = torch.full((64,), 3.0)  # (layer 0: dense)
    safetensors.torch.save_file(sd, path, metadata={"format": "pt"})
    theirs = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="eager").eval()
    ids = torch.randint(0, 101, (2, 30), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        assert torch.equal(Llama.from_pretrained(tmp_path)(ids), ours(ids))
        assert (ours(ids) - theirs(ids).logits).abs().max().item() <= TOL


def test_the_norm_matters():
    """Without the sparse MLPs' norm the logits move past TOL (the tests above can fail)."""
    hf, ours = axk1()
    ids = torch.randint(0, 101, (2, 30), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = hf(ids).logits
        for layer in ours.model.layers:
            layer.mlp._modules.pop("post_mlp_layernorm", None)
        assert (ours(ids) - ref).abs().max().item() > 100 * TOL


def test_defaults_and_the_legacy_layer_keys():
    """A config without the keys takes AXK1Config's (the first layer dense); AXK1Config's legacy keys
    first_k_dense_replace and moe_layer_freq make the same list transformers makes of them."""
    c, want = LlamaConfig.from_dict({"model_type": "axk1"}), transformers.AutoConfig.for_model("axk1")
    for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                 "max_position_embeddings", "rms_norm_eps", "tie_word_embeddings", "bos_token_id", "eos_token_id"):
        assert getattr(c, name) == getattr(want, name), name
    assert c.rope_theta == want.rope_parameters["rope_theta"] and c.mla.q_lora_rank == want.q_lora_rank
    e = c.experts
    assert (e.count, e.top_k, e.intermediate_size, e.renormalize, e.scale, e.groups) == (
        want.n_routed_experts, want.num_experts_per_tok, want.moe_intermediate_size, want.norm_topk_prob,
        want.routed_scaling_factor, (want.n_group, want.topk_group))
    assert e.layers == tuple(t == "sparse" for t in want.mlp_layer_types) and not e.layers[0]
    for legacy in ({"first_k_dense_replace": 2, "moe_layer_freq": 2}, {"first_k_dense_replace": 0}):
        want = transformers.AutoConfig.for_model("axk1", num_hidden_layers=7, **legacy).mlp_layer_types
        got = LlamaConfig.from_dict({"model_type": "axk1", "num_hidden_layers": 7, **legacy}).experts.layers
        assert got == tuple(t == "sparse" for t in want), legacy


@pytest.mark.parametrize("extra,match", [({"q_lora_rank": None}, "q_lora_rank"),
                                         ({"mlp_layer_types": ["sparse"]}, "mlp_layer_types"),
                                         ({"moe_layer_freq": 0}, "moe_layer_freq"),
                                         ({"scoring_func": "softmax"}, "scoring_func")])
def test_what_would_not_be_read_so_raises(extra, match):
    """No query rank (AXK1's attention always has one), a layer list of the wrong length, a zero frequency and
    another router raise naming the key."""
    with pytest.raises(ValueError, match=match):
        LlamaConfig.from_dict({"model_type": "axk1", **BASE, **extra})


@pytest.mark.parametrize("method,opts", [TINY_CASES[i] for i in (0, 3, 4, 6)],
                         ids=[f"{TINY_CASES[i][0]}-{i}" for i in (0, 3, 4, 6)])
def test_greedy_equals_autoregressive(method, opts):
    """The engines over an A.X-K1 model give its greedy tokens (a layer-skip draft for the two-model methods)."""
    _, ours = axk1(**CASES["listed-not-renormalised-halves"])
    assert_greedy_equals_autoregressive(ours, ours.layer_skip(2), method, opts)
