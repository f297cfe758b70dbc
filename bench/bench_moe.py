"""Benchmark of a mixture of experts' MLP (triforce.models.llama.SparseMoE) at the rows of a decode step and of
verification passes, against transformers' sparse block on the same weights.

A token reads its ``k`` experts' weights; a pass of ``T`` tokens reads every expert any of them chose, up to all
``E``. So unlike a dense layer, whose weights a pass of a few tokens reads once (the reason a verification pass
costs little more than a step), a sparse layer's bytes grow with ``T`` until every expert is hit: with independent
routing ``E * (1 - (1 - k / E) ** T)`` experts. The rows count the experts each input actually hit and the bytes
that makes (those experts' three projections, the router, the rows in and out), against the copy bandwidth
measured in the same run. Routing here is random (random inputs and router): a real model's consecutive tokens
share experts more often, so its passes read fewer.

Shapes (one layer's MLP, random weights, bfloat16 and float32): Qwen3-30B-A3B's (hidden 2048, 128 experts of width
768, 8 chosen: 1.2 GB a layer in bfloat16), or with ``--model mixtral-8x7b`` Mixtral 8x7B's (hidden 4096, 8 experts
of width 14336, 2 chosen: 2.8 GB), or with ``--model gpt-oss-20b`` gpt-oss-20b's (hidden 2880, 32 experts of width
2880, 4 chosen, biases and the clamped SwiGLU: 1.6 GB; against transformers' GptOssMLP). Backends: ``cpu`` (ours:
the router through the row-wise kernel, then every hit expert in one ``triforce_C::moe_experts`` call,
csrc/cpu/moe.cpp), ``cpu_one_by_one`` (the same arithmetic with the experts run module by module from Python, each
product its own row-wise kernel call: the path before that op) and ``transformers`` (its Qwen3MoeSparseMoeBlock /
MixtralSparseMoeBlock: F.linear per hit expert), in turns (the VM's drift); the outputs are checked first (ours
bitwise the one-by-one path, transformers' within rounding).

``--quantised``: the experts quantised, float32 rows: ``int8`` (the int8 draft copy's Q8Linear) and ``q4_1_int8``
(``load_gguf_int8``'s Int8DotLinear on Q4_1 codes: int8 activations, integer dot products), and for gpt-oss-20b
``mxfp4_int8`` (its GGUF file's and OpenAI's MXFP4 experts as ``load_gguf_int8`` runs them), ``cpu`` against
``cpu_one_by_one`` (no transformers block holds these formats).

``--prefill``: prefill chunks of 256 and 512 rows in the prefill's bulk mode (Linear's products of more than 128 rows
on torch's GEMM), ours (one call while every expert has at most 128 of the rows) against ``cpu_one_by_one``.

    python -m bench.bench_moe [--quick] [--model qwen3-30b-a3b|mixtral-8x7b] [--quantised | --prefill]
"""
from __future__ import annotations

import argparse
import contextlib

import torch

from .harness import copy_bandwidth, measure_alternating, record

# name -> (hidden, experts, chosen, expert width, transformers family: Qwen3-MoE's block, Mixtral's)
MODELS = {"qwen3-30b-a3b": (2048, 128, 8, 768, "qwen3_moe"), "mixtral-8x7b": (4096, 8, 2, 14336, "mixtral"),
          "gpt-oss-20b": (2880, 32, 4, 2880, "gpt_oss")}


