"""BitNet b1.58 (``model_type="bitnet"``: BitNetForCausalLM): Llama's layer with RMSNorms on the heads' output and on
the MLP's gated product (ReLU squared), its projections float (the -bf16 master weights) or, with quantization_config
``"bitnet"``, ternary with int8 activations (``linear_class`` bitlinear: packed two bits a weight; autobitlinear
offline or online); against transformers' BitNetForCausalLM and its BitNet integration's layers."""
import json

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from triforce.models import Llama, LlamaConfig
from triforce.models.bitnet import BitLinear, bitnet_config, pack_ternary, unpack_ternary

from .test_engines import TINY_CASES, assert_greedy_equals_autoregressive
from .test_families import TOL, assert_saved_reads_back, randomize_, transformers_and_ours
from .test_sliding_window import assert_every_path_matches, assert_pass_equals_steps

transformers = pytest.importorskip("transformers")
bitnet_integration = pytest.importorskip("transformers.integrations.bitnet")

BASE = dict(vocab_size=101, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=128, rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2)
CASES = {"default": {},
         "biased-tied-llama3": dict(attention_bias=True, tie_word_embeddings=True, num_key_value_heads=4,
                                    rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                                     "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                     "original_max_position_embeddings": 16})}
KINDS = ("bitlinear", "autobitlinear-offline", "autobitlinear-offline-packed", "autobitlinear-online")


@pytest.fixture(autouse=True)
def _eager_torch_compile():
    """transformers' BitNet layers wrap their quantisation in torch.compile: run it eagerly (the same ops)."""
    import torch._dynamo

    with torch._dynamo.config.patch(disable=True):
        yield


@pytest.mark.parametrize("case", list(CASES))
def test_float_weights_match_transformers(tmp_path, case):
    """The master weights' model (no quantization_config): every path gives transformers' logits (the two sub-norms,
    ReLU squared's gate); our save reads back in transformers as the same model."""
    hf, ours = transformers_and_ours("BitNet", **{**BASE, **CASES[case]})
    layer = ours.model.layers[0]
    assert layer.self_attn.attn_sub_norm is not None and layer.mlp.ffn_sub_norm is not None
    assert_every_path_matches(hf, ours)
    assert_saved_reads_back(tmp_path, hf, ours)


def quantized_dir(path, kind: str, case: str = "default", dtype=torch.float32):
    """A tiny BitNet checkpoint of ``kind`` written as transformers' BitNet integration reads it: each decoder
    projection's weight rounded to ternary by its mean magnitude (packed four a byte for bitlinear and the packed
    autobitlinear; float ternary otherwise; the float weight itself online), with its weight_scale. -> the transformers
    model read from it (float32), ``path``."""
    from safetensors.torch import save_file

    torch.manual_seed(0)
    hf = randomize_(transformers.BitNetForCausalLM(transformers.BitNetConfig(**{**BASE, **CASES[case]})).eval())
    sd = {}
    for k, v in hf.state_dict().items():
        if not (k.startswith("model.layers.") and k.endswith("_proj.weight")) or kind == "autobitlinear-online":
            sd[k] = v.contiguous()
            continue
        scale = 1.0 / v.abs().mean().clamp(min=1e-5)
        ternary = (v * scale).round().clamp(-1, 1)
        packed = kind in ("bitlinear", "autobitlinear-offline-packed")
        sd[k] = pack_ternary(ternary) if packed else ternary.contiguous()
        sd[k[: -len("weight")] + "weight_scale"] = (scale if kind == "bitlinear" else 1 / scale).reshape(1)
    linear, mode = ("bitlinear", "offline") if kind == "bitlinear" else kind.split("-")[:2]
    config = {**hf.config.to_dict(), "quantization_config": {"quant_method": "bitnet", "linear_class": linear,
                                                             "quantization_mode": mode}}
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config))
    save_file(sd, path / "model.safetensors")
    return transformers.AutoModelForCausalLM.from_pretrained(path, dtype=dtype).eval(), path


