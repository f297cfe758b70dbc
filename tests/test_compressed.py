"""compressed-tensors checkpoints (llm-compressor's: FP8, INT8, packed INT1-8, NVFP4, MXFP4) load as the float
model they dequantise to: their checkpoints written by compressed-tensors' own compressors, the weights checked
against transformers' dequantising load (``CompressedTensorsConfig(dequantize=True)``) and compressed-tensors'
decompressors; on their own codes (``load_compressed``: Fp8Linear, Q4Linear, Q8Linear) bitwise the float32 model."""

import json

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from triforce.models import Llama, LlamaConfig
from triforce.models.compressed import dequantize_compressed, schemes, unpack_int32
from triforce.models.llama import _rowwise_available
from triforce.models.loading import _build

from .test_families import TINY, randomize_
from .test_fp8 import assert_runs_as
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
    "w4a16_g32": ("pack-quantized", {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 32}, None,
                  None),
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
    (QuantizationScheme, a part of the module names it takes or None for all; a module no group takes stays
    float)), the scales in ``dtype``; the
    config's quantization_config as compressed-tensors writes it. ``static_inputs``: each module's input_scale
    (and, with ``kv``, each attention's k_scale and v_scale) as the static schemes store them."""
    path = directory / "model.safetensors"
    sd, out = safetensors_torch.load_file(path), {}
    for name, t in sd.items():
        module = name[:-len(".weight")]
        scheme = next((s for s, pattern in groups.values() if pattern is None or pattern in module), None)
        if not is_linear(name, t) or scheme is None:
            out[name] = t
            continue
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


def test_a_mixed_precision_mixture_loads_each_group_by_its_targets(tmp_path):
    """A mixture whose config groups target modules by pattern (as Kimi K2 Thinking's INT4 experts beside FP8
    attention): attention FP8 per channel, the experts' projections 4-bit in groups of 16 (transformers' experts take no
    zero points), the router and the
    head float; each module dequantised by its own group's scheme, as transformers' load gives them (bfloat16
    and float32), the experts run in one native call."""
    torch.manual_seed(0)
    kw = dict(TINY, head_dim=16, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32)
    hf = randomize_(transformers.Qwen3MoeForCausalLM(transformers.Qwen3MoeConfig(**kw)))
    fp8 = ("float-quantized", {"num_bits": 8, "type": "float", "strategy": "channel"}, FP8_TOKEN)
    int4 = ("pack-quantized", {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 16}, None)
    groups = {"attention": (scheme(*fp8, targets=[r"re:.*self_attn\..*"]), "self_attn"),
              "experts": (scheme(*int4, targets=[r"re:.*mlp\.experts\..*"]), "experts")}
    for dtype in (torch.float32, torch.bfloat16):  # (scales in the model's dtype)
        path = tmp_path / str(dtype)
        hf.save_pretrained(path)
        write_compressed(path, groups, "mixed-precision", dtype)
        sd = safetensors_torch.load_file(path / "model.safetensors")
        assert sd["model.layers.0.mlp.experts.1.up_proj.weight_packed"].dtype == torch.int32
        assert sd["model.layers.1.self_attn.o_proj.weight"].dtype == torch.float8_e4m3fn
        assert sd["model.layers.0.mlp.gate.weight"].dtype == torch.float32
        ours = Llama.from_pretrained(path, dtype=dtype)
        ref = theirs(path, dtype)
        want = _build(LlamaConfig.from_dict(ref.config.to_dict()), ref.state_dict(), None, dtype).state_dict()
        assert_weights_equal(ours, want)
        if dtype == torch.float32:
            ids = torch.randint(0, 101, (2, 24), generator=torch.Generator().manual_seed(1))
            with torch.no_grad():
                assert (ours(ids) - ref(input_ids=ids).logits).abs().max().item() <= TOL


@given(bits=st.integers(1, 8), rows=st.integers(1, 5), cols=st.integers(0, 97), lead=st.integers(0, 2),
       seed=st.integers(0, 2 ** 31 - 1))
def test_unpack_int32_reads_what_compressed_tensors_packs(bits, rows, cols, lead, seed):
    """Every bit width's dense packing (values crossing int32 words), as compressed-tensors' pack_to_int32
    writes it, with leading dims (stacked experts)."""
    g = torch.Generator().manual_seed(seed)
    shape = (2,) * lead + (rows, cols)
    values = torch.randint(-(1 << (bits - 1)), 1 << (bits - 1), shape, generator=g, dtype=torch.int8)
    packed = pack_to_int32(values, bits)
    assert packed.shape[-1] == -(-cols * bits // 32)
    assert torch.equal(unpack_int32(packed, bits, cols), values)


def dequantize_by_lookup(codes, scale, grid, dtype, zero=None, g_idx=None):
    """``dequantize_compressed``'s reference: weight ``[r, c]`` minus its zero point times its scale, each looked
    up by index (``r // grid[0]``, ``c // grid[1]`` or ``g_idx[c]``), in float64 (exact for these operands:
    float32's product of two 24-bit significands), rounded to float32, then to ``dtype``."""
    R, C = codes.shape[-2:]
    rows = torch.arange(R) // grid[0]
    cols = torch.arange(C) // grid[1] if g_idx is None else g_idx
    s = (scale.double() - 127).exp2() if scale.dtype == torch.uint8 else scale.double()
    v = codes.double() if zero is None else codes.double() - zero.double()[..., rows, :][..., cols]
    return (v * s[..., rows, :][..., cols]).float().to(dtype)


@given(lead=st.integers(0, 1), R=st.integers(1, 40), C=st.integers(1, 70), strategy=st.sampled_from(
    ["tensor", "channel", "group", "block", "g_idx"]), b0=st.integers(1, 24), b1=st.integers(1, 24),
    scale_dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float16, torch.float8_e4m3fn, torch.uint8]),
    zero=st.booleans(), dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float16]),
    seed=st.integers(0, 2 ** 31 - 1))
