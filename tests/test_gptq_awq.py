"""GPTQ and AWQ checkpoints (triforce/models/gptq_awq.py): each layer dequantised bit for bit as the formats'
libraries do (tests/data/gptq_awq.safetensors, written by scripts/gptq_awq_fixtures.py with auto_gptq 0.7.1 and
AutoAWQ 0.2.9), and whole checkpoints loading as the model their layers dequantise to."""
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from triforce.models import Llama, LlamaConfig
from triforce.models.gptq_awq import dequantize_awq, dequantize_gptq

from .test_families import tiny_family

GPTQ_CASES = {"gptq4": 4, "gptq4sym": 4, "gptq8": 8, "gptq2": 2, "gptq4col": 4}
FIXTURE = load_file(Path(__file__).parent / "data" / "gptq_awq.safetensors")


@pytest.mark.parametrize("case", ["awq", *GPTQ_CASES])
def test_each_layer_dequantises_as_the_formats_library_does(case):
    """auto_gptq's QuantLinear (2 / 4 / 8 bits, act-order groups, symmetric or not, one group per column) and
    AutoAWQ's dequantize_gemm, on the layers their own packers wrote: the same float16 weights, bit for bit."""
    d = {k.split(".", 1)[1]: v for k, v in FIXTURE.items() if k.startswith(case + ".")}
    if case == "awq":
        w = dequantize_awq(d["qweight"], d["qzeros"], d["scales"], 64)
    else:
        w = dequantize_gptq(d["qweight"], d["qzeros"], d["scales"], d["g_idx"], GPTQ_CASES[case])
    assert w.dtype == torch.float16 and torch.equal(w, d["deq"].t())
    assert (w.float() - d["W"]).abs().max().item() <= 2 ** -14  # (the grid's values, rounded to float16)


