"""Granite (``model_type="granite"``: IBM Granite 3.x dense): Llama's layer with an embedding multiplier, an
attention multiplier, a residual multiplier and a logits divisor, against transformers' GraniteForCausalLM; its
GGUF files as llama.cpp writes them."""
import pytest
import torch

from triforce.models import Llama, LlamaConfig

from .test_config import write_gguf
from .test_engines import TINY_CASES, assert_greedy_equals_autoregressive
from .test_families import TINY, transformers_and_ours
from .test_model import TOL
from .test_sliding_window import assert_every_path_matches, assert_pass_equals_steps

transformers = pytest.importorskip("transformers")

SCALES = dict(embedding_multiplier=12.0, attention_multiplier=0.03125, residual_multiplier=0.22, logits_scaling=8.0)
GRANITE = dict(TINY, num_hidden_layers=3, **SCALES, bos_token_id=1, eos_token_id=2, pad_token_id=None)


def pair(**kw):
    return transformers_and_ours("Granite", **{**GRANITE, **kw})


@pytest.mark.parametrize("kw", [{}, {"tie_word_embeddings": True, "attention_bias": True}])
def test_logits_and_every_path_match_transformers(kw):
    """The plain forward, a chunked prefill, a verify pass, steps and a tree over the cache give transformers'
    logits; our config reads back in transformers as the same model."""
    hf, ours = pair(**kw)
    c = ours.config
    assert (c.embedding_multiplier, c.attention_scale, c.residual_multiplier, c.logits_scaling) == \
        tuple(SCALES.values())
    assert_every_path_matches(hf, ours)
    back = transformers.GraniteConfig.from_dict(c.to_dict())
    assert all(getattr(back, k) == v for k, v in SCALES.items())


@pytest.mark.parametrize("key", list(SCALES))
def test_each_multiplier_matters(key):
    """Each number left at 1 moves the logits by more than ten times the tolerance: the test above would see any
    one of them dropped."""
    hf, _ = pair()
    _, ours = pair(**{key: 1.0})
    ids = torch.randint(0, 101, (1, 20), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        assert (ours(ids) - hf(ids).logits).abs().max().item() > 10 * TOL


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_pass_gives_the_bits_of_one_token_steps(dtype):
    assert_pass_equals_steps(pair()[1], dtype)


def test_bad_configs_raise():
    for bad, match in (({"residual_multiplier": 0}, "'residual_multiplier'"),
                       ({"logits_scaling": float("inf")}, "'logits_scaling'"),
                       ({"model_type": "llama", "embedding_multiplier": 2.0}, "'embedding_multiplier'")):
        with pytest.raises(ValueError, match=match):
            LlamaConfig.from_dict({**GRANITE, "model_type": "granite", **bad})
    # GraniteConfig's defaults: every multiplier 1 (the attention's too: scores unscaled)
    assert LlamaConfig.from_dict({**TINY, "model_type": "granite"}).attention_scale == 1.0


def tiny_granite(seed):
    torch.manual_seed(seed)
    return Llama(LlamaConfig(model_type="granite", vocab_size=64, hidden_size=32, intermediate_size=64,
                             num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                             max_position_embeddings=1024, initializer_range=0.3,
                             extra=dict(SCALES, attention_multiplier=0.25))).eval()


@pytest.mark.parametrize("method,opts", TINY_CASES, ids=[f"{m}-{i}" for i, (m, _) in enumerate(TINY_CASES)])
def test_greedy_equals_autoregressive(method, opts):
    assert_greedy_equals_autoregressive(tiny_granite(0), tiny_granite(1), method, opts)


def test_gguf_file_loads_as_llama_cpp_writes_it(tmp_path):
    """A granite GGUF (llama's tensors, q / k permuted, the multipliers as granite.embedding_scale,
    .attention.scale, .residual_scale and .logit_scale) loads with the logits of its model; elsewhere those keys
    raise unless they say nothing."""
    model = tiny_granite(0)
    meta = {"embedding_scale": 12.0, "attention.scale": 0.25, "residual_scale": 0.22, "logit_scale": 8.0}
    loaded = Llama.from_pretrained(write_gguf(tmp_path / "g.gguf", model, meta), cache_dir=False)
    assert loaded.config.model_type == "granite" and loaded.config.extra == {
        "embedding_multiplier": 12.0, "attention_multiplier": 0.25, "residual_multiplier": pytest.approx(0.22),
        "logits_scaling": 8.0}
    ids = torch.randint(0, 64, (2, 24), generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        assert (loaded(ids) - model(ids)).abs().max().item() <= 1e-4  # residual_scale is a float32 in the file
    llama = Llama(LlamaConfig(**{k: getattr(model.config, k) for k in ("vocab_size", "hidden_size",
                                                                      "intermediate_size", "num_hidden_layers",
                                                                      "num_attention_heads", "num_key_value_heads",
                                                                      "max_position_embeddings")})).eval()
    with pytest.raises(ValueError, match="llama.residual_scale"):
        Llama.from_pretrained(write_gguf(tmp_path / "l.gguf", llama, {"residual_scale": 0.22}), cache_dir=False)