def _pair(model: str, dtype: torch.dtype):
    """Our SparseMoE and transformers' sparse block of ``model``'s shape on the same random weights."""
    import transformers
    from triforce.models import LlamaConfig
    from triforce.models.llama import SparseMoE

    H, E, k, inter, family = MODELS[model]
    extra = ({"num_experts": E, "num_experts_per_tok": k, "moe_intermediate_size": inter, "norm_topk_prob": True}
             if family == "qwen3_moe" else {"num_local_experts": E, "num_experts_per_tok": k})
    config = LlamaConfig(model_type=family, hidden_size=H, intermediate_size=inter, num_hidden_layers=1,
                         num_attention_heads=16, head_dim=64 if family == "gpt_oss" else None, extra=extra)
    g = torch.Generator().manual_seed(0)
    ours = SparseMoE(config).to(dtype).eval()
    with torch.no_grad():
        ours.gate.weight.copy_(torch.randn(E, H, generator=g) * H ** -0.5)
        for expert in ours.experts:
            for lin in (expert.gate_up_proj, expert.down_proj):
                lin.weight.copy_(torch.randn(lin.weight.shape, generator=g) * lin.in_features ** -0.5)
        for b in (p for n, p in ours.named_parameters() if n.endswith("bias")):
            b.copy_(torch.randn(b.shape, generator=g) * 0.1)
    if family == "gpt_oss":  # its block: stacked experts, x @ W, gate and up columns interleaved
        hf_config = transformers.GptOssConfig(hidden_size=H, num_local_experts=E, num_experts_per_tok=k,
                                              intermediate_size=inter)
        block = transformers.models.gpt_oss.modeling_gpt_oss.GptOssMLP(hf_config).to(dtype).eval()
        with torch.no_grad():
            block.router.weight.copy_(ours.gate.weight)
            block.router.bias.copy_(ours.gate.bias)
            for name in ("gate_up_proj", "down_proj"):
                w = [getattr(e, name).weight for e in ours.experts]
                b = [getattr(e, name).bias for e in ours.experts]
                if name == "gate_up_proj":  # [gate; up] rows -> interleaved
                    w = [torch.stack(t.chunk(2), 1).flatten(0, 1) for t in w]
                    b = [torch.stack(t.chunk(2), 1).flatten(0, 1) for t in b]
                getattr(block.experts, name).copy_(torch.stack([t.T for t in w]))
                getattr(block.experts, f"{name}_bias").copy_(torch.stack(b))
        theirs = lambda x: block(x)[0]  # noqa: E731
        theirs.route = lambda x: block.router(x.reshape(-1, H))[2]  # (its experts per row)
        return ours, theirs
    if family == "qwen3_moe":
        hf_config = transformers.Qwen3MoeConfig(hidden_size=H, num_experts=E, num_experts_per_tok=k,
                                                moe_intermediate_size=inter, norm_topk_prob=True)
        block = transformers.models.qwen3_moe.modeling_qwen3_moe.Qwen3MoeSparseMoeBlock(hf_config)
    else:
        hf_config = transformers.MixtralConfig(hidden_size=H, num_local_experts=E, num_experts_per_tok=k,
                                               intermediate_size=inter)
        block = transformers.models.mixtral.modeling_mixtral.MixtralSparseMoeBlock(hf_config)
    block = block.to(dtype).eval()
    with torch.no_grad():
        block.gate.weight.copy_(ours.gate.weight)
        block.experts.gate_up_proj.copy_(torch.stack([e.gate_up_proj.weight for e in ours.experts]))
        block.experts.down_proj.copy_(torch.stack([e.down_proj.weight for e in ours.experts]))
    return ours, block


