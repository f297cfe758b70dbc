"""The families with an ungated MLP (``config.gated_mlp`` false): StarCoder 2 (LayerNorm with biases, GELU), Arcee
(ReLU squared, YaRN), Nemotron (LayerNorm1P, partial RoPE, ReLU squared), Phi-2 (the parallel block, partial RoPE, the
head's bias), drawn: against transformers' models and
from their GGUF files as llama.cpp's converter writes them."""
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from .test_families import (TINY, assert_drawn_checkpoint_loads, converted_kv, transformers_and_ours,
                            write_converted_gguf)

pytest.importorskip("transformers")


@given(data=st.data())
def test_drawn_checkpoints_and_their_gguf_files_load_as_transformers_model(data):
    """Property: a drawn tiny StarCoder 2 (biases or none, a window or none), Arcee (YaRN or plain RoPE, biases),
    Nemotron (RoPE on a quarter, half or all of each head, biases) or Phi-2 (RoPE on a quarter, 0.4, half or all)
    checkpoint, head_dim 8 / 16 / 32 over 1, 2 or 4 KV
    heads, tied or not, gives transformers' logits on 32 tokens, a 6-token pass the bits of its steps, and its GGUF
    (float32: transformers' logits, a window dropped as llama.cpp runs starcoder2; Q8_0 / Q5_0 blocks: the loaded
    model bitwise)."""
    from .test_config import write_gguf
    from .test_nemotron import write_nemotron_gguf
    from .test_starcoder2 import starcoder2_kv

    draw = data.draw
    family = draw(st.sampled_from(["Starcoder2", "Arcee", "Nemotron", "Phi"]))
    head_dim = draw(st.sampled_from([8, 16, 32]))
    kw = dict(TINY, num_hidden_layers=2, head_dim=head_dim, num_key_value_heads=draw(st.sampled_from([1, 2, 4])),
              tie_word_embeddings=draw(st.booleans()))
    bias = draw(st.booleans())
    window = None
    if family == "Phi":  # (its head_dim is hidden / heads; biases everywhere)
        del kw["head_dim"], kw["rms_norm_eps"]
        heads = 64 // head_dim
        kw.update(num_attention_heads=heads, num_key_value_heads=min(kw["num_key_value_heads"], heads),
                  partial_rotary_factor=draw(st.sampled_from([0.25, 0.5, 1.0] + ([0.4] if head_dim > 8 else []))))
    elif family == "Starcoder2":
        window = draw(st.sampled_from([None, 5, 12]))
        kw.update(use_bias=bias, sliding_window=window, bos_token_id=0, eos_token_id=0)
    else:
        kw.update(attention_bias=bias, mlp_bias=draw(st.booleans()))
    if family == "Arcee" and draw(st.booleans()):
        kw["rope_parameters"] = {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 16,
                                 "rope_theta": 10000.0}
    if family == "Nemotron":
        kw["partial_rotary_factor"] = draw(st.sampled_from([0.25, 0.5, 1.0]))
    hf, ours = transformers_and_ours(family, **kw)

    def write(path, quant):
        if family == "Starcoder2":
            return write_converted_gguf(path, hf, "starcoder2", starcoder2_kv(hf.config), quant=quant)
        if family == "Nemotron":
            return write_nemotron_gguf(path, hf, ours.config.rotary_dim, quant=quant)
        if family == "Phi":
            return write_converted_gguf(path, hf, "phi2", converted_kv(hf.config, rotated=ours.config.rotary_dim,
                                                                       eps_key="attention.layer_norm_epsilon"),
                                        quant=quant)
        rs = ours.config.rope_scaling
        meta = {} if rs is None else {"rope.scaling.type": "yarn", "rope.scaling.factor": rs["factor"],
                                      "rope.scaling.original_context_length": rs["original_max_position_embeddings"]}
        return write_gguf(path, ours, meta=meta, arch="arcee", quant=quant)

    # (a window dropped, as llama.cpp runs starcoder2 files: the same weights without one)
    want = None if window is None else (
        lambda ids: transformers_and_ours(family, **{**kw, "sliding_window": None})[0](ids).logits)
    assert_drawn_checkpoint_loads(draw, hf, ours, write, want)

@pytest.mark.parametrize("family", ["Starcoder2", "Nemotron"])
def test_bfloat16_layer_norms_are_transformers(family):
    """In bfloat16 the LayerNorms are torch's op on the same weights as transformers' (StarCoder 2's nn.LayerNorm;
    Nemotron's LayerNorm1P, its 1 added in the weight's dtype): bitwise their output."""
    hf, ours = transformers_and_ours(family, **{**TINY, "num_hidden_layers": 2, "bos_token_id": 0, "eos_token_id": 0})
    x = torch.randn(2, 5, 64, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    mine, theirs = ours.model.layers[1].input_layernorm, hf.model.layers[1].input_layernorm
    with torch.no_grad():
        assert torch.equal(mine.to(torch.bfloat16)(x), theirs.to(torch.bfloat16)(x))
