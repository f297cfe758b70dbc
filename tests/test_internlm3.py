"""InternLM3 (``model_type="internlm3"``: internlm3-8b-instruct, run by transformers as LlamaForCausalLM) and
transformers' dynamic NTK RoPE (``rope_type`` ``dynamic`` with a ``factor``, InternLM3's and some Llama finetunes'):
within the context it is plain RoPE at the base transformers computes at its start (the context's length M:
``base * ((factor * M / M) - (factor - 1)) ** (dim / (dim - 2))``, base itself unless that rounds), and no cache here
holds a position past the context, where transformers would grow the base."""
import pytest
import torch

from triforce.models import FullCache, Llama, LlamaConfig
from triforce.models.rope import rope_inv_freq

from .test_engines import TINY_CASES, assert_greedy_equals_autoregressive
from .test_families import TINY, randomize_, tiny_family
from .test_sliding_window import assert_every_path_matches, assert_pass_equals_steps

transformers = pytest.importorskip("transformers")


def dynamic(factor: float, theta: float = 10000.0) -> dict:
    return {"rope_type": "dynamic", "factor": factor, "rope_theta": theta}


def pair(model_type="internlm3", **kw):
    """A tiny random transformers model of ``model_type``'s config (eager attention, biases and norms randomised) and
    ours from its config and weights."""
    from triforce.models.loading import _build

    torch.manual_seed(0)
    config = transformers.AutoConfig.for_model(model_type, **{**TINY, "head_dim": 16, **kw},
                                               attn_implementation="eager")
    hf = randomize_(transformers.AutoModelForCausalLM.from_config(config).eval())
    return hf, _build(LlamaConfig.from_dict(hf.config.to_dict()), hf.state_dict(), None, None)


# 96 positions and factor 1.334: factor * 96 / 96 - 0.334 is 1 + 2^-52 in floating point, so transformers' starting
# base is rope_theta's next double up; a rope_theta half way between two float32 values (10000 + 2^-11) then rounds up
# to float32 where rope_theta itself rounds down (to even): the frequencies' bits move
MIDWAY = 10000.0 + 2.0 ** -11
CASES = {
    "internlm3-dynamic": ("internlm3", dict(rope_parameters=dynamic(6.0, 5e7))),
    "internlm3-biases-tied": ("internlm3", dict(qkv_bias=True, bias=True, tie_word_embeddings=True)),
    "llama-dynamic-rounds": ("llama", dict(max_position_embeddings=96, rope_parameters=dynamic(1.334, MIDWAY))),
}


