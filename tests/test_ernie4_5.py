"""ERNIE 4.5 (``model_type="ernie4_5"``: ERNIE-4.5-0.3B): Llama's layer with biases on every projection by its one
``use_bias`` key, RoPE on adjacent pairs of dims computed in float32 (its tables too) and rounded once, a tied head.
Against transformers' Ernie4_5ForCausalLM."""
import pytest
import torch

from triforce.models import Llama, LlamaConfig

from .test_engines import TINY_CASES, assert_greedy_equals_autoregressive
from .test_families import TINY, tiny_family, transformers_and_ours
from .test_sliding_window import assert_every_path_matches, assert_pass_equals_steps

transformers = pytest.importorskip("transformers")

ERNIE = dict(TINY, num_hidden_layers=3, pad_token_id=None, head_dim=16)


def pair(**kw):
    return transformers_and_ours("Ernie4_5", **{**ERNIE, **kw})


@pytest.mark.parametrize("kw", [{}, {"use_bias": True, "tie_word_embeddings": False}], ids=["tied", "biases-untied"])
def test_logits_and_every_path_match_transformers(tmp_path, kw):
    """The plain forward, a chunked prefill, a verify pass, steps and a tree over the cache give transformers' logits;
    the checkpoint we save (its q / k dims in its order, use_bias) reads back in transformers as the same model."""
    hf, ours = pair(**kw)
    c = ours.config
    biased = kw.get("use_bias", False)
    assert c.rope_interleaved and c.rope_float32 == "tables" and (c.qkv_bias, c.out_bias, c.mlp_bias) == (biased,) * 3
    assert_every_path_matches(hf, ours)
    ours.save_pretrained(tmp_path)
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="eager").eval()
    assert type(back).__name__ == "Ernie4_5ForCausalLM" and back.config.use_bias == biased
    assert all(torch.equal(t, hf.state_dict()[k]) for k, t in back.state_dict().items())
    ids = torch.randint(0, 101, (2, 30), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        assert torch.equal(Llama.from_pretrained(tmp_path)(ids), ours(ids))


def test_bfloat16_rope_in_float32_as_transformers():
    """In bfloat16 the RoPE tables stay float32 and the queries and keys are rotated in float32 and rounded once,
    bitwise transformers' ERNIE 4.5 rotation of the same projections (which also keeps its tables in float32)."""
    from transformers.models.ernie4_5.modeling_ernie4_5 import apply_rotary_pos_emb

    from triforce.models.loading import rotary_order
    from triforce.models.rope import apply_rope

    ours = pair()[1].to(torch.bfloat16)
    att = ours.model.layers[0].self_attn
    x = torch.randn(2, 7, 64, generator=torch.Generator().manual_seed(4)).to(torch.bfloat16)
    pos = torch.arange(7).expand(2, 7)
    cos, sin = ours.rope_tables(pos)[0]
    assert cos.dtype == torch.float32
    order = rotary_order(ours.config)  # our dim j is the checkpoint's dim order[j]
    with torch.no_grad():
        q, k, k_raw, _ = att.project(x, cos, sin)
        q_raw = att.q_proj(x).view(2, 7, 4, 16)
        # transformers' layout of the same tables: the first half's values, each twice (it interleaves them itself)
        hcos, hsin = (torch.cat([t[:, :, 0, :8], t[:, :, 0, :8]], -1) for t in (cos, sin))
        qt, kt = apply_rotary_pos_emb(q_raw[..., torch.argsort(order)].transpose(1, 2),
                                      k_raw[..., torch.argsort(order)].transpose(1, 2), hcos, hsin)
    assert torch.equal(q, qt.transpose(1, 2)[..., order]) and torch.equal(k, kt.transpose(1, 2)[..., order])
    assert not torch.equal(q, apply_rope(q_raw, cos.to(torch.bfloat16), sin.to(torch.bfloat16)))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_pass_gives_the_bits_of_one_token_steps(dtype):
    assert_pass_equals_steps(pair(use_bias=True)[1], dtype)


def test_defaults_and_bad_configs():
    """A config without the keys takes Ernie4_5Config's (no biases, 2 KV heads of 128, tied); its biases are use_bias's
    alone: attention_bias / mlp_bias keys raise, and a config that would split them raises."""
    d = LlamaConfig.from_dict({"model_type": "ernie4_5"})
    assert (d.num_key_value_heads, d.head_dim, d.tie_word_embeddings, d.qkv_bias) == (2, 128, True, False)
    assert d.to_dict()["use_bias"] is False and "attention_bias" not in d.to_dict()
    for bad in ({"attention_bias": True}, {"mlp_bias": True}):
        with pytest.raises(ValueError, match="use_bias"):
            LlamaConfig.from_dict({**TINY, "model_type": "ernie4_5", **bad})
    with pytest.raises(ValueError, match="must agree"):
        LlamaConfig(model_type="ernie4_5", attention_bias=True, mlp_bias=False)


def tiny_ernie4_5(seed):
    return tiny_family("ernie4_5", seed, head_dim=16, tie_word_embeddings=True, attention_bias=True, mlp_bias=True)


@pytest.mark.parametrize("method,opts", TINY_CASES, ids=[f"{m}-{i}" for i, (m, _) in enumerate(TINY_CASES)])
def test_greedy_equals_autoregressive(method, opts):
    assert_greedy_equals_autoregressive(tiny_ernie4_5(0), tiny_ernie4_5(1), method, opts)


def test_greedy_equals_autoregressive_in_bfloat16():
    """In bfloat16 (float32 RoPE tables beside bfloat16 caches): every method still emits autoregressive decoding's
    tokens."""
    target, draft = tiny_ernie4_5(0).to(torch.bfloat16), tiny_ernie4_5(1).to(torch.bfloat16)
    for method, opts in TINY_CASES[::2]:
        assert_greedy_equals_autoregressive(target, draft, method, opts)


def test_gguf_as_llama_cpp_writes_it(tmp_path):
    """An ernie4_5 GGUF as llama.cpp's converter writes an Ernie4_5ForCausalLM checkpoint (Llama's names, q / k rows as
    the checkpoint holds them, RoPE on consecutive pairs) gives transformers' logits; its blocks (gguf_copy,
    load_gguf_int8) compute the loaded model bitwise."""
    from .test_families import assert_converted_gguf_is_the_checkpoint, converted_kv

    hf, _ = pair()
    ours = assert_converted_gguf_is_the_checkpoint(tmp_path, hf, "ernie4_5", converted_kv(hf.config))
    assert ours.config.model_type == "ernie4_5" and ours.config.tie_word_embeddings