def bench_model(model: str, dtype: torch.dtype, rows: tuple, reps: int = 15) -> None:
    H, E, k, inter, family = MODELS[model]
    ours, theirs = _pair(model, dtype)
    bw, es, dt = copy_bandwidth("cpu"), torch.finfo(dtype).bits // 8, str(dtype).replace("torch.", "")
    g = torch.Generator().manual_seed(1)
    for T in rows:
        x = torch.randn(1, T, H, generator=g).to(dtype)
        with torch.no_grad():
            _, index = ours.route(x[0])
            hit = int(index.unique().numel())
            # the rows both routers send to the same experts (GPT-OSS's biased router rounds its logits otherwise
            # in bfloat16: a near tie may choose another expert there)
            agree = (index.sort(-1).values == theirs.route(x).sort(-1).values).all(-1) if hasattr(theirs, "route") \
                else torch.ones(T, dtype=torch.bool)
            same = (ours(x) - theirs(x))[0, agree].abs().max().item()
            scale = theirs(x).abs().max().item()
        assert agree.float().mean() >= 0.75 and (same <= 2e-2 * scale if dtype == torch.bfloat16
                                                 else same <= 1e-4 * scale), (agree, same, scale)
        nbytes = (hit * 3 * H * inter + E * H + 2 * T * H) * es

        def run(f):
            def call():
                with torch.no_grad():
                    f(x)
            return call
        def one_by_one(x):  # the router, then the experts module by module (the path before moe_experts)
            rows = x.reshape(-1, H)
            return ours._experts_one_by_one(rows, *ours.route(rows))

        with torch.no_grad():
            assert torch.equal(one_by_one(x), ours(x).reshape(-1, H))
        t = measure_alternating({"transformers": run(theirs), "cpu": run(ours), "cpu_one_by_one": run(one_by_one)},
                                reps=reps)
        shape = f"model={model},rows={T},experts_hit={hit}/{E}"
        record(family="moe", op="sparse_moe", backend="transformers", shape=shape, dtype=dt, bytes_moved=nbytes,
               timing=t["transformers"], bandwidth=bw, device="cpu")
        record(family="moe", op="sparse_moe", backend="cpu_one_by_one", shape=shape, dtype=dt, bytes_moved=nbytes,
               timing=t["cpu_one_by_one"], bandwidth=bw, device="cpu", baseline="transformers",
               baseline_timing=t["transformers"])
        expected = (f"expected_hit={E * (1 - (1 - k / E) ** T):.1f};"
                    f"vs_one_by_one=x{t['cpu_one_by_one']['median_s'] / t['cpu']['median_s']:.2f}")
        record(family="moe", op="sparse_moe", backend="cpu", shape=shape, dtype=dt, bytes_moved=nbytes,
               timing=t["cpu"], bandwidth=bw, device="cpu", baseline="transformers",
               baseline_timing=t["transformers"], extra=expected)


def _against_one_by_one(ours, model: str, dtype: torch.dtype, label: str, rows: tuple, expert_bytes: int,
                        bulk: bool = False, reps: int = 15) -> None:
    """``ours`` (its experts in one ``moe_experts`` call) against the same modules run one by one, in turns, on
    ``dtype`` rows (``bulk``: a prefill's bulk mode); bytes: the experts hit (``expert_bytes`` each), the router and
    the rows; recorded as dtype ``label``."""
    from triforce.models.llama import _bulk_linears

    H, E = MODELS[model][:2]
    mode = _bulk_linears if bulk else contextlib.nullcontext
    bw, es = copy_bandwidth("cpu"), torch.finfo(dtype).bits // 8
    g = torch.Generator().manual_seed(1)
    for T in rows:
        x = torch.randn(1, T, H, generator=g).to(dtype)
        flat = x.reshape(-1, H)

        def one_by_one():
            return ours._experts_one_by_one(flat, *ours.route(flat))

        with torch.no_grad(), mode():
            _, index = ours.route(flat)
            hit, most = int(index.unique().numel()), int(torch.bincount(index.flatten()).max())
            assert ours._native_weights(flat, index) is not None, most
            assert torch.equal(one_by_one(), ours(x).reshape(-1, H))
        nbytes = hit * expert_bytes + (E * H + 2 * T * H) * es

        def run(f):
            def call():
                with torch.no_grad(), mode():
                    f()
            return call
        t = measure_alternating({"cpu": run(lambda: ours(x)), "cpu_one_by_one": run(one_by_one)}, reps=reps)
        shape = (f"model={model},prefill_rows={T},experts_hit={hit}/{E},most_rows={most}" if bulk
                 else f"model={model},rows={T},experts_hit={hit}/{E}")
        record(family="moe", op="sparse_moe", backend="cpu_one_by_one", shape=shape, dtype=label, bytes_moved=nbytes,
               timing=t["cpu_one_by_one"], bandwidth=bw, device="cpu")
        record(family="moe", op="sparse_moe", backend="cpu", shape=shape, dtype=label, bytes_moved=nbytes,
               timing=t["cpu"], bandwidth=bw, device="cpu", baseline="cpu_one_by_one",
               baseline_timing=t["cpu_one_by_one"])


