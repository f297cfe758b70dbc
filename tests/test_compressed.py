"""compressed-tensors checkpoints (llm-compressor's: FP8, INT8, packed INT1-8, NVFP4, MXFP4) load as the float
model they dequantise to: their checkpoints written by compressed-tensors' own compressors, the weights checked
against transformers' dequantising load (``CompressedTensorsConfig(dequantize=True)``) and compressed-tensors'
decompressors."""

import json

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from triforce.models import Llama, LlamaConfig
from triforce.models.compressed import dequantize_compressed, schemes, unpack_int32
from triforce.models.loading import _build

from .test_families import TINY, randomize_
from .test_model import TOL

transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")
ct = pytest.importorskip("compressed_tensors")
from compressed_tensors.compressors import BaseCompressor  # noqa: E402
from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32  # noqa: E402
from compressed_tensors.quantization import QuantizationConfig, QuantizationScheme  # noqa: E402

FP8_TOKEN = {"num_bits": 8, "type": "float", "strategy": "token", "dynamic": True, "symmetric": True}
INT8_TOKEN = {"num_bits": 8, "type": "int", "strategy": "token", "dynamic": True, "symmetric": True}
FP8_TENSOR = {"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": False, "symmetric": True}

# name -> (format, weights, input activations, kv_cache_scheme): the schemes llm-compressor's presets write
SCHEMES = {
    "fp8_dynamic": ("float-quantized", {"num_bits": 8, "type": "float", "strategy": "channel"}, FP8_TOKEN, None),
    "fp8_static": ("float-quantized", FP8_TENSOR, FP8_TENSOR, FP8_TENSOR),  # input and KV scales in the checkpoint
    "fp8_block": ("float-quantized", {"num_bits": 8, "type": "float", "strategy": "block",
                                      "block_structure": [24, 40]}, FP8_TOKEN, None),  # partial blocks
    "w8a8_int8": ("int-quantized", {"num_bits": 8, "type": "int", "strategy": "channel"}, INT8_TOKEN, None),
    "int8_asym": ("int-quantized", {"num_bits": 8, "type": "int", "strategy": "channel", "symmetric": False},
                  INT8_TOKEN, None),
    "w4a16": ("pack-quantized", {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 16,
                                 "actorder": "weight"}, None, None),
    "w4a16_asym": ("pack-quantized", {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 32,
                                      "symmetric": False}, None, None),
    "w3_channel": ("pack-quantized", {"num_bits": 3, "type": "int", "strategy": "channel"}, None, None),
    "w8a16": ("pack-quantized", {"num_bits": 8, "type": "int", "strategy": "channel"}, None, None),
    "w2_tensor_asym": ("pack-quantized", {"num_bits": 2, "type": "int", "strategy": "tensor", "symmetric": False},
                       None, None),
    "nvfp4": ("nvfp4-pack-quantized", {"num_bits": 4, "type": "float", "strategy": "tensor_group",
                                       "group_size": 16}, None, None),
    "mxfp4": ("mxfp4-pack-quantized", {"num_bits": 4, "type": "float", "strategy": "group", "group_size": 32},
              None, None),
}


