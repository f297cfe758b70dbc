"""GGUF files of models that transformers runs only by their own code, which llama.cpp runs as a family of ours:
InternLM2 / 2.5 and XVERSE (q / k permuted as llama's by their converters), EXAONE 3 / 3.5 (q / k in the checkpoint's
order, RoPE on halves) as llama; Qwen (1) as Qwen2 (q, k, v as one biased attn_qkv, its feed_forward_length twice the
MLP's width); MiniCPM (1 / 2) as Granite (its three scales). Each loads as the model its tensors are; with
``TRIFORCE_LLAMA_CPP=1`` every file loaded is also run by llama.cpp (tests/llama_cpp_oracle.py)."""
import pytest
import torch

from triforce.models import Llama, LlamaConfig

from .test_config import write_gguf
from .test_families import TINY, randomize_
from .test_model import TOL

pytest.importorskip("gguf")


def tiny_llama(tied: bool) -> Llama:
    torch.manual_seed(0)
    return randomize_(Llama(LlamaConfig(**{**TINY, "tie_word_embeddings": tied})).eval())


@pytest.mark.parametrize("arch", ["internlm2", "xverse", "exaone"])
@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_the_file_loads_as_the_llama_model_it_holds(tmp_path, arch, tied):
    model = tiny_llama(tied)
    ids = torch.randint(0, 101, (2, 30), generator=torch.Generator().manual_seed(1))
    loaded = Llama.from_pretrained(write_gguf(tmp_path / f"{arch}.gguf", model, arch=arch), cache_dir=False)
    as_llama = Llama.from_pretrained(write_gguf(tmp_path / "llama.gguf", model), cache_dir=False)
    assert loaded.config.model_type == "llama" and loaded.config.tie_word_embeddings == tied
    with torch.no_grad():
        assert torch.equal(loaded(ids), as_llama(ids))
        assert (loaded(ids) - model(ids)).abs().max().item() <= TOL


def test_each_q_k_order_matters(tmp_path, monkeypatch):
    """An exaone file written with llama's permuted q / k rows, or an internlm2 one without, loads off the model past
    TOL (the order each architecture's file holds is the one read: the test above can fail)."""
    from . import test_config

    model = tiny_llama(False)
    ids = torch.randint(0, 101, (2, 30), generator=torch.Generator().manual_seed(1))
    monkeypatch.setattr(test_config, "_GGUF_PERMUTED", ("exaone",))
    wrong = [Llama.from_pretrained(write_gguf(tmp_path / f"{a}.gguf", model, arch=a), cache_dir=False)
             for a in ("exaone", "internlm2")]
    with torch.no_grad():
        for m in wrong:
            assert (m(ids) - model(ids)).abs().max().item() > 100 * TOL


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_a_qwen_file_loads_as_the_qwen2_model_it_holds(tmp_path, tied):
    """A qwen GGUF as llama.cpp's converter writes Qwen (1) (its c_attn as attn_qkv, rows [q; k; v] with their
    biases; w2 / w1 as ffn_gate / ffn_up; feed_forward_length twice the MLP's width) written from a Qwen2ForCausalLM's
    weights (multi-head, as Qwen 1 is) gives transformers' logits on them; its blocks compute the loaded model
    bitwise."""
    from .test_families import assert_converted_gguf_is_the_checkpoint, converted_kv, transformers_and_ours

    hf, _ = transformers_and_ours("Qwen2", **{**TINY, "num_key_value_heads": 4, "tie_word_embeddings": tied,
                                              "pad_token_id": 0})
    c = hf.config
    sd = {k: t.detach().float() for k, t in hf.state_dict().items()}
    tensors = {"token_embd.weight": sd["model.embed_tokens.weight"], "output_norm.weight": sd["model.norm.weight"],
               **({} if tied else {"output.weight": sd["lm_head.weight"]})}
    for i in range(c.num_hidden_layers):
        p, b = f"model.layers.{i}.", f"blk.{i}."
        for kind in ("weight", "bias"):
            tensors[f"{b}attn_qkv.{kind}"] = torch.cat([sd[f"{p}self_attn.{x}_proj.{kind}"] for x in "qkv"])
        for theirs, mine in (("attn_norm", "input_layernorm"), ("attn_output", "self_attn.o_proj"),
                             ("ffn_norm", "post_attention_layernorm"), ("ffn_gate", "mlp.gate_proj"),
                             ("ffn_up", "mlp.up_proj"), ("ffn_down", "mlp.down_proj")):
            tensors[f"{b}{theirs}.weight"] = sd[f"{p}{mine}.weight"]
    kv = {**converted_kv(c), "feed_forward_length": 2 * c.intermediate_size}
    loaded = assert_converted_gguf_is_the_checkpoint(tmp_path, hf, "qwen", kv, convert=lambda name, t: None,
                                                     tensors={k: t.numpy() for k, t in tensors.items()})
    assert (loaded.config.model_type, loaded.config.intermediate_size) == ("qwen2", c.intermediate_size)


def test_a_minicpm_file_loads_as_the_granite_model_it_holds(tmp_path):
    """A minicpm GGUF (MiniCPM 1 / 2: llama's tensors, q / k permuted, its scale_emb, scale_depth / sqrt(layers) and
    hidden / dim_model_base as embedding_scale, residual_scale and logit_scale; no attention scale: head_dim ** -0.5)
    loads as the granite model of those multipliers, bitwise that model's granite file; a file without one of the
    three scales raises naming it (llama.cpp's built-in numbers for older files are not read)."""
    from .test_granite import tiny_granite

    base = tiny_granite(0)
    model = Llama(base.config.replace(extra={**base.config.extra, "attention_multiplier": 8 ** -0.5})).eval()
    model.load_state_dict(base.state_dict())
    scales = {"embedding_scale": 12.0, "residual_scale": 0.22, "logit_scale": 8.0}
    loaded = Llama.from_pretrained(write_gguf(tmp_path / "m.gguf", model, scales, arch="minicpm"), cache_dir=False)
    granite = Llama.from_pretrained(write_gguf(tmp_path / "g.gguf", model, {**scales, "attention.scale": 0.0}),
                                    cache_dir=False)
    assert loaded.config.model_type == "granite"
    assert loaded.config.attention_scale == granite.config.attention_scale == pytest.approx(8 ** -0.5, rel=1e-15)
    ids = torch.randint(0, 64, (2, 24), generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        assert torch.equal(loaded(ids), granite(ids))
        assert (loaded(ids) - model(ids)).abs().max().item() <= 1e-4  # (residual_scale: a float32 in the file)
    with pytest.raises(ValueError, match="minicpm.residual_scale"):
        Llama.from_pretrained(write_gguf(tmp_path / "o.gguf", model, {**scales, "residual_scale": None},
                                         drop=("residual_scale",), arch="minicpm"), cache_dir=False)
