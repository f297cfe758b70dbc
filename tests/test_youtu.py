"""Youtu (``model_type="youtu"``: Tencent's Youtu-LLM 2B): DeepSeek-V3's multi-head latent attention (the queries from
a low-rank projection where ``q_lora_rank``, RoPE on adjacent pairs by ``rope_interleave``) with Llama's dense MLP on
every layer, a tied head by default. Against transformers' YoutuForCausalLM."""
import pytest
import torch

from triforce.models import LlamaConfig
from triforce.models.llama import MLP

from .test_engines import TINY_CASES, assert_greedy_equals_autoregressive
from .test_families import TINY, assert_saved_reads_back, tiny_family, transformers_and_ours
from .test_sliding_window import assert_every_path_matches, assert_pass_equals_steps

transformers = pytest.importorskip("transformers")

MLA = dict(num_key_value_heads=4, kv_lora_rank=16, q_lora_rank=24, qk_nope_head_dim=8, qk_rope_head_dim=8,
           v_head_dim=12)
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32, "mscale_all_dim": 1.0,
        "rope_theta": 10000.0}
CASES = {"default": {}, "q-full-half-split-untied-yarn": dict(q_lora_rank=None, rope_interleave=False,
                                                              tie_word_embeddings=False, rope_parameters=YARN)}


def pair(case="default"):
    return transformers_and_ours("Youtu", **{**TINY, "num_hidden_layers": 3, **MLA, **CASES[case]})


@pytest.mark.parametrize("case", list(CASES))
def test_every_path_and_our_save_match_transformers(tmp_path, case):
    hf, ours = pair(case)
    c = ours.config
    assert c.mla is not None and c.experts is None and c.mla.rope_interleaved == hf.config.rope_interleave
    assert all(type(layer.mlp) is MLP for layer in ours.model.layers)
    assert (c.num_key_value_heads, c.head_dim) == (1, MLA["kv_lora_rank"] + MLA["qk_rope_head_dim"])
    assert_every_path_matches(hf, ours)
    assert_saved_reads_back(tmp_path, hf, ours)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_pass_gives_the_bits_of_one_token_steps(dtype):
    assert_pass_equals_steps(pair()[1], dtype)


def test_defaults_and_bad_configs():
    """A config without the keys takes YoutuConfig's (Youtu-LLM 2B's shape, DeepSeek-V3's latent dims, adjacent RoPE
    pairs, tied); a mixture's key or per-head values other than MLA's raise."""
    c, want = LlamaConfig.from_dict({"model_type": "youtu"}), transformers.YoutuConfig()
    for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                 "max_position_embeddings", "rms_norm_eps", "tie_word_embeddings"):
        assert getattr(c, name) == getattr(want, name), name
    m = c.mla
    assert (m.q_lora_rank, m.kv_lora_rank, m.qk_nope_head_dim, m.qk_rope_head_dim, m.v_head_dim,
            m.rope_interleaved) == (want.q_lora_rank, want.kv_lora_rank, want.qk_nope_head_dim,
                                    want.qk_rope_head_dim, want.v_head_dim, want.rope_interleave)
    assert c.to_dict()["head_dim"] == want.head_dim and c.to_dict()["num_key_value_heads"] == want.num_key_value_heads
    for bad, match in (({"n_routed_experts": 8}, "n_routed_experts"), ({"num_key_value_heads": 2}, "num_key_value"),
                       ({"first_k_dense_replace": 1}, "first_k_dense_replace")):
        with pytest.raises(ValueError, match=match):
            LlamaConfig.from_dict({"model_type": "youtu", **bad})


@pytest.mark.parametrize("method,opts", [TINY_CASES[i] for i in (0, 2, 4, 6)],
                         ids=[f"{TINY_CASES[i][0]}-{i}" for i in (0, 2, 4, 6)])
def test_greedy_equals_autoregressive(method, opts):
    def tiny(seed):
        return tiny_family("youtu", seed, num_key_value_heads=None, head_dim=None, extra=dict(
            kv_lora_rank=8, q_lora_rank=12, qk_nope_head_dim=4, qk_rope_head_dim=4, v_head_dim=6))
    assert_greedy_equals_autoregressive(tiny(0), tiny(1), method, opts)
