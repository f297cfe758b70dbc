"""GPT-2 (``model_type="gpt2"``: gpt2 to gpt2-xl, distilgpt2, DialoGPT, Cerebras-GPT): learned absolute position
embeddings instead of RoPE, Conv1D weights with q, k and v as one ``c_attn``, its config's and checkpoints' names
(gpt2's own unprefixed ones too); against transformers' GPT2LMHeadModel."""
import pytest
import torch

from triforce.models import FullCache, LlamaConfig

from .test_engines import TINY_CASES, assert_greedy_equals_autoregressive
from .test_families import (assert_edited_save_reads_the_same, assert_our_save_reads_back,
                            assert_saved_names_are_transformers, model_type_and_ours, old_attention_buffers)
from .test_model import TOL
from .test_sliding_window import assert_every_path_matches, assert_pass_equals_steps

transformers = pytest.importorskip("transformers")

BASE = dict(vocab_size=101, n_embd=64, n_layer=3, n_head=4, n_positions=512, bos_token_id=1, eos_token_id=2,
            initializer_range=0.2)  # (weights wide enough for the attention to see positions)
CASES = {"default": {},
         "relu-inner-unscaled": {"activation_function": "relu", "n_inner": 80, "scale_attn_weights": False},
         "gelu-untied": {"activation_function": "gelu", "tie_word_embeddings": False}}


def gpt2(**kw):
    """A tiny random transformers GPT2LMHeadModel and ours."""
    return model_type_and_ours("gpt2", **{**BASE, **kw})


@pytest.mark.parametrize("case", list(CASES))
def test_every_path_and_our_save_match_transformers(tmp_path, case):
    hf, ours = gpt2(**CASES[case])
    c = ours.config
    assert (c.position_offset, c.rope_layers, c.intermediate_size, c.attention_bias, c.mlp_bias) == (
        0, (False,) * 3, hf.config.n_inner or 4 * hf.config.n_embd, True, True)
    assert c.attention_scale == (0.25 if hf.config.scale_attn_weights else 1.0)
    assert_every_path_matches(hf, ours)
    assert_our_save_reads_back(tmp_path, hf, ours, keys=("n_embd", "n_layer", "n_head", "n_positions", "n_inner",
                                                         "layer_norm_epsilon", "activation_function",
                                                         "scale_attn_weights", "tie_word_embeddings"))
    assert_pass_equals_steps(ours, torch.float32)


def test_a_pass_gives_the_bits_of_one_token_steps_in_bfloat16():
    _, ours = gpt2()
    assert_pass_equals_steps(ours, torch.bfloat16)


def test_its_checkpoint_names_read_and_are_written_unprefixed_ones_read_and_old_buffers_dropped(tmp_path):
    """Its checkpoints' names (transformer.wpe, transformer.h.*.attn.c_attn, mlp.c_fc, ln_1, ln_2, ln_f; Conv1D
    weights, [in, out]) read and written; gpt2's own checkpoints' unprefixed names (GPT2Model's: wte, wpe, h.*,
    ln_f) read the same; an old checkpoint's attention buffers (attn.bias, attn.masked_bias) dropped."""
    hf, ours = gpt2()
    assert_saved_names_are_transformers(tmp_path, hf, ours, ["transformer.wpe.weight",
                                                            "transformer.h.0.attn.c_attn.weight",
                                                            "transformer.h.0.attn.c_attn.bias",
                                                            "transformer.h.0.mlp.c_fc.weight",
                                                            "transformer.h.0.ln_2.bias"])

    def unprefixed(sd):  # (gpt2's own checkpoint: GPT2Model's names, an old one's buffers)
        sd = {k.removeprefix("transformer."): t for k, t in sd.items()}
        assert "wpe.weight" in sd and "h.2.attn.c_proj.weight" in sd
        return {**sd, **old_attention_buffers("h.0.attn.")}

    assert_edited_save_reads_the_same(tmp_path, ours, unprefixed)


