"""MiniCPM3 (``model_type="minicpm3"``: openbmb's MiniCPM3-4B): DeepSeek-V2's multi-head latent attention with
half-split RoPE pairs (LongRoPE in its checkpoints), Llama's MLP, the embeddings times ``scale_emb`` (rounded to the
dtype first), each block's output times ``scale_depth / sqrt(num_hidden_layers)``, the final hidden states divided by
``hidden_size / dim_model_base`` before the head. Against transformers' MiniCPM3ForCausalLM."""
import numpy as np
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


@pytest.mark.parametrize("case", ["default", "longrope"])
def test_gguf_as_llama_cpp_writes_it(tmp_path, case):
    """A minicpm3 GGUF as llama.cpp's converter writes the checkpoint (DeepSeek-V2's latent attention tensors, the
    rows as they are: half-split RoPE pairs; LongRoPE's factors as rope_factors_long / short, over the file's whole
    context, which llama.cpp takes as LongRoPE's original one: the converter writes none; MiniCPM3's three numbers
    not in the file: llama.cpp fixes MiniCPM3-4B's, which the model here must have) gives transformers' logits; its
    blocks compute the loaded model bitwise (with llama.cpp as the oracle, the LongRoPE file at its whole context of
    512 tokens, which llama.cpp does not pad past: the short factors in both)."""
    from .test_families import assert_converted_gguf_is_the_checkpoint, converted_kv

    # (the value head: llama.cpp's hidden / heads; LongRoPE over an original context of the whole context, as
    # MiniCPM3-4B's: the file has no original context, which llama.cpp takes as the trained one)
    keys = {"rope_parameters": {**LONGROPE, "original_max_position_embeddings": 512},
            "max_position_embeddings": 512} if case == "longrope" else {}
    hf, _ = transformers_and_ours("MiniCPM3", **{**TINY, "num_hidden_layers": 3, **MLA, "scale_emb": 12,
                                                 "scale_depth": 1.4, "dim_model_base": 256, "v_head_dim": None, **keys})
    c = hf.config
    kv = {**converted_kv(c), "attention.key_length": c.qk_nope_head_dim + c.qk_rope_head_dim,
          "rope.dimension_count": c.qk_rope_head_dim, "attention.q_lora_rank": c.q_lora_rank,
          "attention.kv_lora_rank": c.kv_lora_rank}
    del kv["attention.value_length"]  # (the converter writes none: hidden / heads)
    tensors = {}
    rs = c.rope_parameters
    if rs.get("rope_type") == "longrope":
        tensors = {"rope_factors_long.weight": np.array(rs["long_factor"], np.float32),
                   "rope_factors_short.weight": np.array(rs["short_factor"], np.float32)}
    ours = assert_converted_gguf_is_the_checkpoint(tmp_path, hf, "minicpm3", kv, tensors=tensors)
    assert ours.config.model_type == "minicpm3" and ours.config.mla.v_head_dim == 64 // 4
