"""GPT-NeoX Japanese (``model_type="gpt_neox_japanese"``: abeja's gpt-neox-japanese-2.7b): GPT-NeoX's layer in
sequence (torch's LayerNorms with biases), its per-head interleaved ``query_key_value`` and ``dense`` unbiased but for
the last layer's output bias (``dense_bias``), RoPE on the first ``rotary_pct`` of each head, an unbiased ungated MLP
of the exact GELU ``hidden_size * intermediate_multiple_size`` wide, a tied head by default; against transformers'
GPTNeoXJapaneseForCausalLM."""
import pytest
import torch

from triforce.models import LlamaConfig
from triforce.models.llama import BiasLayerNorm, FeedForward

from .test_engines import TINY_CASES, assert_greedy_equals_autoregressive
from .test_families import TINY, assert_saved_reads_back, tiny_family, transformers_and_ours
from .test_sliding_window import assert_every_path_matches, assert_pass_equals_steps

transformers = pytest.importorskip("transformers")

BASE = {k: v for k, v in TINY.items() if k not in ("rms_norm_eps", "num_key_value_heads", "intermediate_size")} | {
    "num_hidden_layers": 3}
CASES = {"default": {},
         "half-rope-gelu-fast-untied": dict(rotary_pct=0.5, rotary_emb_base=5000.0, hidden_act="gelu_fast",
                                            intermediate_multiple_size=2, tie_word_embeddings=False,
                                            layer_norm_eps=1e-6, attention_dropout=0.1, hidden_dropout=0.1)}


def pair(case="default", **kw):
    """transformers' GPTNeoXJapaneseForCausalLM of ``case`` (random weights, biases and norms randomised) and ours."""
    return transformers_and_ours("GPTNeoXJapanese", **{**BASE, **CASES[case], **kw})


@pytest.mark.parametrize("case", list(CASES))
def test_logits_and_every_path_match_transformers(tmp_path, case):
    """Every path gives transformers' logits (the sequential layer, the interleaved query_key_value, the last layer's
    output bias, partial RoPE, the exact GELU or gelu_fast, the MLP's width); the checkpoint we save
    (gpt_neox_japanese.*, query_key_value interleaved again, dense_bias) reads back in transformers as the same
    model."""
    hf, ours = pair(case)
    c, layers = ours.config, ours.model.layers
    assert type(layers[0].mlp) is FeedForward and type(layers[0].input_layernorm) is BiasLayerNorm
    assert not c.parallel_block and (c.qkv_bias, c.out_bias, c.mlp_bias) == (False, False, False)
    assert [layer.self_attn.o_proj.bias is not None for layer in layers] == [False, False, True]
    assert c.intermediate_size == int(c.hidden_size * hf.config.intermediate_multiple_size)
    assert c.activation == ("gelu" if hf.config.hidden_act == "gelu" else "gelu_tanh")
    assert c.rotary_dim == int(16 * hf.config.rope_parameters["partial_rotary_factor"])
    assert c.tie_word_embeddings == hf.config.tie_word_embeddings
    assert_every_path_matches(hf, ours)
    assert_saved_reads_back(tmp_path, hf, ours)


def test_the_last_layers_output_bias_matters():
    """The last layer's dense_bias is read (its values change the logits), and no other layer has one."""
    hf, ours = pair()
    ids = torch.randint(0, 101, (1, 8), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        before = ours(ids)
        bias = ours.model.layers[-1].self_attn.o_proj.bias  # (not a constant: the LayerNorms would remove it)
        bias.add_(torch.randn(bias.shape, generator=torch.Generator().manual_seed(2)))
        assert (ours(ids) - before).abs().max() > 1e-3
    assert {n for n, _ in hf.named_parameters() if n.endswith("dense_bias")} == {
        "gpt_neox_japanese.layers.2.attention.dense_bias"}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_pass_gives_the_bits_of_one_token_steps(dtype):
    assert_pass_equals_steps(pair()[1], dtype)


def test_config_keys_and_defaults():
    """GPTNeoXJapaneseConfig's defaults (its 2.7B model's shape) and its own keys read; keys it does not read that the
    model would (biases, a width or KV heads of their own) refuse."""
    c, want = LlamaConfig.from_dict({"model_type": "gpt_neox_japanese"}), transformers.GPTNeoXJapaneseConfig()
    assert (c.vocab_size, c.hidden_size, c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads) == (
        want.vocab_size, want.hidden_size, want.num_hidden_layers, want.num_attention_heads, want.num_attention_heads)
    assert c.intermediate_size == want.hidden_size * want.intermediate_multiple_size
    assert (c.max_position_embeddings, c.rms_norm_eps, c.bos_token_id, c.eos_token_id, c.tie_word_embeddings) == (
        want.max_position_embeddings, want.layer_norm_eps, want.bos_token_id, want.eos_token_id,
        want.tie_word_embeddings)
    assert c.rope_theta == want.rope_parameters["rope_theta"] and c.rotary_dim == c.head_dim
    back = LlamaConfig.from_dict(c.to_dict())
    assert back.to_dict() == c.to_dict() and "intermediate_size" not in c.to_dict()
    assert c.to_dict()["intermediate_multiple_size"] == 4 and c.to_dict()["rotary_pct"] == 1.0
    for extra, match in (({"attention_bias": True}, "attention_bias"), ({"intermediate_size": 64}, "intermediate_size"),
                         ({"num_key_value_heads": 2}, "multi-head"), ({"intermediate_multiple_size": 0}, "> 0"),
                         ({"use_parallel_residual": True}, "use_parallel_residual")):
        with pytest.raises(ValueError, match=match):
            LlamaConfig.from_dict({"model_type": "gpt_neox_japanese", **extra})


@pytest.mark.parametrize("method,opts", [TINY_CASES[i] for i in (0, 3, 4, 6)],
                         ids=[f"{TINY_CASES[i][0]}-{i}" for i in (0, 3, 4, 6)])
def test_greedy_equals_autoregressive(method, opts):
    target, draft = (tiny_family("gpt_neox_japanese", seed, num_key_value_heads=4) for seed in (0, 1))
    assert target.model.layers[-1].self_attn.o_proj.bias is not None
    assert_greedy_equals_autoregressive(target, draft, method, opts)


def test_transformers_directory_loads(tmp_path):
    """transformers' own save of the model (its names, tied head, dense_bias) loads with its logits."""
    from triforce.models import Llama

    from .test_families import TOL

    hf, _ = pair("half-rope-gelu-fast-untied")
    hf.save_pretrained(tmp_path)
    ids = torch.randint(0, 101, (2, 24), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        assert (Llama.from_pretrained(tmp_path)(ids) - hf(ids).logits).abs().max().item() <= TOL