# ---- the tests' packers: the libraries' layouts (checked against their packers below)
def pack_rows(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """int32 words of ``codes`` ``[rows, cols]`` packed along the rows, ``32 / bits`` a word, the first low."""
    per = 32 // bits
    c = codes.to(torch.int64).view(-1, per, codes.shape[1])
    return _to_int32(sum(c[:, k] << (bits * k) for k in range(per)))


def _to_int32(x: torch.Tensor) -> torch.Tensor:
    return torch.where(x >= 2 ** 31, x - 2 ** 32, x).to(torch.int32)


def pack_cols(codes: torch.Tensor, bits: int, order=None) -> torch.Tensor:
    """int32 words of ``codes`` ``[rows, cols]`` packed along the columns (AWQ: word nibble ``k`` holds column
    ``order[k]`` of its 8)."""
    per = 32 // bits
    c = codes.to(torch.int64).view(codes.shape[0], -1, per)
    order = order or range(per)
    return _to_int32(sum(c[:, :, j] << (bits * k) for k, j in enumerate(order)))


def quantise(w: torch.Tensor, bits: int, group: int, act_order: bool = False, seed: int = 0):
    """Min-max asymmetric codes of ``w`` ``[out, in]`` in groups of ``group`` input rows (-1: one), permuted by a
    drawn act-order: -> (codes ``[out, in]``, scales float16 ``[groups, out]``, zeros ``[groups, out]``, g_idx)."""
    n_in = w.shape[1]
    size = n_in if group == -1 else group
    g_idx = torch.arange(n_in, dtype=torch.int32) // size
    if act_order:
        g_idx = g_idx[torch.randperm(n_in, generator=torch.Generator().manual_seed(seed))]
    top = 2 ** bits - 1
    scales = torch.empty(n_in // size, w.shape[0])
    zeros = torch.empty(n_in // size, w.shape[0], dtype=torch.int32)
    for g in range(n_in // size):
        cols = w[:, g_idx == g]
        lo, hi = cols.min(1).values.clamp(max=0), cols.max(1).values.clamp(min=0)
        scales[g] = ((hi - lo) / top + 1e-4).half().float()
        zeros[g] = torch.round(-lo / scales[g]).to(torch.int32).clamp(1, top)  # (GPTQ v1 cannot store a zero of 0)
    s, z = scales[g_idx.long()].t(), zeros[g_idx.long()].t().float()
    codes = torch.clamp(torch.round(w / s) + z, 0, top).to(torch.int32)
    return codes, scales.half(), zeros, g_idx


def gptq_tensors(w, bits, group, act_order=False, v2=False, seed=0):
    codes, scales, zeros, g_idx = quantise(w, bits, group, act_order, seed)
    return {"qweight": pack_rows(codes.t(), bits), "qzeros": pack_cols(zeros - (0 if v2 else 1), bits),
            "scales": scales, "g_idx": g_idx}, _grid(codes, scales, zeros, g_idx)


def awq_tensors(w, group):
    codes, scales, zeros, g_idx = quantise(w, 4, group)
    order = (0, 2, 4, 6, 1, 3, 5, 7)
    return {"qweight": pack_cols(codes.t(), 4, order), "qzeros": pack_cols(zeros, 4, order), "scales": scales}, \
        _grid(codes, scales, zeros, g_idx)


def _grid(codes, scales, zeros, g_idx):
    """The weights ``[out, in]`` the codes stand for: ``(q - z) * s``, rounded once to float16."""
    g = g_idx.long()
    return ((codes.t().float() - zeros[g].float()) * scales[g].float()).half().t()


@pytest.mark.parametrize("case", ["awq", "gptq4", "gptq8", "gptq2", "gptq4col"])
def test_the_tests_packers_write_the_libraries_layouts(case):
    """The checkpoints below are packed by this file's packers: on the fixtures' inputs they write the libraries'
    tensors bit for bit (so those checkpoints are in the formats' layouts)."""
    d = {k.split(".", 1)[1]: v for k, v in FIXTURE.items() if k.startswith(case + ".")}
    bits = 4 if case == "awq" else GPTQ_CASES[case]
    g_idx = d.get("g_idx", torch.arange(256, dtype=torch.int32) // 64)
    s, z = d["scales_in"].float()[:, g_idx.long()], d["zeros_in"].float()[:, g_idx.long()]
    codes = torch.clamp(torch.round(d["W"] / s) + z, 0, 2 ** bits - 1).to(torch.int32)  # [out, in]
    if case == "awq":
        order = (0, 2, 4, 6, 1, 3, 5, 7)
        assert torch.equal(pack_cols(codes.t(), 4, order), d["qweight"])
        assert torch.equal(pack_cols(d["zeros_in"].t(), 4, order), d["qzeros"])
    else:
        assert torch.equal(pack_rows(codes.t(), bits), d["qweight"])
        assert torch.equal(pack_cols(d["zeros_in"].t() - 1, bits), d["qzeros"])
    assert torch.equal(d["scales_in"].t(), d["scales"])


# ---- whole checkpoints
CASES = {  # name -> (family, quantization_config, how a layer is packed)
    "awq-llama": ("llama", {"quant_method": "awq", "bits": 4, "group_size": 16, "zero_point": True, "version": "gemm",
                            "modules_to_not_convert": None}, lambda w: awq_tensors(w, 16)),
    "gptq-qwen2-act-order": ("qwen2", {"quant_method": "gptq", "bits": 4, "group_size": 16, "desc_act": True,
                                       "sym": False, "damp_percent": 0.01, "true_sequential": True,
                                       "model_name_or_path": None, "model_file_base_name": None},
                             lambda w: gptq_tensors(w, 4, 16, act_order=True)),
    "gptq8-v2-phi3": ("phi3", {"quant_method": "gptq", "bits": 8, "group_size": -1, "desc_act": False, "sym": True,
                               "checkpoint_format": "gptq_v2", "meta": {"quantizer": ["gptqmodel:2.0"]}},
                      lambda w: gptq_tensors(w, 8, -1, v2=True)),
}


def quantised_checkpoint(tmp_path, case, drop=(), extra=None):
    """A tiny model of the case's family saved as a quantised checkpoint in two shards (a layer's tensors split
    between them), and the float model holding the weights its layers dequantise to."""
    family, q, pack = CASES[case]
    model = tiny_family(family, 0, layers=2, hidden_size=64, intermediate_size=96)
    model.save_pretrained(tmp_path / "float")
    sd = load_file(tmp_path / "float" / "model.safetensors")
    grid = {}
    for name in [n for n in sd if n.startswith("model.layers.") and n.endswith("proj.weight")]:
        tensors, grid[name] = pack(sd.pop(name))
        sd.update({f"{name[:-len('.weight')]}.{k}": v for k, v in tensors.items() if k not in drop})
    sd.update(extra or {})
    out = tmp_path / "q"
    out.mkdir()
    cfg = json.loads((tmp_path / "float" / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**cfg, "quantization_config": q}))
    names = sorted(sd)
    halves = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    for file, part in halves.items():
        save_file({n: sd[n].contiguous() for n in part}, out / file)
    (out / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {n: f for f, part in halves.items() for n in part}}))
    ref = {**load_file(tmp_path / "float" / "model.safetensors"), **{n: w.float() for n, w in grid.items()}}
    save_file(ref, tmp_path / "float" / "model.safetensors")
    return out, Llama.from_pretrained(tmp_path / "float")


@pytest.mark.parametrize("case", list(CASES))
def test_a_checkpoint_loads_as_the_model_its_layers_dequantise_to(tmp_path, case):
    """AWQ (Llama), GPTQ 4-bit with act-order (Qwen2, with its q / k / v biases), GPTQ 8-bit in the v2 format, one
    group per column (Phi-3, whose q / k / v and gate / up are fused in its checkpoints): the model's logits are those
    of the float model holding the dequantised weights, in float32 bitwise and in bfloat16 (the float16 weights
    rounded to bfloat16) too; the quantised tensors are gone."""
    path, ref = quantised_checkpoint(tmp_path, case)
    ours = Llama.from_pretrained(path)
    ids = torch.randint(0, 64, (2, 20), generator=torch.Generator().manual_seed(1))
    assert not any(n.endswith(("qweight", "qzeros", "scales", "g_idx")) for n in ours.state_dict())
    with torch.no_grad():
        assert torch.equal(ours(ids), ref(ids))
        bf16 = Llama.from_pretrained(path, dtype=torch.bfloat16)
        assert torch.equal(bf16(ids), ref.to(torch.bfloat16)(ids))
    assert "quantization_config" not in json.loads(_saved(ours, tmp_path / "saved"))


def _saved(model, path):
    model.save_pretrained(path)
    return (path / "config.json").read_text()


def test_what_is_not_read_raises(tmp_path):
    base = CASES["gptq-qwen2-act-order"][1]
    for q, match in (({**base, "bits": 3}, "bits = 3"), ({**base, "checkpoint_format": "marlin"}, "marlin"),
                     ({**base, "dynamic": {"-:.*down": {}}}, "dynamic"), ({**base, "new_key": 1}, "'new_key'"),
                     ({**CASES["awq-llama"][1], "version": "gemv"}, "'gemv'"),
                     ({**CASES["awq-llama"][1], "zero_point": False}, "zero_point"),
                     ({**base, "group_size": 0}, "group_size")):
        with pytest.raises(ValueError, match=match):
            LlamaConfig.from_dict({"model_type": "llama", "quantization_config": q})
    path, _ = quantised_checkpoint(tmp_path / "a", "gptq-qwen2-act-order", drop=("g_idx",))
    with pytest.raises(ValueError, match="has no .*g_idx beside it"):
        Llama.from_pretrained(path)
    path, _ = quantised_checkpoint(tmp_path / "b", "awq-llama", drop=("scales",))
    with pytest.raises(ValueError, match="has no .*scales beside it"):
        Llama.from_pretrained(path)
    both = {"model.layers.0.mlp.up_proj.weight": torch.zeros(96, 64)}
    path, _ = quantised_checkpoint(tmp_path / "c", "awq-llama", extra=both)
    with pytest.raises(ValueError, match="both quantised"):
        Llama.from_pretrained(path)