def test_the_positions_and_the_weights_layout_matter(monkeypatch):
    """The learned positions zeroed, or the attention's output projection (c_proj, square) read without Conv1D's
    transpose, move the logits past TOL (the tests above can fail); ``embed`` without positions takes a plain
    forward's."""
    import re

    from triforce.models import loading

    hf, ours = gpt2()
    ids = torch.randint(0, 101, (2, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = hf(ids).logits
        at = torch.arange(40).expand(2, 40)  # (embed's default positions: a plain forward's)
        assert torch.equal(ours.embed(ids), ours.embed(ids, at)) and not torch.equal(ours.embed(ids), ours.embed(
            ids, at + 1))
        ours.model.embed_positions.weight.zero_()
        assert (ours(ids) - ref).abs().max().item() > 100 * TOL
        without_o = re.compile(r".*\.(self_attn\.qkv_proj|mlp\.(up|down)_proj)\.weight")  # (not o_proj)
        monkeypatch.setattr(loading, "_GPT2_CONV1D", without_o)
        other = loading._build(LlamaConfig.from_dict(hf.config.to_dict()), hf.state_dict(), None, None)
        assert (other(ids) - ref).abs().max().item() > 100 * TOL


def test_a_speculative_tail_past_the_context_reads_the_last_position():
    """A cache's speculative slack holds tokens past the model's context (verified, never emitted): they read the
    last learned position instead of failing, and the tokens within the context keep transformers' logits."""
    hf, ours = gpt2(n_positions=48)
    ids = torch.randint(0, 101, (1, 52), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ref = hf(ids[:, :48]).logits
        cache = FullCache(ours.config, 1, 52, speculative_slack=4)
        ours.prefill(ids[:, :45], cache)
        out = ours(ids[:, 45:52], cache=cache)
        assert (out[:, :3] - ref[:, 45:48]).abs().max().item() <= TOL
        assert torch.isfinite(out).all()


def gguf_kv(c) -> dict:
    """A gpt2 / starcoder GGUF's metadata of transformers config ``c``, as llama.cpp's converter writes it."""
    return {"context_length": c.n_positions, "embedding_length": c.n_embd,
            "feed_forward_length": c.n_inner or 4 * c.n_embd, "block_count": c.n_layer,
            "attention.head_count": c.n_head,
            "attention.head_count_kv": getattr(c, "num_key_value_heads", c.n_head),
            "attention.layer_norm_epsilon": float(c.layer_norm_epsilon), "vocab_size": c.vocab_size}


def test_gguf_as_llama_cpp_writes_it(tmp_path):
    """A gpt2 GGUF as llama.cpp's converter writes the checkpoint (its Conv1D weights transposed to nn.Linear's
    layout; attn_qkv's rows [q; k; v]; position_embd) gives transformers' logits; its blocks compute the loaded model
    bitwise (with TRIFORCE_LLAMA_CPP=1, llama.cpp's logits on the file too)."""
    from .test_families import assert_converted_gguf_is_the_checkpoint

    hf, _ = gpt2()

    def convert(name, t):
        return t.t() if name.endswith((".c_attn.weight", ".c_proj.weight", ".c_fc.weight")) else t

    loaded = assert_converted_gguf_is_the_checkpoint(tmp_path, hf, "gpt2", gguf_kv(hf.config), convert=convert)
    assert loaded.config.model_type == "gpt2" and loaded.config.position_offset == 0


def test_defaults():
    """A config without the keys takes GPT2Config's (gpt2's shape; n_inner 4 * n_embd; tied; scaled scores)."""
    c, want = LlamaConfig.from_dict({"model_type": "gpt2"}), transformers.AutoConfig.for_model("gpt2")
    assert (c.vocab_size, c.hidden_size, c.num_hidden_layers, c.num_attention_heads, c.max_position_embeddings) == (
        want.vocab_size, want.n_embd, want.n_layer, want.n_head, want.n_positions)
    assert (c.intermediate_size, c.rms_norm_eps, c.tie_word_embeddings, c.activation) == (
        4 * want.n_embd, want.layer_norm_epsilon, want.tie_word_embeddings, "gelu_tanh")
    assert (c.bos_token_id, c.eos_token_id, c.attention_scale) == (want.bos_token_id, want.eos_token_id, 64 ** -0.5)
    back = transformers.GPT2Config.from_dict(c.to_dict())  # (our config written as GPT2Config's names)
    assert (back.n_embd, back.n_inner, back.n_positions, back.activation_function) == (768, None, 1024, "gelu_new")
    assert not {"rope_theta", "num_key_value_heads", "attention_bias", "hidden_size"} & set(c.to_dict())


@pytest.mark.parametrize("extra,match", [({"rope_theta": 5e5}, "rope_theta"),
                                         ({"num_key_value_heads": 2}, "num_key_value_heads"),
                                         ({"attention_bias": True}, "attention_bias"),
                                         ({"n_embd": 64, "hidden_size": 32}, "n_embd"),
                                         ({"scale_attn_by_inverse_layer_idx": True}, "scale_attn_by_inverse"),
                                         ({"add_cross_attention": True}, "add_cross_attention"),
                                         ({"activation_function": "silu"}, "hidden_act")])
def test_what_would_not_be_read_so_raises(extra, match):
    """Keys GPT2Config does not read (a RoPE base, KV heads, the bias switches), a name given twice apart, a scale per
    layer or cross-attention (not implemented), another activation: each raises naming the key."""
    with pytest.raises(ValueError, match=match):
        LlamaConfig.from_dict({"model_type": "gpt2", **BASE, **extra})


@pytest.mark.parametrize("method,opts", [TINY_CASES[i] for i in (0, 2, 3, 4, 6)],
                         ids=[f"{TINY_CASES[i][0]}-{i}" for i in (0, 2, 3, 4, 6)])
def test_greedy_equals_autoregressive(method, opts):
    """The engines over a GPT-2 model give its greedy tokens (a layer-skip draft, its positions shared, for the
    two-model methods; StreamingLLM's positions within its cache for MagicDec's)."""
    _, ours = gpt2(**CASES["relu-inner-unscaled"])
    assert_greedy_equals_autoregressive(ours, ours.layer_skip(2), method, opts)
