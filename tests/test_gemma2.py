"""Gemma 2 (``model_type="gemma2"``, transformers' Gemma2ForCausalLM): soft-capped attention scores and logits,
every other layer sliding, sandwich norms in Gemma's 1 + w, the scores scaled by query_pre_attn_scalar. Against
transformers on the same weights on every forward path, the HF round trips, a pass with the bits of steps,
every method's greedy tokens, and a GGUF as llama.cpp writes it read as transformers reads it."""
import pytest
import torch

from triforce.models import Llama, LlamaConfig

from .test_engines import TINY_CASES, assert_greedy_equals_autoregressive
from .test_families import TINY, randomize_
from .test_gemma3 import assert_random_heads_trees_lossless, gguf_read_as_transformers_reads_it, tiny_gemma
from .test_model import TOL
from .test_sliding_window import assert_every_path_matches, assert_pass_equals_steps

transformers = pytest.importorskip("transformers")

# small caps, so that they bend the tiny model's scores and logits
GEMMA2 = dict(TINY, num_hidden_layers=4, head_dim=16, sliding_window=6, query_pre_attn_scalar=24,
              attn_logit_softcapping=2.0, final_logit_softcapping=1.5)


def pair(**kw):
    from triforce.models.loading import _build

    torch.manual_seed(0)
    config = transformers.Gemma2Config(**{**GEMMA2, **kw}, attn_implementation="eager")
    hf = randomize_(transformers.Gemma2ForCausalLM(config).eval())
    return hf, _build(LlamaConfig.from_dict(hf.config.to_dict()), hf.state_dict(), None, None)


def test_config():
    _, ours = pair()
    c = ours.config
    assert c.model_type == "gemma2" and c.layer_windows == (6, 0, 6, 0) and c.attention_scale == 24 ** -0.5
    assert (c.attn_softcap, c.final_softcap, c.sandwich_norms, c.qk_norm, c.local_rope_theta) == (2.0, 1.5, True,
                                                                                                   False, None)
    assert LlamaConfig.from_dict(c.to_dict()) == c
    # the defaults of a config.json that leaves the keys out: transformers' (50 and 30, windows of 4096)
    d = {k: v for k, v in c.to_dict().items()
         if k not in ("attn_logit_softcapping", "final_logit_softcapping", "sliding_window", "layer_types")}
    d["max_position_embeddings"] = 8192
    c2 = LlamaConfig.from_dict(d)
    assert (c2.attn_softcap, c2.final_softcap, c2.layer_windows) == (50.0, 30.0, (4096, 0, 4096, 0))
    with pytest.raises(ValueError, match="_logit_softcapping' = "):
        LlamaConfig.from_dict({**c.to_dict(), "model_type": "gemma3_text"})  # only Gemma 2 caps


def test_logits_match_transformers(tmp_path):
    hf, ours = pair()
    ids, ref = assert_every_path_matches(hf, ours)
    assert ref.abs().max() <= 1.5  # the logits' cap
    # without the caps the logits differ: the test sees them
    plain = transformers.Gemma2ForCausalLM(transformers.Gemma2Config(
        **{**GEMMA2, "attn_logit_softcapping": None, "final_logit_softcapping": None},
        attn_implementation="eager")).eval()
    plain.load_state_dict(hf.state_dict())
    with torch.no_grad():
        assert (plain(ids).logits - ref).abs().max() > 0.1
    ours.save_pretrained(tmp_path / "ours")
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "ours", attn_implementation="eager").eval()
    assert type(back).__name__ == "Gemma2ForCausalLM"
    with torch.no_grad():
        assert (back(ids).logits - ref).abs().max().item() <= TOL
    hf.save_pretrained(tmp_path / "hf")
    saved = Llama.from_pretrained(tmp_path / "hf").config
    for name in ("layer_windows", "attention_scale", "attn_softcap", "final_softcap", "rope_theta"):
        assert getattr(saved, name) == getattr(ours.config, name), name


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_pass_gives_the_bits_of_one_token_steps(dtype):
    assert_pass_equals_steps(pair()[1], dtype)


