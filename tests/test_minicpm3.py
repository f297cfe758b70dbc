"""MiniCPM3 (``model_type="minicpm3"``: openbmb's MiniCPM3-4B): DeepSeek-V2's multi-head latent attention with
half-split RoPE pairs (LongRoPE in its checkpoints), Llama's MLP, the embeddings times ``scale_emb`` (rounded to the
dtype first), each block's output times ``scale_depth / sqrt(num_hidden_layers)``, the final hidden states divided by
``hidden_size / dim_model_base`` before the head. Against transformers' MiniCPM3ForCausalLM."""
import pytest
import torch

from triforce.models import LlamaConfig

from .test_engines import TINY_CASES, assert_greedy_equals_autoregressive
from .test_families import TINY, assert_saved_reads_back, tiny_family, transformers_and_ours
from .test_model import TOL
from .test_sliding_window import assert_every_path_matches, assert_pass_equals_steps

transformers = pytest.importorskip("transformers")

MLA = dict(num_key_value_heads=4, kv_lora_rank=16, q_lora_rank=24, qk_nope_head_dim=8, qk_rope_head_dim=8,
           v_head_dim=12, dim_model_base=16)
# LongRoPE over the 8 RoPE'd dims (4 pairs) past an original context of 24 (the tests' 40 tokens take the long factors)
LONGROPE = {"rope_type": "longrope", "rope_theta": 10000.0, "original_max_position_embeddings": 24,
            "short_factor": [1.0, 1.2, 1.5, 2.0], "long_factor": [1.5, 3.0, 5.0, 9.0]}
CASES = {"default": {}, "q-full-no-scales-untied": dict(q_lora_rank=None, scale_depth=None, dim_model_base=None,
                                                        scale_emb=3.3, tie_word_embeddings=False),
         "longrope": dict(rope_parameters=LONGROPE, max_position_embeddings=96)}


def pair(case="default"):
    return transformers_and_ours("MiniCPM3", **{**TINY, "num_hidden_layers": 3, **MLA, **CASES[case]})


@pytest.mark.parametrize("case", list(CASES))
def test_every_path_and_our_save_match_transformers(tmp_path, case):
    hf, ours = pair(case)
    c = ours.config
    assert c.mla is not None and not c.mla.rope_interleaved and c.experts is None
    assert c.rounded_embed_factor == hf.config.scale_emb
    assert c.residual_multiplier == hf.config.scale_depth / c.num_hidden_layers ** 0.5
    assert c.head_divisor == hf.config.logits_scaling
    assert_every_path_matches(hf, ours)
    assert_saved_reads_back(tmp_path, hf, ours)


def test_each_number_matters():
    """Each of the three numbers left at 1 moves the logits past the tests' tolerance."""
    from triforce.models.loading import _build

    hf, ours = pair()
    ids = torch.randint(0, 101, (2, 30), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ref = hf(ids).logits
        for key in ("scale_emb", "scale_depth", "dim_model_base"):
            one = {"scale_emb": 1, "scale_depth": ours.config.num_hidden_layers ** 0.5, "dim_model_base": 64}[key]
            other = ours.config.replace(extra={**ours.config.extra, key: one})
            assert (_build(other, hf.state_dict(), None, None)(ids) - ref).abs().max().item() > 10 * TOL, key


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_pass_gives_the_bits_of_one_token_steps(dtype):
    assert_pass_equals_steps(pair()[1], dtype)


def test_defaults_and_bad_configs():
    """A config without the keys takes MiniCPM3Config's (MiniCPM3-4B's shape and numbers, v_head_dim hidden / heads);
    per-head values other than MLA's or a bias on the attention raise."""
    c, want = LlamaConfig.from_dict({"model_type": "minicpm3"}), transformers.MiniCPM3Config()
    for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                 "max_position_embeddings", "rms_norm_eps", "tie_word_embeddings"):
        assert getattr(c, name) == getattr(want, name), name
    m = c.mla
    assert (m.q_lora_rank, m.kv_lora_rank, m.qk_nope_head_dim, m.qk_rope_head_dim, m.v_head_dim) == (
        want.q_lora_rank, want.kv_lora_rank, want.qk_nope_head_dim, want.qk_rope_head_dim, want.v_head_dim)
    assert (c.rounded_embed_factor, c.head_divisor) == (want.scale_emb, want.logits_scaling)
    assert c.residual_multiplier == want.scale_depth / want.num_hidden_layers ** 0.5
    for bad, match in (({"num_key_value_heads": 2}, "num_key_value"), ({"attention_bias": True}, "attention_bias"),
                       ({"scale_emb": "12"}, "scale_emb")):
        with pytest.raises(ValueError, match=match):
            LlamaConfig.from_dict({"model_type": "minicpm3", **bad})


@pytest.mark.parametrize("method,opts", [TINY_CASES[i] for i in (0, 2, 4, 6)],
                         ids=[f"{TINY_CASES[i][0]}-{i}" for i in (0, 2, 4, 6)])
def test_greedy_equals_autoregressive(method, opts):
    def tiny(seed):
        return tiny_family("minicpm3", seed, num_key_value_heads=None, head_dim=None, extra=dict(
            kv_lora_rank=8, q_lora_rank=12, qk_nope_head_dim=4, qk_rope_head_dim=4, v_head_dim=6, dim_model_base=16))
    assert_greedy_equals_autoregressive(tiny(0), tiny(1), method, opts)