def scales_of(w: torch.Tensor, a, dtype):
    """(scale, zero point or None, NVFP4's global scale or None) of weight ``w`` under weight args ``a``: its
    min-max ones, rounded to ``dtype`` as llm-compressor stores them."""
    N, K = w.shape
    if a.strategy == "block":
        (bh, bw), gr, gc = a.block_structure, -(-N // a.block_structure[0]), -(-K // a.block_structure[1])
        padded = torch.zeros(gr * bh, gc * bw)
        padded[:N, :K] = w
        blocks = padded.reshape(gr, bh, gc, bw).transpose(1, 2)
        lo, hi = blocks.amin((-1, -2)), blocks.amax((-1, -2))
    else:
        size, shape = {"tensor": (N * K, (1,)), "channel": (K, (N, 1))}.get(
            a.strategy, (a.group_size, (N, K // (a.group_size or 1))))
        g = w.reshape(-1, size)
        lo, hi = g.amin(-1), g.amax(-1)
        lo, hi = lo.reshape(shape), hi.reshape(shape)
    amax = torch.maximum(lo.abs(), hi.abs()).clamp_min(1e-6)
    if a.type == "float" and a.num_bits == 4:
        if a.strategy == "tensor_group":  # NVFP4: FP8 group scales over a float32 global one
            glob = (448 * 6 / w.abs().max()).reshape(1).float()
            return (amax / 6 * glob).to(torch.float8_e4m3fn).float().clamp_min(2 ** -9), None, glob
        return (amax / 6).log2().ceil().exp2(), None, None  # MXFP4: powers of two
    if a.type == "float":
        return (amax / 448).to(dtype), None, None
    qmin, qmax = -(1 << (a.num_bits - 1)), (1 << (a.num_bits - 1)) - 1
    if a.symmetric:
        return (amax / qmax).to(dtype), None, None
    scale = ((hi - lo).clamp_min(1e-6) / (qmax - qmin)).to(dtype)
    zero = (qmin - lo / scale.float()).round().clamp(qmin, qmax).to(torch.int8)
    return scale, zero, None


def is_linear(name: str, t: torch.Tensor) -> bool:
    return t.dim() == 2 and name.endswith("proj.weight")


def write_compressed(directory, groups: dict, fmt: str, dtype, kv=None, static_inputs=False) -> None:
    """Replaces the float checkpoint in ``directory`` by its compressed-tensors one: every linear layer's weight
    but the head's compressed by compressed-tensors' compressor of its config group (``groups``: name ->
    (QuantizationScheme, regex of the module names it takes or None for all)), the scales in ``dtype``; the
    config's quantization_config as compressed-tensors writes it. ``static_inputs``: each module's input_scale
    (and, with ``kv``, each attention's k_scale and v_scale) as the static schemes store them."""
    path = directory / "model.safetensors"
    sd, out = safetensors_torch.load_file(path), {}
    for name, t in sd.items():
        if not is_linear(name, t):
            out[name] = t
            continue
        module = name[:-len(".weight")]
        scheme = next(s for s, pattern in groups.values() if pattern is None or pattern in module)
        scale, zero, glob = scales_of(t.float(), scheme.weights, dtype)
        state = {"weight": t.float(), "weight_scale": scale}
        if zero is not None:
            state["weight_zero_point"] = zero
        if glob is not None:
            state["weight_global_scale"] = glob
        compressor = BaseCompressor.get_value_from_registry(scheme.format)
        for k, v in compressor.compress(state, scheme).items():
            out[f"{module}.{k}"] = v.contiguous()
        if static_inputs:
            out[f"{module}.input_scale"] = torch.tensor([0.05], dtype=dtype)
            if kv is not None and module.endswith("k_proj"):
                out[module.replace("k_proj", "k_scale")] = torch.tensor([0.1], dtype=dtype)
                out[module.replace("k_proj", "v_scale")] = torch.tensor([0.2], dtype=dtype)
    safetensors_torch.save_file(out, path)
    config = QuantizationConfig(config_groups={n: s for n, (s, _) in groups.items()}, format=fmt,
                                quantization_status="compressed", ignore=["lm_head"], kv_cache_scheme=kv)
    q = {**config.model_dump(mode="json"), "quant_method": "compressed-tensors"}
    cfg = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**cfg, "quantization_config": q}))


def scheme(fmt, weights, inputs=None, targets=("Linear",)):
    return QuantizationScheme(targets=list(targets), weights=weights, input_activations=inputs, format=fmt)


def tiny_checkpoint(directory, case: str, dtype):
    fmt, weights, inputs, kv = SCHEMES[case]
    torch.manual_seed(0)
    hf = randomize_(transformers.LlamaForCausalLM(transformers.LlamaConfig(**TINY, tie_word_embeddings=False)))
    hf.save_pretrained(directory)
    write_compressed(directory, {"group_0": (scheme(fmt, weights, inputs), None)}, fmt, dtype, kv,
                     static_inputs=case == "fp8_static")


def theirs(directory, dtype):
    return transformers.AutoModelForCausalLM.from_pretrained(
        directory, dtype=dtype, quantization_config=transformers.CompressedTensorsConfig(dequantize=True)).eval()


def assert_weights_equal(ours, want_sd):
    mine = ours.state_dict()
    assert mine.keys() == want_sd.keys()
    for k in mine:
        assert torch.equal(mine[k], want_sd[k]), k


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("case", list(SCHEMES))
def test_a_compressed_tensors_checkpoint_loads_as_transformers_dequantises_it(tmp_path, case, dtype):
    """Each scheme's checkpoint (written by compressed-tensors' compressors, scales in the model's dtype) loads
    with the weights transformers' dequantising load gives, bitwise (each (code - zero) * scale in float32,
    rounded once to the dtype: the same as compressed-tensors' product in the scales' dtype), and the same logits;
    the activations' and KV cache's scales are dropped; what the model saves is float, without the
    quantization_config. FP4 in float32: transformers rounds NVFP4's products to bfloat16 (the unpacked codes'
    dtype) and we do not: checked against compressed-tensors' float32 products."""
    tiny_checkpoint(tmp_path / "ckpt", case, dtype)
    ours = Llama.from_pretrained(tmp_path / "ckpt", dtype=dtype)
    ref = theirs(tmp_path / "ckpt", dtype)
    ref_sd = ref.state_dict()
    if case == "nvfp4" and dtype == torch.float32:
        from compressed_tensors.compressors.nvfp4.helpers import unpack_fp4_from_uint8

        sd = safetensors_torch.load_file(tmp_path / "ckpt" / "model.safetensors")
        for k in [k for k in sd if k.endswith(".weight_packed")]:
            m, packed = k[:-len(".weight_packed")], sd[k]
            values = unpack_fp4_from_uint8(packed, packed.shape[0], 2 * packed.shape[1], dtype=torch.float32)
            scale = sd[m + ".weight_scale"].float() / sd[m + ".weight_global_scale"].float()
            ref_sd[m + ".weight"] = values * scale.repeat_interleave(16, -1)
        assert not all(torch.equal(ref_sd[k], ref_sd[k].bfloat16().float()) for k in ref_sd if "proj" in k)
    want = _build(LlamaConfig.from_dict(ref.config.to_dict()), ref_sd, None, dtype).state_dict()
    assert_weights_equal(ours, want)
    if dtype == torch.float32:
        ids = torch.randint(0, 101, (2, 24), generator=torch.Generator().manual_seed(1))
        with torch.no_grad():
            assert (ours(ids) - ref(input_ids=ids).logits).abs().max().item() <= (
                TOL if case != "nvfp4" else 1e-2)
    plain = Llama.from_pretrained(tmp_path / "ckpt", dtype=dtype)
    assert "quantization_config" not in plain.config.to_dict()
    plain.save_pretrained(tmp_path / "float")
    back = Llama.from_pretrained(tmp_path / "float", dtype=dtype).state_dict()
    assert all(torch.equal(back[k], v) for k, v in plain.state_dict().items())