def bench_quantised(model: str, fmt: str, rows: tuple) -> None:
    """The layer with its experts quantised (float32 rows): ``int8`` as the int8 draft copy holds them (Q8Linear),
    ``q4_1_int8`` as ``load_gguf_int8`` runs a Q4_1 file's (Int8DotLinear: int8 activations, integer dot products);
    ours (one ``moe_experts`` call) against the same modules run one by one; ``mxfp4_int8``: MXFP4 blocks (gguf's
    quantiser on the random weights), as ``load_gguf_int8`` runs a gpt-oss file's experts."""
    from triforce.models.quant import Int8DotLinear, Q4Linear, Q8Linear, gguf_i8_pack

    def mxfp4(lin):
        import gguf
        raw = gguf.quants.quantize(lin.weight.detach().numpy(), gguf.GGMLQuantizationType.MXFP4)
        return Int8DotLinear(*gguf_i8_pack("MXFP4", torch.from_numpy(raw), lin.in_features), lin.in_features,
                             lin.bias)

    ours, _ = _pair(model, torch.float32)
    make = {"int8": Q8Linear.from_linear, "q4_1_int8": lambda lin: Int8DotLinear.from_q4(Q4Linear.from_linear(lin)),
            "mxfp4_int8": mxfp4}
    for expert in ours.experts:
        expert.gate_up_proj, expert.down_proj = make[fmt](expert.gate_up_proj), make[fmt](expert.down_proj)
    _against_one_by_one(ours, model, torch.float32, fmt, rows, sum(b.nbytes for b in ours.experts[0].buffers()))


def bench_prefill(model: str, dtype: torch.dtype, rows: tuple) -> None:
    """A prefill chunk through the layer (``_bulk_linears``: Linear hands products of more than 128 rows to torch's
    GEMM): ours takes one ``moe_experts`` call while no expert has more than 128 of the rows (here, random routing:
    ~T/16 each), against the modules one by one in the same bulk mode."""
    H, E, k, inter, _ = MODELS[model]
    ours, _ = _pair(model, dtype)
    _against_one_by_one(ours, model, dtype, str(dtype).replace("torch.", ""), rows,
                        3 * H * inter * torch.finfo(dtype).bits // 8, bulk=True, reps=5)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="1 and 8 rows, bfloat16 only")
    p.add_argument("--model", choices=list(MODELS), default="qwen3-30b-a3b")
    p.add_argument("--quantised", action="store_true", help="the experts as int8 (Q8Linear) and Q4_1 x int8 "
                   "(Int8DotLinear) instead of bfloat16 / float32")
    p.add_argument("--prefill", action="store_true", help="prefill chunks of 256 and 512 rows (bulk mode)")
    a = p.parse_args()
    rows = (1, 8) if a.quick else (1, 2, 4, 8, 16, 64)
    if a.prefill:
        for dtype in (torch.bfloat16, torch.float32):
            bench_prefill(a.model, dtype, (256, 512))
        return
    if a.quantised:
        for fmt in ("int8", "q4_1_int8") + (("mxfp4_int8",) if a.model == "gpt-oss-20b" else ()):
            bench_quantised(a.model, fmt, rows)
        return
    for dtype in (torch.bfloat16,) if a.quick else (torch.bfloat16, torch.float32):
        bench_model(a.model, dtype, rows)


if __name__ == "__main__":
    main()