@pytest.mark.parametrize("kind", KINDS)
def test_quantized_checkpoints_match_transformers(tmp_path, kind):
    """Each kind of BitNet checkpoint loads as transformers loads it (its layers BitLinear / AutoBitLinear) with its
    logits on every path; the quantisation is read (the master weights' model differs by far more); ours saved
    (packed weights, their scales, the quantization_config) loads in transformers with the same logits."""
    hf, path = quantized_dir(tmp_path / "in", kind)
    want = "BitLinear" if kind == "bitlinear" else "AutoBitLinear"
    assert type(hf.model.layers[0].mlp.down_proj).__name__ == want
    ours = Llama.from_pretrained(path, cache_dir=False)
    assert type(ours.model.layers[1].self_attn.o_proj) is BitLinear and type(ours.lm_head) is not BitLinear
    ids, ref = assert_every_path_matches(hf, ours)
    plain = transformers_and_ours("BitNet", **BASE)[0]
    with torch.no_grad():
        assert (plain(ids).logits - ref).abs().max() > 0.1
    ours.save_pretrained(tmp_path / "out")
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()
    with torch.no_grad():
        assert (back(ids).logits - ref).abs().max().item() <= TOL


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_bitlinear_is_transformers_bitwise(dtype):
    """Our packed BitLinear gives transformers' BitLinear output bitwise (float32 and bfloat16): the int8 rounding of
    each row in the dtype, the integer products summed exactly, one division; rows of zeros (the maximum's clamp),
    large and tiny values included; and each row its own (a row alone gives the same bits)."""
    g = torch.Generator().manual_seed(0)
    theirs = bitnet_integration.BitLinear(96, 40, bias=True, dtype=dtype)
    ternary = torch.randint(-1, 2, (40, 96), generator=g).float()
    scale, bias = torch.tensor([0.37], dtype=dtype), (torch.randn(40, generator=g) * 0.5).to(dtype)
    with torch.no_grad():
        theirs.weight.copy_(bitnet_integration.pack_weights(ternary.clone()))
        theirs.weight_scale.copy_(scale)
        theirs.bias.copy_(bias)
    ours = BitLinear(96, 40, True, "bitlinear", dtype)
    ours.weight.copy_(pack_ternary(ternary))
    ours.weight_scale.copy_(scale)
    with torch.no_grad():
        ours.bias.copy_(bias)
    x = (torch.randn(7, 96, generator=g) * torch.tensor([1, 1e-3, 1e3, 0, 1, 30, 1e-6])[:, None]).to(dtype)
    with torch.no_grad():
        out = ours(x)
        assert torch.equal(out, theirs(x))
        assert torch.equal(torch.cat([ours(x[i:i + 1]) for i in range(7)]), out)


@settings(deadline=None)
@given(rows=st.integers(1, 6), cols=st.integers(1, 9), seed=st.integers(0, 2**31 - 1))
def test_packing_is_transformers(rows, cols, seed):
    """pack_ternary / unpack_ternary are transformers' pack_weights / unpack_weights (two bits a weight, row j * R + i
    in bits 2j of byte row i), and each undoes the other."""
    w = torch.randint(-1, 2, (4 * rows, cols), generator=torch.Generator().manual_seed(seed)).float()
    packed = pack_ternary(w)
    assert torch.equal(packed, bitnet_integration.pack_weights(w.clone()))
    assert torch.equal(unpack_ternary(packed, torch.float32), w)
    assert torch.equal(bitnet_integration.unpack_weights(packed, dtype=torch.float32), w)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_pass_gives_the_bits_of_one_token_steps(tmp_path, dtype):
    """The packed model: a 10-token pass after a 20-token prefill is bitwise its one-token steps."""
    _, path = quantized_dir(tmp_path, "bitlinear")
    assert_pass_equals_steps(Llama.from_pretrained(path, cache_dir=False), dtype)


@pytest.mark.parametrize("method,opts", [TINY_CASES[i] for i in (0, 3, 4, 6)],
                         ids=[f"{TINY_CASES[i][0]}-{i}" for i in (0, 3, 4, 6)])
def test_greedy_equals_autoregressive(tmp_path, method, opts):
    """The packed model as the target, its master weights' model as the draft."""
    _, path = quantized_dir(tmp_path, "bitlinear")
    target = Llama.from_pretrained(path, cache_dir=False)
    draft = transformers_and_ours("BitNet", **BASE)[1]
    assert_greedy_equals_autoregressive(target, draft, method, opts)


