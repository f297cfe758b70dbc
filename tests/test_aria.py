"""Aria's language model (``model_type="aria_text"``: AriaTextForCausalLM, and AriaForConditionalGeneration's
checkpoints read text-only): Llama's attention, every layer a mixture routed by the softmax of the top k router
logits, its experts stacked as ``x @ W`` in its checkpoints, shared experts as one MLP; against transformers."""
import json

import pytest
import torch

from triforce.models import Llama, LlamaConfig
from triforce.models.llama import SparseMoE

from .test_engines import TINY_CASES, assert_greedy_equals_autoregressive
from .test_families import TOL, assert_save_loads, assert_saved_reads_back, randomize_, tiny_family
from .test_sliding_window import assert_every_path_matches, assert_pass_equals_steps

transformers = pytest.importorskip("transformers")

BASE = dict(vocab_size=101, hidden_size=64, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=128, rms_norm_eps=1e-5, moe_num_experts=4, moe_topk=2,
            moe_num_shared_experts=2)
CASES = {"default": {},
         "biased-one-shared-top3-tied": dict(mlp_bias=True, attention_bias=True, moe_num_shared_experts=1, moe_topk=3,
                                             tie_word_embeddings=True, head_dim=32)}


def pair(case="default"):
    """transformers' AriaTextForCausalLM of ``case`` (random weights: the stacked experts drawn, which transformers
    leaves at zero; biases and norms randomised) and ours."""
    from triforce.models.loading import _build

    torch.manual_seed(0)
    config = transformers.AriaTextConfig(**{**BASE, **CASES[case]}, attn_implementation="eager")
    hf = randomize_(transformers.AriaTextForCausalLM(config).eval())
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if ".experts." in name and p.dim() == 3:
                p.normal_(0, 0.2)
    return hf, _build(LlamaConfig.from_dict(hf.config.to_dict()), hf.state_dict(), None, None)


@pytest.mark.parametrize("case", list(CASES))
def test_logits_and_every_path_match_transformers(tmp_path, case):
    """Every path gives transformers' logits; the checkpoint we save (the router, the experts stacked as x @ W, the
    shared experts) reads back in transformers as the same model."""
    hf, ours = pair(case)
    moe = ours.model.layers[0].mlp
    assert type(moe) is SparseMoE and moe.softmax_of_top_k and moe.top_k == hf.config.moe_topk
    assert moe.shared_expert.up_proj.out_features == hf.config.intermediate_size * hf.config.moe_num_shared_experts
    assert (moe.shared_expert.up_proj.bias is not None) == hf.config.mlp_bias
    assert_every_path_matches(hf, ours)
    assert_saved_reads_back(tmp_path, hf, ours)


def test_each_part_moves_the_logits():
    """The routed experts (their stacked weights read transposed) and the shared experts both count."""
    hf, ours = pair()
    ids = torch.randint(0, 101, (2, 16), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        ref = hf(ids).logits
        assert (ours(ids) - ref).abs().max() <= TOL
        for layer in ours.model.layers:
            layer.mlp.experts[0].down_proj.weight.mul_(2)
        assert (ours(ids) - ref).abs().max() > 1e-3
        for layer in ours.model.layers:
            layer.mlp.experts[0].down_proj.weight.div_(2)
            layer.mlp.shared_expert.down_proj.weight.zero_()
        assert (ours(ids) - ref).abs().max() > 1e-3


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_pass_gives_the_bits_of_one_token_steps(dtype):
    assert_pass_equals_steps(pair()[1], dtype)


def test_config_keys_and_defaults():
    """AriaTextConfig's defaults read; its mixture's keys checked."""
    c, want = LlamaConfig.from_dict({"model_type": "aria_text"}), transformers.AriaTextConfig()
    assert (c.vocab_size, c.hidden_size, c.intermediate_size, c.num_hidden_layers, c.num_attention_heads,
            c.num_key_value_heads, c.head_dim, c.max_position_embeddings, c.rms_norm_eps, c.pad_token_id,
            c.bos_token_id, c.eos_token_id, c.tie_word_embeddings) == (
        want.vocab_size, want.hidden_size, want.intermediate_size, want.num_hidden_layers, want.num_attention_heads,
        want.num_key_value_heads, want.head_dim, want.max_position_embeddings, want.rms_norm_eps, want.pad_token_id,
        want.bos_token_id, want.eos_token_id, want.tie_word_embeddings)
    e = c.experts
    assert (e.count, e.top_k, e.intermediate_size, e.shared_intermediate_size, e.softmax_of_top_k) == (
        want.moe_num_experts, want.moe_topk, want.intermediate_size,
        want.intermediate_size * want.moe_num_shared_experts, True)
    assert LlamaConfig.from_dict(c.to_dict()).to_dict() == c.to_dict()
    assert c.to_dict()["architectures"] == ["AriaTextForCausalLM"]
    for extra, match in (({"moe_topk": 9}, "9"), ({"moe_num_experts": 0}, "moe_num_experts"),
                         ({"moe_num_shared_experts": -1}, "moe_num_shared_experts")):
        with pytest.raises(ValueError, match=match):
            LlamaConfig.from_dict({"model_type": "aria_text", **extra})


@pytest.mark.parametrize("method,opts", [TINY_CASES[i] for i in (0, 3, 4, 6)],
                         ids=[f"{TINY_CASES[i][0]}-{i}" for i in (0, 3, 4, 6)])
def test_greedy_equals_autoregressive(method, opts):
    extra = {"moe_num_experts": 4, "moe_topk": 2, "moe_num_shared_experts": 1}
    target, draft = (tiny_family("aria_text", seed, extra=extra) for seed in (0, 1))
    assert_greedy_equals_autoregressive(target, draft, method, opts)


def test_transformers_directories_load(tmp_path):
    """transformers' own saves load with its logits: AriaTextForCausalLM's, and AriaForConditionalGeneration's (its
    language model read, its vision tower and projector not)."""
    ids = torch.randint(0, 101, (2, 24), generator=torch.Generator().manual_seed(5))
    assert_save_loads(pair("biased-one-shared-top3-tied")[0], tmp_path / "causal", ids)
    hf2, _ = pair()
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, image_size=28,
                  patch_size=14)
    config = transformers.AriaConfig(text_config=hf2.config.to_dict(), vision_config=vision,
                                     projector_patch_to_query_dict={4: 4})
    torch.manual_seed(0)
    wrapped = transformers.AriaForConditionalGeneration(config).eval()
    wrapped.model.language_model.load_state_dict(hf2.model.state_dict())
    wrapped.lm_head.load_state_dict(hf2.lm_head.state_dict())
    wrapped.save_pretrained(tmp_path / "wrapped")
    assert json.loads((tmp_path / "wrapped" / "config.json").read_text())["model_type"] == "aria"
    with torch.no_grad():
        ref = hf2(ids).logits
        assert (wrapped(input_ids=ids).logits - ref).abs().max().item() <= TOL
        assert (Llama.from_pretrained(tmp_path / "wrapped")(ids) - ref).abs().max().item() <= TOL