@pytest.mark.parametrize("case", list(CASES))
def test_every_path_and_our_save_match_transformers(tmp_path, case):
    hf, ours = pair(CASES[case][0], **CASES[case][1])
    assert type(hf).__name__ == "LlamaForCausalLM"
    assert torch.equal(rope_inv_freq(ours.config), hf.model.rotary_emb.inv_freq)
    assert ours.config.attention_bias == ours.config.mlp_bias == hf.config.attention_bias
    assert_every_path_matches(hf, ours)
    ours.save_pretrained(tmp_path)
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="eager").eval()
    assert type(back.config) is type(hf.config)
    assert back.config.rope_parameters == hf.config.rope_parameters
    assert all(torch.equal(t, hf.state_dict()[k]) for k, t in back.state_dict().items())
    ids = torch.randint(0, 101, (2, 30), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        assert torch.equal(Llama.from_pretrained(tmp_path)(ids), ours(ids))


def test_the_starting_base_is_transformers_not_rope_theta():
    """Where factor * M / M - (factor - 1) rounds away from 1 (and the base's float32 rounding feels it), the
    frequencies are transformers' (from the base it computes), not plain RoPE's at rope_theta; at M = 512 the same
    factor gives rope_theta's exactly."""
    hf, ours = pair("llama", **CASES["llama-dynamic-rounds"][1])
    plain = ours.config.replace(rope_scaling=None)
    assert not torch.equal(rope_inv_freq(plain), hf.model.rotary_emb.inv_freq)
    at_512 = ours.config.replace(max_position_embeddings=512)
    assert torch.equal(rope_inv_freq(at_512), rope_inv_freq(plain))


def test_past_the_context_nothing_runs():
    """transformers grows the base once a forward passes the context; here no forward, prefill or cache goes there."""
    _, ours = pair("llama", **CASES["llama-dynamic-rounds"][1])
    with pytest.raises(ValueError, match="context"):
        ours(torch.zeros(1, 97, dtype=torch.long))
    with pytest.raises(ValueError, match="context"):
        FullCache(ours.config, 1, 97)
    with pytest.raises(ValueError, match="context"):
        ours.prefill(torch.zeros(1, 97, dtype=torch.long), FullCache(ours.config, 1, 96))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_pass_gives_the_bits_of_one_token_steps(dtype):
    assert_pass_equals_steps(pair(**CASES["internlm3-dynamic"][1])[1], dtype)


def test_defaults_and_bad_configs():
    """A config without the keys takes InternLM3Config's (the 8B shape); its bias keys must agree (with each other and
    with Llama's names); a dynamic RoPE needs its factor (alpha is Hunyuan's)."""
    c, want = LlamaConfig.from_dict({"model_type": "internlm3"}), transformers.AutoConfig.for_model("internlm3")
    for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                 "num_key_value_heads", "head_dim", "max_position_embeddings", "rms_norm_eps", "tie_word_embeddings",
                 "attention_bias", "mlp_bias"):
        assert getattr(c, name) == getattr(want, name), name
    for bad, match in (({"qkv_bias": True}, "must agree"), ({"qkv_bias": True, "attention_bias": False}, "disagree"),
                       ({"rope_scaling": {"rope_type": "dynamic"}}, "needs factor"),
                       ({"rope_scaling": {"rope_type": "dynamic", "alpha": 10.0}}, "Hunyuan")):
        with pytest.raises(ValueError, match=match):
            LlamaConfig.from_dict({"model_type": "internlm3", **bad})


def test_internlm3s_own_config_loads():
    """internlm3-8b-instruct's config.json as InternLM ships it (its remote code named in auto_map, qkv_bias / bias,
    dynamic RoPE of factor 6 at base 5e7) reads as transformers reads it."""
    d = {"architectures": ["InternLM3ForCausalLM"], "auto_map": {
        "AutoConfig": "configuration_internlm3.InternLM3Config", "AutoModel": "modeling_internlm3.InternLM3Model",
        "AutoModelForCausalLM": "modeling_internlm3.InternLM3ForCausalLM"}, "bias": False, "qkv_bias": False,
        "head_dim": 128, "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
        "intermediate_size": 10240, "max_position_embeddings": 32768, "model_type": "internlm3",
        "num_attention_heads": 32, "num_hidden_layers": 48, "num_key_value_heads": 2, "pad_token_id": 2,
        "bos_token_id": 1, "eos_token_id": 2, "rms_norm_eps": 1e-05, "rope_scaling": {"factor": 6.0,
                                                                                        "rope_type": "dynamic"},
        "rope_theta": 50000000, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        "transformers_version": "4.47.1", "use_cache": True, "vocab_size": 128512}
    c = LlamaConfig.from_dict(d)
    want = transformers.AutoConfig.for_model(**{k: v for k, v in d.items() if k != "auto_map"})
    assert (c.rope_type, c.rope_scaling["factor"], c.rope_theta) == ("dynamic", 6.0, 5e7)
    assert (c.num_key_value_heads, c.head_dim, c.attention_bias) == (want.num_key_value_heads, want.head_dim, False)
    assert torch.equal(rope_inv_freq(c), transformers.models.llama.modeling_llama.LlamaRotaryEmbedding(want).inv_freq)


@pytest.mark.parametrize("method,opts", [TINY_CASES[i] for i in (0, 2, 4, 6)],
                         ids=[f"{TINY_CASES[i][0]}-{i}" for i in (0, 2, 4, 6)])
def test_greedy_equals_autoregressive(method, opts):
    """(StreamingLLM's re-rotated keys among them: at the dynamic RoPE's starting frequencies.)"""
    def tiny(seed):
        return tiny_family("internlm3", seed, head_dim=8, rope_scaling={"rope_type": "dynamic", "factor": 1.334},
                           max_position_embeddings=96)
    assert_greedy_equals_autoregressive(tiny(0), tiny(1), method, opts)
