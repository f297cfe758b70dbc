"""Benchmark of one forward of the model layer on the CPU (SmolLM2-135M, the embedded model): the fused
decoder layer (csrc/cpu/decoder.cpp) against its baseline, the same modules run one by one
(``TRIFORCE_FUSED_LAYER=0``), in turns in one run. The fused path runs as one native call for all layers
and the cache's side of them (``decoder_layers``, backend ``cpu``) and, as a second variant, as two native
calls per layer from Python around the cache's ``attend`` (``TRIFORCE_DECODER_LAYERS=0``, backend
``cpu_per_layer``). With more than one thread the one-call path runs its kernels on a thread team formed once
per forward (csrc/include/triforce/team.h); a fourth variant runs it without (``TRIFORCE_FORWARD_TEAM=0``,
backend ``cpu_no_team``: the kernels' own OpenMP regions). All compute bitwise the same logits.

Shapes: an autoregressive step (T = 1) and a verification pass (T = 5) at batch 1 and 4, over a full
cache of ``ctx`` tokens, float32 (the target), bfloat16 (the default draft copy) and, with ``--dtype
int8``, the int8 copy (``triforce.models.int8_copy``: int8 weights with float32 activations and cache);
``--dtype gguf``: the model on its GGUF file's own Q4_1 / Q8_0 blocks (``triforce.models.gguf_copy``, the
float32 model's bits); ``--dtype gguf-int8``: those blocks with the activations rounded to int8 blocks
(``gguf_copy(..., activations="int8")``, integer dot products).

``--many-rows``: verification passes of more rows than the fused layer takes (batch 32 and 64, T = 5,
``ctx`` 500): the modules with their linears on the row-independent kernel (what every forward that
extends a cache runs, bitwise a one-token step's rows) against the same modules with torch's GEMM (what
a prefill's chunks of more than ``ROWWISE_MAX_ROWS`` rows take), in turns.

``--ragged``: verification passes whose rows verify different numbers of tokens (``Llama.forward(..., widths=)``,
what prompt lookup's and TriForce's full-level passes run on a CPU): the real tokens packed (backend ``cpu``)
against the same pass computed at the longest row's width for every row (``padded``: the padding's logits
computed and zeroed) and the batch's one-token step (``step``, the floor), in turns. Widths: prompt lookup's on
natural text at batch 8 and 16 (most rows propose nothing or 1-2 tokens), and on the demo's pass-key batch of 4.
Its FLOPs count the real tokens (``padded``: all of the batch's rows times T).

``--family F`` (F one of gpt2, opt, starcoder2, pythia, nemotron, olmo, olmo-clip, olmo2, granite, cohere2, hunyuan,
apertus, qwen3_moe, flex_olmo, afmoe, ettin, opt-350m, bloom, gemma3): instead of the embedded model, random weights of
that family at its smallest published shape (gpt2's 124M: 12 layers of 768, learned positions, LayerNorms, GELU;
opt-125m's: the same with ReLU; a 12-layer, 768-wide StarCoder 2: LayerNorms, grouped keys, GELU; pythia-160m's:
GPT-NeoX's parallel block; 12-layer, 768-wide Nemotron and OLMo 1 models: LayerNorm1P, ReLU squared; weightless
LayerNorms, SwiGLU (``olmo-clip``: q, k and v clamped); 12-layer, 768-wide OLMo 2 and Granite models: norms after the
blocks, Granite's multipliers; a 12-layer, 768-wide Cohere 2 (its LayerNorm, parallel block, float32 RoPE, a
256000-token head); a 12-layer, 1024-wide Hunyuan (q/k norms after RoPE); a 12-layer, 768-wide Apertus (xIELU); a
12-layer, 768-wide Qwen3-MoE (its attention's side native, its mixture in Python, layer by layer) and FlexOlmo (the same
under norms after the blocks) and AFMoE (four float32 norms, a gated attention output); ettin-decoder-150m's (ModernBERT
decoder: 22 layers of 768, a gated exact GELU, a prediction head); opt-350m's: 24 layers of 1024 with each norm after
its residual add, a popular draft model; bloom-560m's: 24 layers of 1024 with ALiBi, a 250880-token head;
gemma-3-270m's: 18 layers of 640 with Gemma's four norms a layer, GeGLU, local and global layers, a 262144-token head),
float32 or bfloat16: the families whose layers only the one-call path fuses (their per-layer path is the modules';
``per_layer`` equals ``modules`` there; Qwen3-MoE's per-layer path is its only fused one).

Bytes = the weights read once (every linear layer and the LM head) + the KV cache read + the step's keys
and values written; GB/s against the copy bandwidth measured in the same run. FLOPs = 2 x rows x the
linear layers' weights (the LM head included) + 4 x head_dim per query head, visible key and layer
(attention); the compute ceiling is a matmul in the model's dtype measured in the same run.

    python -m bench.bench_decoder [--quick] [--many-rows] [--ragged] [--threads N]
        [--dtype float32|bfloat16|int8|gguf|gguf-int8|both]   # TRIFORCE_BENCH_CSV=/tmp/x.csv keeps the repo clean
"""
import argparse
import contextlib
import os