def test_dequantize_compressed_is_the_lookup_of_each_weights_scale(lead, R, C, strategy, b0, b1, scale_dtype,
                                                                   zero, dtype, seed):
    """Any grid (one scale, one a row, groups of columns, blocks with partial last ones, activation-ordered
    groups), any scale dtype (UE8M0 exponents too), zero points or none, three model dtypes: each product
    in float32 rounded once to the dtype, chunked by rows or not."""
    g = torch.Generator().manual_seed(seed)
    E = (3,) * lead
    codes = torch.randint(-128, 128, (*E, R, C), generator=g, dtype=torch.int8)
    grid = {"tensor": (R, C), "channel": (1, C), "group": (1, b1), "block": (b0, b1), "g_idx": (1, b1)}[strategy]
    groups = -(-C // b1)
    g_idx = torch.randint(0, groups, (C,), generator=g) if strategy == "g_idx" else None
    shape = (*E, -(-R // grid[0]), -(-C // grid[1]))
    if scale_dtype == torch.uint8:
        scale = torch.randint(100, 140, shape, generator=g).to(torch.uint8)
    else:
        scale = (torch.rand(shape, generator=g) * 0.1 + 1e-3).to(scale_dtype)
    z = torch.randint(-8, 8, shape, generator=g, dtype=torch.int8) if zero else None
    got = dequantize_compressed(codes, scale, grid, dtype, z, g_idx)
    want = dequantize_by_lookup(codes, scale, grid, dtype, z, g_idx)
    assert got.dtype == dtype and torch.equal(got, want)


def test_dequantize_compressed_chunks_large_weights():
    """A weight of more rows than one chunk's (4M products) takes each row's scales."""
    R, C = 1100, 4096
    codes = torch.randint(-8, 8, (R, C), dtype=torch.int8)
    scale = torch.rand(R, C // 128) + 0.5
    assert torch.equal(dequantize_compressed(codes, scale, (1, 128)),
                       dequantize_by_lookup(codes, scale, (1, 128), torch.float32))


def test_a_sharded_checkpoint_finds_each_weights_parts_in_any_file(tmp_path):
    """A weight's codes, scales, zero points and shape may lie in different shards (each in the next file)."""
    tiny_checkpoint(tmp_path / "ckpt", "w4a16_asym", torch.float32)
    one = Llama.from_pretrained(tmp_path / "ckpt").state_dict()
    path = tmp_path / "ckpt" / "model.safetensors"
    sd = safetensors_torch.load_file(path)
    path.unlink()
    files = {name: f"model-{i % 3 + 1:05d}-of-00003.safetensors" for i, name in enumerate(sd)}
    for f in set(files.values()):
        safetensors_torch.save_file({n: t for n, t in sd.items() if files[n] == f}, tmp_path / "ckpt" / f)
    (tmp_path / "ckpt" / "model.safetensors.index.json").write_text(json.dumps({"weight_map": files}))
    assert_weights_equal(Llama.from_pretrained(tmp_path / "ckpt"), one)


# published configs (config.json's quantization_config), as their model cards' repositories ship them
RED_HAT_FP8_DYNAMIC = {  # RedHatAI/Meta-Llama-3.1-8B-Instruct-FP8-dynamic
    "config_groups": {"group_0": {
        "input_activations": {"block_structure": None, "dynamic": True, "group_size": None, "num_bits": 8,
                              "observer": "memoryless", "observer_kwargs": {}, "strategy": "token",
                              "symmetric": True, "type": "float"},
        "output_activations": None, "targets": ["Linear"],
        "weights": {"block_structure": None, "dynamic": False, "group_size": None, "num_bits": 8,
                    "observer": "minmax", "observer_kwargs": {}, "strategy": "channel", "symmetric": True,
                    "type": "float"}}},
    "format": "float-quantized", "global_compression_ratio": 1.2405352996226195, "ignore": ["lm_head"],
    "kv_cache_scheme": None, "quant_method": "compressed-tensors", "quantization_status": "compressed"}
W4A16 = {  # RedHatAI/Meta-Llama-3.1-8B-Instruct-quantized.w4a16 (GPTQ, groups of 128)
    "config_groups": {"group_0": {
        "input_activations": None, "output_activations": None, "targets": ["Linear"],
        "weights": {"actorder": None, "block_structure": None, "dynamic": False, "group_size": 128, "num_bits": 4,
                    "observer": "minmax", "observer_kwargs": {}, "strategy": "group", "symmetric": True,
                    "type": "int"}}},
    "format": "pack-quantized", "global_compression_ratio": 1.89, "ignore": ["lm_head"], "kv_cache_scheme": None,
    "quant_method": "compressed-tensors", "quantization_status": "compressed", "sparsity_config": None}
KIMI_K2_THINKING = {  # moonshotai/Kimi-K2-Thinking: the routed experts INT4 in groups of 32, the rest float
    "config_groups": {"group_0": {
        "input_activations": None, "output_activations": None, "targets": ["Linear"],
        "weights": {"actorder": None, "block_structure": None, "dynamic": False, "group_size": 32, "num_bits": 4,
                    "observer": "minmax", "observer_kwargs": {}, "strategy": "group", "symmetric": True,
                    "type": "int"}}},
    "format": "pack-quantized", "kv_cache_scheme": None, "quant_method": "compressed-tensors",
    "quantization_status": "compressed",
    "ignore": ["lm_head", "re:.*self_attn.*", "re:.*shared_experts.*", "re:.*mlp\\.(gate|up|gate_up|down)_proj.*"]}
NVFP4 = {  # RedHatAI's *-NVFP4
    "config_groups": {"group_0": {
        "format": "nvfp4-pack-quantized",
        "input_activations": {"actorder": None, "block_structure": None, "dynamic": "local", "group_size": 16,
                              "num_bits": 4, "observer": "minmax", "observer_kwargs": {}, "strategy": "tensor_group",
                              "symmetric": True, "type": "float"},
        "output_activations": None, "targets": ["Linear"],
        "weights": {"actorder": None, "block_structure": None, "dynamic": False, "group_size": 16, "num_bits": 4,
                    "observer": "minmax", "observer_kwargs": {}, "strategy": "tensor_group", "symmetric": True,
                    "type": "float"}}},
    "format": "nvfp4-pack-quantized", "global_compression_ratio": None, "ignore": ["lm_head"],
    "kv_cache_scheme": None, "quant_method": "compressed-tensors", "quantization_status": "compressed",
    "sparsity_config": {}, "transform_config": {}, "version": "0.12.3.a20251009"}


@pytest.mark.parametrize("q, want", [
    (RED_HAT_FP8_DYNAMIC, ("float", 8, "channel", None, "float-quantized")),
    (W4A16, ("int", 4, "group", 128, "pack-quantized")),
    (KIMI_K2_THINKING, ("int", 4, "group", 32, "pack-quantized")),
    (NVFP4, ("float", 4, "tensor_group", 16, "nvfp4-pack-quantized"))])
def test_published_configs_read(q, want):
    """The published configs read (a config of any family takes them), each as its one scheme."""
    (s,) = schemes(q)
    assert (s.kind, s.bits, s.strategy, s.group, s.format) == want
    LlamaConfig.from_dict({**TINY, "model_type": "llama", "quantization_config": q})


def test_bad_compressed_tensors_configs_raise():
    """What is not read raises naming it: an unknown key, an uncompressed status, sparse or transformed
    weights, unread formats and schemes, dynamic weights, a mixed-precision group without its format."""
    good = RED_HAT_FP8_DYNAMIC
    w = good["config_groups"]["group_0"]["weights"]

    def bad(match, **change):
        q = {**good, **change}
        with pytest.raises(ValueError, match=match):
            schemes(q)
        with pytest.raises(ValueError, match=match):
            LlamaConfig.from_dict({**TINY, "model_type": "llama", "quantization_config": q})

    def group(**weights):
        return {"group_0": {**good["config_groups"]["group_0"], "weights": {**w, **weights}}}

    bad("'zero_point_mode'.* not understood", zero_point_mode=1)
    bad("config_groups must be a non-empty dict, got None", config_groups=None)
    bad("quantization_status 'frozen'", quantization_status="frozen")
    bad("sparse weights", sparsity_config={"format": "sparse-24-bitmask"})
    bad("transform_config", transform_config={"config_groups": {"u": {}}})
    bad("format 'marlin-24'", format="marlin-24")
    bad("dynamic True", config_groups=group(dynamic=True))
    bad("strategy 'token' is not read", config_groups=group(strategy="token"))
    bad("type 'float' num_bits 4 .* format 'float-quantized'", config_groups=group(num_bits=4))
    bad("asymmetric float", config_groups=group(symmetric=False))
    bad("group_size > 0", config_groups=group(strategy="group"))
    bad("block_structure", config_groups=group(strategy="block"))
    bad("every config group must name its format", format="mixed-precision")
    bad("targets must be", config_groups={"g": {"targets": [], "weights": w}})
    bad("actorder 'sideways'", config_groups=group(actorder="sideways"))


def test_bad_compressed_tensors_checkpoints_raise(tmp_path):
    """A checkpoint whose tensors do not match its config raises naming the tensor: a zero point, scales or a
    shape missing or misshapen, codes of another dtype or format than the group's, a module no group (or two)
    targets; a dense group's scales beside float weights are dropped."""
    tiny_checkpoint(tmp_path / "ckpt", "w4a16_asym", torch.float32)
    path, cfg = tmp_path / "ckpt" / "model.safetensors", tmp_path / "ckpt" / "config.json"
    sd, config = safetensors_torch.load_file(path), json.loads(cfg.read_text())
    q = config["quantization_config"]
    m = "model.layers.1.mlp.down_proj"

    def raises(match, tensors=None, quantization=None):
        d = tmp_path / "bad"
        d.mkdir(exist_ok=True)
        safetensors_torch.save_file({k: v for k, v in (tensors or sd).items() if v is not None}, d / path.name)
        (d / "config.json").write_text(json.dumps({**config, "quantization_config": quantization or q}))
        with pytest.raises(ValueError, match=match):
            Llama.from_pretrained(d)

    raises(f"{m}.weight_packed in .* has no {m}.weight_zero_point beside it", {**sd, m + ".weight_zero_point": None})
    raises(f"{m}.weight_packed in .* has no {m}.weight_scale, {m}.weight_shape beside",
           {**sd, m + ".weight_scale": None, m + ".weight_shape": None})
    raises(f"{m} in .* has .*weight_scale.* but no quantised weight", {**sd, m + ".weight_packed": None})
    raises(rf"{m}.weight_scale has shape \[64, 2\]: weight {m} \[64, 96\] takes one scale per 1 x 32 block, "
           r"\[64, 3\]", {**sd, m + ".weight_scale": sd[m + ".weight_scale"][:, :2].contiguous(),
                          m + ".weight_zero_point": sd[m + ".weight_zero_point"][:, :2].contiguous()})
    raises(rf"{m}.weight_zero_point has shape", {**sd, m + ".weight_zero_point": torch.zeros(4, 3, dtype=torch.int8)})
    raises(rf"{m}.weight_shape \[64, 95, 1\] is not", {**sd, m + ".weight_shape": torch.tensor([64, 95, 1])})
    raises("96 values of 4 bits take 12 int32 words a row, got 11",
           {**sd, m + ".weight_packed": sd[m + ".weight_packed"][:, :11].contiguous()})
    raises(f"{m} stores weight .*int8.* format 'pack-quantized'",
           {**sd, m + ".weight_packed": None, m + ".weight": torch.zeros(64, 96, dtype=torch.int8)})
    fp8 = {**q, "format": "float-quantized", "config_groups": {"group_0": {
        "targets": ["Linear"], "weights": {"num_bits": 8, "type": "float", "strategy": "channel"}}}}
    raises(f"{m}.weight is torch.int8, but its config group 'group_0' stores float 8-bit weights as "
           "torch.float8_e4m3fn", {k: v for k, v in sd.items() if "proj" not in k} | {
               m + ".weight": torch.zeros(64, 96, dtype=torch.int8), m + ".weight_scale": torch.ones(64, 1)}, fp8)
    two = {**q, "config_groups": {"a": {**q["config_groups"]["group_0"], "targets": ["re:.*mlp.*"]},
                                  "b": {**q["config_groups"]["group_0"], "targets": ["re:.*down_proj"]}}}
    raises(r"module model.layers.0.mlp.down_proj is stored quantised, and config groups \['a', 'b'\] all target "
           "it", quantization=two)
    none = {**q, "config_groups": {"a": {**q["config_groups"]["group_0"], "targets": ["re:.*self_attn.*"]},
                                   "b": {**q["config_groups"]["group_0"], "targets": ["lm_head"]}}}
    raises("mlp.* is stored quantised, and no config group targets it", quantization=none)
    # a dense group (weights stored float, as a fake-quantised checkpoint's): its scales are not read
    float_sd = safetensors_torch.load_file(tmp_path / "ckpt" / "model.safetensors")
    dense = {**q, "format": "dense", "config_groups": {"group_0": {**q["config_groups"]["group_0"], "format": "dense"}}}
    d = tmp_path / "dense"
    d.mkdir()
    ref = Llama.from_pretrained(tmp_path / "ckpt")
    weights = {k: v for k, v in float_sd.items() if "proj" not in k}
    for name, t in ref.state_dict().items():
        if "proj" in name:
            weights[name] = t
            weights[name[:-len("weight")] + "weight_scale"] = torch.ones(1)
    safetensors_torch.save_file(weights, d / path.name)
    (d / "config.json").write_text(json.dumps({**config, "quantization_config": dense}))
    assert_weights_equal(Llama.from_pretrained(d), ref.state_dict())


needs_kernels = pytest.mark.skipif(not _rowwise_available() or not all(hasattr(torch.ops.triforce_C, k) for k in (
    "rowwise_linear_fp8", "rowwise_linear_q8")), reason="the C++ extension is not built")

# case -> the layer classes a linear layer's weight runs on (None: float32, dequantised) with bfloat16 scales;
# 4 bits: Q4Linear's blocks, where each scale and zero point times it is a float16 value (bfloat16 scales are;
# (-8 - zero) * scale, 12 significant bits, may not be: then Q8Linear)
OWN = {"fp8_dynamic": {"Fp8Linear"}, "fp8_static": {"Fp8Linear"}, "fp8_block": None,  # (40 columns a block: not 64)
       "w8a8_int8": {"Q8Linear"}, "int8_asym": None,  # (8-bit codes minus zero points: not int8)
       "w4a16": None,  # (groups of 16: not 32)
       "w4a16_asym": {"Q4Linear", "Q8Linear"}, "w4a16_g32": {"Q4Linear"}, "w3_channel": {"Q4Linear"},
       "w8a16": {"Q8Linear"}, "w2_tensor_asym": {"Q4Linear", "Q8Linear"}, "nvfp4": {"Q8Linear"},  # (per 16)
       "mxfp4": {"Q8Linear"}}


@needs_kernels
@pytest.mark.parametrize("scales", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("case", list(OWN))
def test_a_compressed_tensors_checkpoint_runs_on_its_own_codes(tmp_path, case, scales):
    """``load_model(directory, "compressed")`` (``load_compressed``): FP8 weights on Fp8Linear, integers of up to
    4 bits on Q4Linear's blocks where their scales allow (bfloat16 ones; not float32 ones, no float16 values),
    other integers (zero points subtracted from codes of up to 7 bits) and FP4 ones (codes twice the FP4 values;
    NVFP4's a scale per 16) on Q8Linear, each layer's weight bitwise the float32 model's (each product in float32
    either way); the logits of every path and every method's tokens bitwise those of ``Llama.from_pretrained``
    (float32, dequantised); what the kernels cannot take (blocks or groups not whole chunks, 8-bit codes with zero
    points) loads float32, dequantised."""
    from triforce.models import hub, quant

    tiny_checkpoint(tmp_path / "ckpt", case, scales)
    plain = Llama.from_pretrained(tmp_path / "ckpt")
    ours, _ = hub.load_model(str(tmp_path / "ckpt"), "compressed")
    floats = dict(plain.named_modules())
    linears = {n: m for n, m in ours.named_modules() if n.endswith("proj")}
    want = OWN[case] or {"Linear"}
    if scales == torch.float32 and "Q4Linear" in want:
        want = {"Q8Linear"}  # (float32 scales: not float16 values)
    kinds = {type(m).__name__ for m in linears.values()}
    assert len(linears) == 14 and kinds <= want and (kinds == want or "Q4Linear" in kinds), kinds
    for n, m in linears.items():
        assert torch.equal(m.weight, floats[n].weight), n
    if kinds & {"Q8Linear", "Q4Linear"}:
        with torch.no_grad():
            assert ours.model.layers[0].fused_arguments(torch.zeros(1, 1, 64)) is not None
    if case == "nvfp4":
        assert all(m.group == 16 and m.scales.shape[1] == m.in_features // 16 for m in linears.values())
    assert isinstance(ours.lm_head, torch.nn.Linear) and not isinstance(ours.lm_head, quant.Q8Linear)
    assert_runs_as(ours, plain)


@needs_kernels
def test_a_mixed_precision_mixture_runs_on_its_own_codes(tmp_path, monkeypatch):
    """A mixture of FP8 attention (blocks of 16 x 64) and 4-bit experts with zero points (groups of 32): the
    attention on Fp8Linear, the experts on Q4Linear's blocks (Q8Linear where a zero point times its scale is no
    float16 value; an expert's gate and up rows, joined, one kind), in one ``moe_experts`` call with their
    modules' bits; the float32 model's logits and tokens bitwise."""
    from triforce.models.quant import load_compressed

    from .test_gpt_oss import assert_one_moe_experts_call

    torch.manual_seed(0)
    kw = dict(TINY, head_dim=16, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32)
    randomize_(transformers.Qwen3MoeForCausalLM(transformers.Qwen3MoeConfig(**kw))).save_pretrained(tmp_path)
    fp8 = ("float-quantized", {"num_bits": 8, "type": "float", "strategy": "block", "block_structure": [16, 64]},
           FP8_TOKEN)
    int4 = ("pack-quantized", {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 32,
                               "symmetric": False}, None)
    write_compressed(tmp_path, {"attention": (scheme(*fp8, targets=[r"re:.*self_attn\..*"]), "self_attn"),
                                "experts": (scheme(*int4, targets=[r"re:.*mlp\.experts\..*"]), "experts")},
                     "mixed-precision", torch.bfloat16)
    ours, plain = load_compressed(tmp_path), Llama.from_pretrained(tmp_path)
    kinds = {type(m).__name__ for n, m in ours.named_modules() if n.endswith("proj")}
    assert {"Fp8Linear", "Q4Linear"} <= kinds <= {"Fp8Linear", "Q4Linear", "Q8Linear"}  # (joined gate and up: one)
    assert_one_moe_experts_call(ours.model.layers[1].mlp, monkeypatch)  # (the experts' codes in one native call)
    assert_runs_as(ours, plain)


def test_load_compressed_errors(tmp_path, monkeypatch):
    """A directory without a compressed-tensors quantization_config, or a GPU device, raises before anything
    loads; scales of the wrong grid raise naming them, as on the dequantising load."""
    from triforce.models import hub
    from triforce.models.quant import load_compressed

    tiny_checkpoint(tmp_path / "ckpt", "w4a16_asym", torch.float32)
    Llama.from_pretrained(tmp_path / "ckpt").save_pretrained(tmp_path / "float")
    for bad in (tmp_path / "float", tmp_path / "missing"):
        with pytest.raises(ValueError, match="not a checkpoint directory with a compressed-tensors"):
            load_compressed(bad)
        with pytest.raises(ValueError, match="compressed-tensors quantization_config"):
            hub.load_model(str(bad), "compressed")
    sd = safetensors_torch.load_file(tmp_path / "ckpt" / "model.safetensors")
    m = "model.layers.0.self_attn.o_proj"
    sd[m + ".weight_scale"] = sd[m + ".weight_scale"][:, :1].contiguous()
    safetensors_torch.save_file(sd, tmp_path / "ckpt" / "model.safetensors")
    with pytest.raises(ValueError, match=rf"{m}.weight_scale has shape \[64, 1\]: .* one scale per 1 x 32 block"):
        load_compressed(tmp_path / "ckpt")
    monkeypatch.setattr(hub, "device_of", lambda name: torch.device("cuda", 0))  # as on a machine with a GPU
    with pytest.raises(ValueError, match="'compressed' runs on the CPU only"):
        hub.load_model(str(tmp_path / "ckpt"), "compressed", device="cuda")


@needs_kernels
def test_the_cli_runs_a_compressed_tensors_checkpoint_on_its_own_codes(tmp_path, capsys):
    """``triforce generate --dtype compressed`` prints the float32 model's text with every method."""
    from .test_cli import VOCAB, _word_tokenizer, run

    torch.manual_seed(0)
    model = Llama(LlamaConfig(vocab_size=len(VOCAB), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256))
    with torch.no_grad():
        model.lm_head.weight.normal_(0, 1)
    model.save_pretrained(tmp_path)
    int4 = ("pack-quantized", {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 32}, None)
    write_compressed(tmp_path, {"group_0": (scheme(*int4), None)}, "pack-quantized", torch.bfloat16)
    _word_tokenizer().save(str(tmp_path / "tokenizer.json"))
    args = ["generate", "--prompt", "the cat sat on a mat", "--max-new-tokens", "12", "--model", str(tmp_path)]
    rc, want, _ = run(args, capsys)  # (float32, dequantised)
    assert rc == 0 and want.split()
    for extra in ([], ["--method", "speculative", "--draft", "int8", "--gamma", "3"],
                  ["--method", "magicdec", "--gamma", "2", "--window", "8"]):
        rc, out, err = run([*args, "--dtype", "compressed", *extra], capsys)
        assert rc == 0 and out == want, (extra, err)


@given(N=st.integers(1, 6), G=st.integers(1, 4), bits=st.integers(1, 5), zero=st.booleans(),
       scales=st.sampled_from([torch.bfloat16, torch.float16, torch.float32]), seed=st.integers(0, 2 ** 31 - 1))
def test_q4_1_blocks_of_codes_and_scales_hold_their_products(N, G, bits, zero, scales, seed):
    """``q4_1_of``: Q4Linear's blocks of int8 codes minus zero points times float32 scales per 32 columns hold
    each product bitwise (d * code + m: the exact product) where every code of the weight's own is in -8..7 and
    every d and m a float16 value; None otherwise (5-bit codes, float32 scales of more bits, m of more bits)."""
    from triforce.models.quant import Q4Linear, q4_1_of

    g = torch.Generator().manual_seed(seed)
    lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    q = torch.randint(lo, hi + 1, (N, G, 32), generator=g, dtype=torch.int8)
    z = torch.randint(lo, hi + 1, (N, G), generator=g).float() if zero else None
    s = (torch.rand(N, G, generator=g) * 0.05 + 1e-3).to(scales).float()
    codes = (q.float() - (0 if z is None else z[..., None])).to(torch.int8).reshape(N, G * 32)
    blocks = q4_1_of(codes, s, z)
    m = (-8 - (0 if z is None else z)) * s.double()
    holds = bits <= 4 and torch.equal(s.half().float(), s) and torch.equal(m.half().double(), m)
    assert (blocks is not None) == holds
    if holds:
        want = codes.float() * s.repeat_interleave(32, 1)
        assert torch.equal(Q4Linear(blocks, G * 32).weight, want)


def test_an_image_and_text_wrapper_loads_its_language_model(tmp_path):
    """An image + text checkpoint (Mistral 3's, as Red Hat's FP8-dynamic Mistral Small 3.1 ships it: the config's
    quantization_config at the top, the vision tower quantised too): its language model dequantised as
    transformers' load gives it, the image side's tensors not read; on its own codes bitwise the float32 model."""
    from triforce.models.quant import load_compressed

    from .test_ministral3 import MINISTRAL3
    from .test_mistral3 import VISION

    config = transformers.Mistral3Config(text_config={**MINISTRAL3, "model_type": "ministral3"}, vision_config=VISION,
                                         image_token_index=100)
    torch.manual_seed(0)
    randomize_(transformers.Mistral3ForConditionalGeneration(config)).save_pretrained(tmp_path)
    fmt, weights, inputs, _ = SCHEMES["fp8_dynamic"]
    write_compressed(tmp_path, {"group_0": (scheme(fmt, weights, inputs), None)}, fmt, torch.bfloat16)
    sd = safetensors_torch.load_file(tmp_path / "model.safetensors")
    assert any(k.startswith("vision_tower") and k.endswith("weight_scale") for k in sd)
    ours = Llama.from_pretrained(tmp_path, dtype=torch.bfloat16)
    ref = transformers.Mistral3ForConditionalGeneration.from_pretrained(
        tmp_path, dtype=torch.bfloat16, quantization_config=transformers.CompressedTensorsConfig(dequantize=True))
    text = {k.replace("model.language_model.", "model."): v for k, v in ref.state_dict().items()
            if k.startswith(("model.language_model.", "lm_head."))}
    want = _build(ours.config, text, None, torch.bfloat16).state_dict()
    assert_weights_equal(ours, want)
    if _rowwise_available() and hasattr(torch.ops.triforce_C, "rowwise_linear_fp8"):
        own, plain = load_compressed(tmp_path), Llama.from_pretrained(tmp_path)
        ids = torch.randint(0, 100, (2, 24), generator=torch.Generator().manual_seed(1))
        with torch.no_grad():
            assert torch.equal(own(ids), plain(ids))


def test_activation_ordered_groups_and_unread_parts(tmp_path):
    """An older GPTQ export's ``weight_g_idx`` (actorder "group": column ``c`` takes group ``g_idx[c]``'s scale)
    dequantises by it; parts a scheme does not read (a symmetric weight's zero points, ``weight_g_idx`` without
    activation order) are dropped wherever they lie, the weights unchanged."""
    from compressed_tensors.compressors.pack_quantized.helpers import unpack_from_int32

    tiny_checkpoint(tmp_path / "ckpt", "w4a16_g32", torch.float32)
    path, cfg = tmp_path / "ckpt" / "model.safetensors", tmp_path / "ckpt" / "config.json"
    plain = Llama.from_pretrained(tmp_path / "ckpt").state_dict()
    sd, config = safetensors_torch.load_file(path), json.loads(cfg.read_text())
    g = torch.Generator().manual_seed(3)
    extra = {}
    for k in [k for k in sd if k.endswith(".weight_packed")]:
        m, K = k[:-len(".weight_packed")], int(sd[k[:-len("packed")] + "shape"][1])
        extra[m + ".weight_g_idx"] = (torch.arange(K) // 32)[torch.randperm(K, generator=g)].int()
        extra[m + ".weight_zero_point"] = torch.zeros_like(sd[m + ".weight_scale"], dtype=torch.int8)
    safetensors_torch.save_file(sd, path)
    safetensors_torch.save_file(extra, tmp_path / "ckpt" / "extra.safetensors")  # (a later shard)
    files = {**{n: "model.safetensors" for n in sd}, **{n: "extra.safetensors" for n in extra}}
    path.rename(tmp_path / "ckpt" / "model-a.safetensors")
    files = {n: "model-a.safetensors" if f == "model.safetensors" else f for n, f in files.items()}
    (tmp_path / "ckpt" / "model.safetensors.index.json").write_text(json.dumps({"weight_map": files}))
    assert_weights_equal(Llama.from_pretrained(tmp_path / "ckpt"), plain)  # (actorder null: g_idx not read)
    q = config["quantization_config"]
    q["config_groups"]["group_0"]["weights"]["actorder"] = "group"
    cfg.write_text(json.dumps(config))
    ours = Llama.from_pretrained(tmp_path / "ckpt").state_dict()
    m = "model.layers.1.mlp.down_proj"
    codes = unpack_from_int32(sd[m + ".weight_packed"], 4, torch.Size(sd[m + ".weight_shape"].tolist()))
    want = codes.float() * sd[m + ".weight_scale"].float()[:, extra[m + ".weight_g_idx"].long()]
    assert torch.equal(ours[m + ".weight"], want) and not torch.equal(want, plain[m + ".weight"])


def test_kimi_k2_thinking_int4_experts(tmp_path, monkeypatch):
    """Kimi K2 Thinking as Moonshot ships it (model_type kimi_k2, DeepSeek-V3's layers; its routed experts INT4 in
    groups of 32 with bfloat16 scales, everything else float, per its config's ignore list): dequantised as
    transformers' load gives it (read as DeepSeek-V3), and on its own codes the experts on Q4Linear's blocks in one
    ``moe_experts`` call, the float32 model's logits bitwise."""
    from triforce.models.quant import Q4Linear, load_compressed

    from .test_fp8 import CASES
    from .test_gpt_oss import assert_one_moe_experts_call

    _, kw, _ = CASES["deepseek_v3"]
    torch.manual_seed(0)
    randomize_(transformers.DeepseekV3ForCausalLM(transformers.DeepseekV3Config(**kw))).save_pretrained(tmp_path)
    q = KIMI_K2_THINKING["config_groups"]["group_0"]
    write_compressed(tmp_path, {"group_0": (QuantizationScheme(**{**q, "format": "pack-quantized"}), "mlp.experts.")},
                     "pack-quantized", torch.bfloat16)
    sd = safetensors_torch.load_file(tmp_path / "model.safetensors")
    quantised = {k.rsplit(".", 1)[0] for k in sd if k.endswith("weight_packed")}
    assert quantised and all(".mlp.experts." in k for k in quantised)  # (not the shared experts, attention, ...)
    cfg = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "model_type": "kimi_k2",
                                                      "quantization_config": KIMI_K2_THINKING}))
    ours = Llama.from_pretrained(tmp_path, dtype=torch.bfloat16)
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "quantization_config": KIMI_K2_THINKING}))
    ref = theirs(tmp_path, torch.bfloat16)  # (transformers reads it as DeepSeek-V3)
    want = _build(ours.config, ref.state_dict(), None, torch.bfloat16).state_dict()
    assert_weights_equal(ours, want)
    if _rowwise_available() and hasattr(torch.ops.triforce_C, "rowwise_linear_q4_1"):
        own, plain = load_compressed(tmp_path), Llama.from_pretrained(tmp_path)
        experts = [m for n, m in own.named_modules() if ".experts." in n and n.endswith("proj")]
        assert experts and all(isinstance(m, Q4Linear) for m in experts)
        assert_one_moe_experts_call(own.model.layers[-1].mlp, monkeypatch)
        assert_runs_as(own, plain)


@pytest.mark.parametrize("kind,where", [("kimi_k25", "top"), ("kimi_k25", "text_config"), ("kimi_vl", None)])
def test_kimi_image_and_text_wrappers_load_their_language_model(tmp_path, kind, where):
    """Moonshot's image + text checkpoints hold DeepSeek-V3's language model under ``language_model.*`` beside a
    vision tower and a projector (Kimi K2.5: ``kimi_k25``, text_config ``kimi_k2`` with Kimi K2 Thinking's INT4
    experts, the quantization_config at the top or in text_config; Kimi-VL: ``kimi_vl``, a float ``deepseek_v3``):
    the language model loads as the same checkpoint without the wrapper does, bitwise (Kimi K2.5's on its own codes
    too), the image side not read (its tensors' names are none of the model's); the wrapper's own keys read, any
    other raising."""
    from .test_fp8 import CASES

    _, kw, _ = CASES["deepseek_v3"]
    torch.manual_seed(0)
    plain = tmp_path / "plain"
    randomize_(transformers.DeepseekV3ForCausalLM(transformers.DeepseekV3Config(**kw))).save_pretrained(plain)
    cfg = json.loads((plain / "config.json").read_text())
    if kind == "kimi_k25":
        q = KIMI_K2_THINKING["config_groups"]["group_0"]
        write_compressed(plain, {"group_0": (QuantizationScheme(**{**q, "format": "pack-quantized"}),
                                             "mlp.experts.")}, "pack-quantized", torch.bfloat16)
        cfg = {**cfg, "model_type": "kimi_k2", "quantization_config": KIMI_K2_THINKING}
        (plain / "config.json").write_text(json.dumps(cfg))
    want = Llama.from_pretrained(plain, dtype=torch.bfloat16).state_dict()
    sd = safetensors_torch.load_file(plain / "model.safetensors")
    g = torch.Generator().manual_seed(1)
    image = {f"vision_tower.encoder.blocks.0.{n}.weight": torch.randn(16, 16, generator=g) for n in ("wqkv", "wo")}
    image[("mm_projector" if kind == "kimi_k25" else "multi_modal_projector") + ".proj.0.weight"] = torch.randn(
        32, 64, generator=g)
    wrapped = tmp_path / kind
    wrapped.mkdir()
    safetensors_torch.save_file({**{f"language_model.{k}": v for k, v in sd.items()}, **image},
                                wrapped / "model.safetensors")
    text = {k: v for k, v in cfg.items() if k != "quantization_config" or where == "text_config"}
    wrapper = {"architectures": ["KimiK25ForConditionalGeneration" if kind == "kimi_k25"
                                 else "KimiVLForConditionalGeneration"], "model_type": kind,
               "auto_map": {"AutoConfig": f"configuration_{kind}.Config", "AutoModel": f"modeling_{kind}.Model"},
               "text_config": text, "vision_config": {"patch_size": 14, "hidden_size": 16}, "ignore_index": -100,
               "media_placeholder_token_id": 163605, "pad_token_id": 0, "torch_dtype": "bfloat16",
               **({"use_unified_vision_chunk": True, "video_placeholder": "<|kimi_k25_video_placeholder|>"}
                  if kind == "kimi_k25" else {}),
               **({"quantization_config": KIMI_K2_THINKING} if where == "top" else {})}
    (wrapped / "config.json").write_text(json.dumps(wrapper))
    ours = Llama.from_pretrained(wrapped, dtype=torch.bfloat16)
    assert ours.config.model_type == "deepseek_v3"
    assert_weights_equal(ours, want)
    if kind == "kimi_k25" and _rowwise_available() and hasattr(torch.ops.triforce_C, "rowwise_linear_q4_1"):
        from triforce.models.quant import load_compressed

        ids = torch.randint(0, 100, (1, 12), generator=g)
        with torch.no_grad():  # (the experts on their own codes, as the unwrapped checkpoint's)
            assert torch.equal(load_compressed(wrapped)(ids), load_compressed(plain)(ids))
    (wrapped / "config.json").write_text(json.dumps({**wrapper, "rope_theta": 1.0}))
    with pytest.raises(ValueError, match=f"config key 'rope_theta' of model_type '{kind}'"):
        Llama.from_pretrained(wrapped)