def tiny_gemma2(seed):
    return tiny_gemma("gemma2", seed, extra={"sliding_window": 7, "query_pre_attn_scalar": 12,
                                             "attn_logit_softcapping": 3.0, "final_logit_softcapping": 4.0})


@pytest.mark.parametrize("method,opts", TINY_CASES, ids=[f"{m}-{i}" for i, (m, _) in enumerate(TINY_CASES)])
def test_greedy_equals_autoregressive(method, opts):
    assert_greedy_equals_autoregressive(tiny_gemma2(0), tiny_gemma2(1), method, opts)


def test_gguf_as_llama_cpp_writes_it_reads_as_transformers_reads_it(tmp_path):
    """A gemma2 GGUF (llama.cpp's names; norms stored as 1 + w; K-quants and Q8_0; the caps at llama.cpp's and
    transformers' defaults, 50 and 30, which transformers' GGUF reader assumes): the same weights bit for bit and
    the same settings as transformers' reading of the file, so our forward from the file is bitwise our forward
    from transformers' reading."""
    config = LlamaConfig(model_type="gemma2", vocab_size=400, hidden_size=256, intermediate_size=512,
                         num_hidden_layers=4, num_attention_heads=1, num_key_value_heads=1, head_dim=256,
                         max_position_embeddings=512, rms_norm_eps=1e-6, tie_word_embeddings=True,
                         extra={"sliding_window": 8, "query_pre_attn_scalar": 256, "attn_logit_softcapping": 50.0,
                                "final_logit_softcapping": 30.0})
    torch.manual_seed(0)
    model = randomize_(Llama(config).eval())
    ours, _, _ = gguf_read_as_transformers_reads_it(
        tmp_path, model, {"attention.sliding_window": 8, "attn_logit_softcapping": 50.0,
                          "final_logit_softcapping": 30.0}, "Gemma2ForCausalLM",
        ("layer_windows", "attention_scale", "attn_softcap", "final_softcap"))
    c = ours.config
    assert c.layer_windows == (8, 0, 8, 0) and (c.attn_softcap, c.final_softcap) == (50.0, 30.0)


@pytest.mark.parametrize("kind", ["medusa", "mlp", "early_exit", "hidden_transfer"])
def test_random_heads_trees_are_lossless(kind):
    """Draft heads on a Gemma 2 target (capped logits, sliding layers; Hidden Transfer's pseudo tokens in the
    target's capped pass)."""
    assert_random_heads_trees_lossless(tiny_gemma2(0), kind)


def test_the_config_google_ships_loads():
    """gemma-2-2b-it's config.json as Google ships it (with generate()'s ``cache_implementation`` and both
    activation keys): every other layer sliding over 4096, caps 50 and 30."""
    d = {"architectures": ["Gemma2ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
         "attn_logit_softcapping": 50.0, "bos_token_id": 2, "cache_implementation": "hybrid", "eos_token_id": [1, 107],
         "final_logit_softcapping": 30.0, "head_dim": 256, "hidden_act": "gelu_pytorch_tanh",
         "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 2304, "initializer_range": 0.02,
         "intermediate_size": 9216, "max_position_embeddings": 8192, "model_type": "gemma2", "num_attention_heads": 8,
         "num_hidden_layers": 26, "num_key_value_heads": 4, "pad_token_id": 0, "query_pre_attn_scalar": 256,
         "rms_norm_eps": 1e-06, "rope_theta": 10000.0, "sliding_window": 4096, "torch_dtype": "float32",
         "transformers_version": "4.42.4", "use_cache": True, "vocab_size": 256000}
    c = LlamaConfig.from_dict(d)
    assert c.layer_windows == (4096, 0) * 13 and (c.attn_softcap, c.final_softcap) == (50.0, 30.0)
    assert c.attention_scale == 1 / 16