def test_config_keys_and_defaults():
    """BitNetConfig's defaults (bitnet-b1.58-2B-4T's shape) read; BitNet's quantization_config read where it is one this
    model computes, refused otherwise (naming the key)."""
    c, want = LlamaConfig.from_dict({"model_type": "bitnet"}), transformers.BitNetConfig()
    assert (c.vocab_size, c.hidden_size, c.intermediate_size, c.num_hidden_layers, c.num_attention_heads,
            c.num_key_value_heads, c.max_position_embeddings, c.rms_norm_eps, c.bos_token_id, c.eos_token_id,
            c.tie_word_embeddings) == (want.vocab_size, want.hidden_size, want.intermediate_size,
                                       want.num_hidden_layers, want.num_attention_heads, want.num_key_value_heads,
                                       want.max_position_embeddings, want.rms_norm_eps, want.bos_token_id,
                                       want.eos_token_id, want.tie_word_embeddings)
    assert c.rope_theta == want.rope_parameters["rope_theta"] and c.activation == "relu2" and c.sub_norms
    assert c.bitnet is None and LlamaConfig.from_dict(c.to_dict()).to_dict() == c.to_dict()
    q = {"quant_method": "bitnet", "linear_class": "bitlinear", "quantization_mode": "offline"}
    assert LlamaConfig.from_dict({"model_type": "bitnet", "quantization_config": q}).bitnet == q
    assert bitnet_config({"quant_method": "bitnet", "modules_to_not_convert": ["lm_head"]})
    for bad in ({"use_rms_norm": True}, {"linear_class": "bitlinear", "quantization_mode": "online"},
                {"linear_class": "other"}, {"modules_to_not_convert": ["model.layers.0.mlp"]}, {"extra_key": 1}):
        assert not bitnet_config({"quant_method": "bitnet", **bad})
        with pytest.raises(ValueError, match="quantization_config"):
            LlamaConfig.from_dict({"model_type": "bitnet", "quantization_config": {"quant_method": "bitnet", **bad}})
    with pytest.raises(ValueError, match="quantization_config"):  # (another family's projections are not BitNet's)
        LlamaConfig.from_dict({"model_type": "llama", "quantization_config": q})


def _ternary_op():
    from triforce.models.bitnet import _has_op

    if not _has_op():
        pytest.skip("the extension's ternary_linear is not built")
    return torch.ops.triforce_C.ternary_linear


@settings(deadline=None)
@given(M=st.integers(0, 9), K=st.sampled_from([1, 5, 63, 64, 65, 130, 300]), R=st.integers(1, 9),
       seed=st.integers(0, 2**31 - 1))
def test_ternary_linear_is_the_exact_integer_product(M, K, R, seed):
    """triforce_C::ternary_linear (csrc/cpu/linear.cpp: AVX-512 VNNI where built, a loop elsewhere) gives the exact
    integer product of int8 rows (their extremes -128 and 127 included) and the packed ternary weights, for row counts
    across its blocks of four and columns across its vectors of 64 (masked tails)."""
    op = _ternary_op()
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(-128, 128, (M, K), generator=g, dtype=torch.int8)
    if M and K > 2:
        q[0, :2] = torch.tensor([-128, 127], dtype=torch.int8)
    w = torch.randint(-1, 2, (4 * R, K), generator=g).float()
    out = op(q, pack_ternary(w))
    assert out.dtype == torch.int32 and out.shape == (M, 4 * R)
    assert torch.equal(out.long(), (q.long()[:, None, :] * w.long()[None]).sum(-1))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_integer_path_has_the_float_products_bits(monkeypatch, dtype):
    """A packed BitLinear on the integer product gives the float product's bits (one rounding of the same exact sum),
    for a pass of many rows and for one; and reads the 2-bit weights only (no unpacked copy made)."""
    _ternary_op()
    g = torch.Generator().manual_seed(1)
    layer = BitLinear(300, 64, True, "bitlinear", dtype)
    layer.weight.copy_(pack_ternary(torch.randint(-1, 2, (64, 300), generator=g).float()))
    layer.weight_scale.fill_(0.05)
    with torch.no_grad():
        layer.bias.copy_(torch.randn(64, generator=g))
    x = (torch.randn(2, 9, 300, generator=g) * 3).to(dtype)
    with torch.no_grad():
        fast = layer(x)
        assert layer._ternary is None
        monkeypatch.setenv("TRIFORCE_TERNARY_LINEAR", "0")
        slow = layer(x)
        assert layer._ternary is not None
    assert torch.equal(fast, slow) and torch.equal(layer(x[:1, :1]), fast[:1, :1])