import torch

from triforce.models import FullCache
from triforce.models import llama as llama_mod
from triforce.models.hub import load_model
from triforce.models.quant import Int8DotLinear, Q4Linear, Q8Linear, int8_copy

from .harness import compute_peak, copy_bandwidth, measure_alternating, record

SHAPES = ((1, 1000, 1), (1, 1000, 5), (4, 3000, 1), (4, 3000, 5))
MANY_ROWS = ((32, 500, 5), (64, 500, 5))
# (B, ctx, widths): each row's real tokens in a pass of max(widths) tokens
RAGGED = ((8, 1024, (5, 1, 2, 1, 1, 3, 1, 1)), (16, 1024, (5, 1, 2, 1, 1, 3, 1, 1) * 2), (4, 3000, (5, 5, 3, 1)))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="batch 1 only, fewer repetitions")
    p.add_argument("--threads", type=int, default=0, help="CPU threads; 0 = default")
    p.add_argument("--dtype", choices=["float32", "bfloat16", "int8", "gguf", "gguf-int8", "both"], default="both",
                   help="both: float32 and bfloat16")
    p.add_argument("--many-rows", action="store_true",
                   help="passes of 160 and 320 rows: the linears on the kernel against torch's GEMM")
    p.add_argument("--ragged", action="store_true",
                   help="passes whose rows verify different numbers of tokens: packed against padded")
    p.add_argument("--family", choices=["smollm2", *FAMILY_SHAPES], default="smollm2",
                   help="the embedded model, or random weights of another family's smallest shape")
    a = p.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    if not llama_mod._fused_available():
        raise SystemExit("the C++ extension (triforce_kernels._C with decoder_attn_in) is not built, or "
                         "TRIFORCE_FUSED_LAYER=0 / TRIFORCE_ROWWISE_LINEAR=0 is set")
    bw = copy_bandwidth("cpu")
    for name in (["float32", "bfloat16"] if a.dtype == "both" else [a.dtype]):
        if name in ("int8", "gguf", "gguf-int8"):  # quantised weights, float32 activations and cache
            model = (int8_copy(load_model("smollm2", dtype="float32")[0]) if name == "int8"
                     else load_model("smollm2", dtype=name)[0])
            dtype = torch.float32
            quantised = [m for m in model.modules() if isinstance(m, (Q8Linear, Q4Linear, Int8DotLinear))]
            weights = sum(m.in_features * m.out_features for m in quantised)
            weight_bytes = sum(sum(b.numel() * b.element_size() for b in m.buffers()) for m in quantised)
        else:
            dtype = getattr(torch, name)
            model = load_model("smollm2", dtype=name)[0] if a.family == "smollm2" else family_model(a.family, dtype)
            weights = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
            weight_bytes = weights * dtype.itemsize
        cfg = model.config
        peak = compute_peak("cpu", dtype)
        if a.ragged:
            _bench_ragged(model, name, dtype, weights, weight_bytes, peak, bw, a.quick)
            continue
        shapes = MANY_ROWS if a.many_rows else SHAPES
        for B, ctx, T in (shapes[:1] if a.quick and a.many_rows else shapes[:2] if a.quick else shapes):
            ctx = min(ctx, cfg.max_position_embeddings - T)  # (gpt2's and opt's contexts: 1024, 2048)
            cache = FullCache(cfg, B, ctx + T, dtype=dtype)
            cache.lengths.fill_(ctx)  # a context of zeros: the attention reads it all the same
            ids = torch.randint(0, cfg.vocab_size, (B, T), generator=torch.Generator().manual_seed(0))
            start = cache.lengths.clone()

            def step():
                cache.rollback(start)
                return model(ids, cache=cache)

            def run(fused, stack=None, team=True):
                def f():
                    llama_mod._FUSED, llama_mod._STACK = fused, stack
                    with contextlib.nullcontext() if team else _no_team():
                        step()
                return f

            def run_linears(gemm):  # the prefill's rule (torch's GEMM above ROWWISE_MAX_ROWS rows) or not
                def f():
                    with llama_mod._bulk_linears() if gemm else contextlib.nullcontext():
                        step()
                return f

            kv_token = cfg.num_hidden_layers * 2 * cfg.num_key_value_heads * cfg.head_dim * dtype.itemsize
            read, used = _expert_weights(model, B * T)  # (a mixture's: only the chosen experts' weights move)
            nbytes = weight_bytes - (weights - read) * dtype.itemsize + B * (ctx + T) * kv_token
            visible = B * (T * ctx + T * (T + 1) // 2)  # (query token, key) pairs per head and layer, causal
            flops = 2 * B * T * used + 4 * cfg.head_dim * cfg.num_attention_heads * visible * cfg.num_hidden_layers
            shape = f"model={a.family},B={B},ctx={ctx},T={T}"
            if a.many_rows:
                assert B * T > llama_mod.ROWWISE_MAX_ROWS
                t = measure_alternating({"gemm": run_linears(True), "kernel": run_linears(False)},
                                        reps=4 if a.quick else 10)
                record(family="model", op="model_step", backend="torch_gemm", shape=shape, dtype=name,
                       bytes_moved=nbytes, timing=t["gemm"], bandwidth=bw, flops=flops, peak=peak)
                record(family="model", op="model_step", backend="cpu", shape=shape, dtype=name, bytes_moved=nbytes,
                       timing=t["kernel"], bandwidth=bw, flops=flops, peak=peak, baseline="torch_gemm",
                       baseline_timing=t["gemm"])
                continue
            variants = {"modules": run(False), "per_layer": run(True, False), "fused": run(True)}
            if torch.get_num_threads() > 1:
                variants["no_team"] = run(True, team=False)
            t = measure_alternating(variants, reps=8 if a.quick else 20)
            llama_mod._FUSED = llama_mod._STACK = None  # back to the environment's choice
            record(family="model", op="model_step", backend="modules", shape=shape, dtype=name, bytes_moved=nbytes,
                   timing=t["modules"], bandwidth=bw, flops=flops, peak=peak)
            for backend, key in (("cpu_per_layer", "per_layer"), ("cpu_no_team", "no_team"), ("cpu", "fused")):
                if key not in t:
                    continue
                extra = ""
                if key == "fused" and "no_team" in t:  # the thread team's own gain, in the same turns
                    gain = t["no_team"]["median_s"] / t[key]["median_s"]
                    extra = f"threads={torch.get_num_threads()};vs_no_team={gain:.2f}x"
                record(family="model", op="model_step", backend=backend, shape=shape, dtype=name,
                       bytes_moved=nbytes, timing=t[key], bandwidth=bw, flops=flops, peak=peak, baseline="modules",
                       baseline_timing=t["modules"], extra=extra)


# family -> config.json keys of its smallest published shape (random weights: the speed does not depend on them)
FAMILY_SHAPES = {"gpt2": {"model_type": "gpt2"}, "opt": {"model_type": "opt"},
                 "starcoder2": {"model_type": "starcoder2", "vocab_size": 49152, "hidden_size": 768,
                                "intermediate_size": 3072, "num_hidden_layers": 12, "num_attention_heads": 12,
                                "num_key_value_heads": 4, "use_bias": True},
                 # pythia-160m's: GPT-NeoX's parallel block (each half on its own norm), RoPE on a quarter of each head
                 "pythia": {"model_type": "gpt_neox", "vocab_size": 50304, "hidden_size": 768,
                            "intermediate_size": 3072, "num_hidden_layers": 12, "num_attention_heads": 12,
                            "max_position_embeddings": 2048},
                 # a 12-layer, 768-wide Nemotron (its smallest published model, Nemotron-Mini-4B, is 32 x 3072):
                 # LayerNorm1P, ReLU squared, RoPE on half of each head
                 "nemotron": {"model_type": "nemotron", "vocab_size": 49152, "hidden_size": 768,
                              "intermediate_size": 3072, "num_hidden_layers": 12, "num_attention_heads": 12,
                              "num_key_value_heads": 4},
                 # a 12-layer, 768-wide OLMo 1 (its smallest, OLMo-1B, is 16 x 2048): weightless LayerNorms, SwiGLU
                 "olmo": {"model_type": "olmo", "vocab_size": 50304, "hidden_size": 768, "intermediate_size": 2048,
                          "num_hidden_layers": 12, "num_attention_heads": 12},
                 # the same with OLMo-7B-0424's clamp of q, k and v at 8 (the stack's clip_qkv)
                 "olmo-clip": {"model_type": "olmo", "vocab_size": 50304, "hidden_size": 768,
                               "intermediate_size": 2048, "num_hidden_layers": 12, "num_attention_heads": 12,
                               "clip_qkv": 8.0},
                 # opt-350m's: 24 layers of 1024, each norm after its residual add, 512-wide embeddings projected
                 "opt-350m": {"model_type": "opt", "hidden_size": 1024, "ffn_dim": 4096, "num_hidden_layers": 24,
                              "num_attention_heads": 16, "do_layer_norm_before": False, "word_embed_proj_dim": 512},
                 # bloom-560m's: 24 layers of 1024, ALiBi, LayerNorms (one on the embeddings), GELU's tanh form,
                 # a 250880-token tied head
                 "bloom": {"model_type": "bloom", "vocab_size": 250880, "hidden_size": 1024, "n_layer": 24,
                           "n_head": 16},
                 # 12-layer, 768-wide OLMo 2 (OLMo-2-0425-1B is 16 x 2048): norms after the blocks (the weight in
                 # float32), q/k norms over whole projections; and Granite (granite-3.3-2b is 40 x 2048): its
                 # multipliers (granite-3.3-2b's residual 0.22, attention 1/64)
                 "olmo2": {"model_type": "olmo2", "vocab_size": 100352, "hidden_size": 768, "intermediate_size": 2048,
                           "num_hidden_layers": 12, "num_attention_heads": 12},
                 "granite": {"model_type": "granite", "vocab_size": 49155, "hidden_size": 768,
                             "intermediate_size": 2048, "num_hidden_layers": 12, "num_attention_heads": 12,
                             "num_key_value_heads": 4, "residual_multiplier": 0.22, "attention_multiplier": 0.015625,
                             "embedding_multiplier": 12.0, "logits_scaling": 8.0},
                 # a 12-layer, 768-wide Cohere 2 (Command R7B is 32 x 4096): Cohere's LayerNorm, a parallel block,
                 # RoPE in float32 on three local layers of four, NoPE on the fourth
                 "cohere2": {"model_type": "cohere2", "vocab_size": 256000, "hidden_size": 768,
                             "intermediate_size": 2048, "num_hidden_layers": 12, "num_attention_heads": 12,
                             "num_key_value_heads": 4, "sliding_window": 4096},
                 # a 12-layer, 1024-wide Hunyuan (Hunyuan-0.5B is 24 x 1024): q/k norms after RoPE
                 "hunyuan": {"model_type": "hunyuan_v1_dense", "vocab_size": 120818, "hidden_size": 1024,
                             "intermediate_size": 3584, "num_hidden_layers": 12, "num_attention_heads": 16,
                             "num_key_value_heads": 8, "tie_word_embeddings": True},
                 # a 12-layer, 768-wide Apertus (Apertus-8B is 32 x 4096): xIELU, q/k norms
                 "apertus": {"model_type": "apertus", "vocab_size": 131072, "hidden_size": 768,
                             "intermediate_size": 3072, "num_hidden_layers": 12, "num_attention_heads": 12,
                             "num_key_value_heads": 4},
                 # a 12-layer, 768-wide Qwen3-MoE (Qwen3-30B-A3B is 48 x 2048, 128 experts): 32 experts of 384, 4 a
                 # token (its bytes and FLOPs count the experts the rows choose: _expert_weights)
                 "qwen3_moe": {"model_type": "qwen3_moe", "vocab_size": 32000, "hidden_size": 768,
                               "intermediate_size": 2048, "moe_intermediate_size": 384, "num_experts": 32,
                               "num_experts_per_tok": 4, "norm_topk_prob": True, "num_hidden_layers": 12,
                               "num_attention_heads": 12, "num_key_value_heads": 4, "head_dim": 64},
                 # a 12-layer, 768-wide FlexOlmo (FlexOlmo-7x7B is 32 x 4096): OLMo 2's norms after the blocks
                 # around OLMoE's mixture, 16 experts of 1024, 2 a token (the stack stops before each mixture)
                 "flex_olmo": {"model_type": "flex_olmo", "vocab_size": 100352, "hidden_size": 768,
                               "intermediate_size": 1024, "num_experts": 16, "num_experts_per_tok": 2,
                               "num_hidden_layers": 12, "num_attention_heads": 12},
                 # a 12-layer, 768-wide AFMoE (Arcee's Trinity: its layer at a small width, a 32000-token head):
                 # four float32 norms, the heads' output gated by a sigmoid, NoPE global layers, 32 experts of 384, 4 a
                 # token, the first layer dense
                 "afmoe": {"model_type": "afmoe", "vocab_size": 32000, "hidden_size": 768, "intermediate_size": 2048,
                           "moe_intermediate_size": 384, "num_experts": 32, "num_experts_per_tok": 4,
                           "num_shared_experts": 1, "num_hidden_layers": 12, "num_attention_heads": 12,
                           "num_key_value_heads": 4, "head_dim": 64, "sliding_window": 512},
                 # ettin-decoder-150m's (ModernBERT decoder): 22 layers of 768, LayerNorms, multi-head attention,
                 # two global layers of three sliding over 64 tokens, a gated exact GELU, a prediction head; its first
                 # layer on the modules, the others in the stack
                 "ettin": {"model_type": "modernbert-decoder"},
                 # gemma-3-270m's: 18 layers of 640, Gemma's norms (four a layer, sandwich) and q/k norms, GeGLU,
                 # 4 query heads of 256 over one key head, five local layers (a 512-token window, their own RoPE)
                 # to one global, a 262144-token tied head
                 "gemma3": {"model_type": "gemma3_text", "vocab_size": 262144, "hidden_size": 640,
                            "intermediate_size": 2048, "num_hidden_layers": 18, "num_attention_heads": 4,
                            "num_key_value_heads": 1, "head_dim": 256, "sliding_window": 512,
                            "max_position_embeddings": 32768, "rope_local_base_freq": 10000.0}}


def _expert_weights(model, rows: int) -> tuple:
    """``(weights read, weights a row multiplies)`` of ``model``'s linear layers in a forward of ``rows`` tokens: every
    weight, except a mixture of experts' (``SparseMoE``), whose experts count by how many the rows choose, expected
    ``E * (1 - (1 - k / E) ** rows)`` of ``E`` experts read and ``k`` a row multiplied (random weights route about
    uniformly)."""
    read = used = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    for moe in model.modules():
        if isinstance(moe, llama_mod.SparseMoE):
            E, k = len(moe.experts), moe.top_k
            expert = sum(m.weight.numel() for m in moe.experts[0].modules() if isinstance(m, torch.nn.Linear))
            read -= E * expert - round(E * (1 - (1 - k / E) ** rows)) * expert
            used -= (E - k) * expert
    return read, used


def family_model(family: str, dtype: torch.dtype):
    """A model of ``family``'s smallest shape (:data:`FAMILY_SHAPES`), random weights, in ``dtype``."""
    from triforce.models import Llama, LlamaConfig

    torch.manual_seed(0)
    return Llama(LlamaConfig.from_dict(dict(FAMILY_SHAPES[family]))).eval().to(dtype)


def _bench_ragged(model, name, dtype, weights, weight_bytes, peak, bw, quick) -> None:
    """``--ragged``: ``RAGGED``'s passes, packed (``widths=``) against padded and the one-token step."""
    cfg = model.config
    kv_token = cfg.num_hidden_layers * 2 * cfg.num_key_value_heads * cfg.head_dim * dtype.itemsize
    attn = 4 * cfg.head_dim * cfg.num_attention_heads * cfg.num_hidden_layers  # per (query token, key) pair
    for B, ctx, ws in RAGGED[:1] if quick else RAGGED:
        widths = torch.tensor(ws, dtype=torch.int32)
        T = int(widths.max())
        cache = FullCache(cfg, B, ctx + T, dtype=dtype)
        cache.lengths.fill_(ctx)  # a context of zeros: the attention reads it all the same
        ids = torch.randint(0, cfg.vocab_size, (B, T), generator=torch.Generator().manual_seed(0))
        start = cache.lengths.clone()

        def run(x, w=None):
            def f():
                cache.rollback(start)
                model(x, cache=cache, widths=w)
            return f

        t = measure_alternating({"padded": run(ids), "ragged": run(ids, widths), "step": run(ids[:, :1])},
                                reps=8 if quick else 20)
        shape = f"model=smollm2,B={B},ctx={ctx},widths={'-'.join(map(str, ws))}"
        real = int(widths.sum())

        def flops(tokens, pairs):  # tokens: rows through the linears; pairs: (query, key) pairs per head and layer
            return 2 * tokens * weights + attn * pairs

        causal = lambda w: sum(ctx + i + 1 for i in range(w))  # noqa: E731  (a row's pairs for w queries)
        common = dict(family="model", op="model_step_ragged", dtype=name, bandwidth=bw, peak=peak)
        record(backend="padded", shape=shape, bytes_moved=weight_bytes + B * (ctx + T) * kv_token, timing=t["padded"],
               flops=flops(B * T, B * causal(T)), **common)
        record(backend="step", shape=shape, bytes_moved=weight_bytes + B * (ctx + 1) * kv_token, timing=t["step"],
               flops=flops(B, B * causal(1)), **common)
        record(backend="cpu", shape=shape, bytes_moved=weight_bytes + (B * ctx + real) * kv_token, timing=t["ragged"],
               flops=flops(real, sum(causal(w) for w in ws)), baseline="padded", baseline_timing=t["padded"],
               extra=f"real={real}/{B * T};vs_step={t['ragged']['median_s'] / t['step']['median_s']:.2f}x", **common)


@contextlib.contextmanager
def _no_team():
    """The one-call forward without its thread team (``TRIFORCE_FORWARD_TEAM``, read at every call)."""
    old = os.environ.get("TRIFORCE_FORWARD_TEAM")
    os.environ["TRIFORCE_FORWARD_TEAM"] = "0"
    try:
        yield
    finally:
        if old is None:
            del os.environ["TRIFORCE_FORWARD_TEAM"]
        else:
            os.environ["TRIFORCE_FORWARD_TEAM"] = old


if __name__ == "__main__":
    main()
