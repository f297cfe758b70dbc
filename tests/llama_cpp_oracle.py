"""llama.cpp as an oracle for the GGUF readers: the logits llama.cpp computes from a GGUF file.

Opt-in (``TRIFORCE_LLAMA_CPP=1``, with ``llama-cpp-python`` 0.3.36 installed: pip builds llama.cpp from source,
~12 min on 2 cores; docs/development.md, "Tests", has the build's settings). Each evaluation runs in a subprocess
of this interpreter (an assertion inside llama.cpp aborts its process, not the test run): the file loaded on the
CPU, the K/V cache in float32, no flash attention, a full-size cache for sliding-window layers, the ids evaluated
as one batch, a context of exactly their number, and llama.cpp's context defaults where llama-cpp-python's differ
(its YaRN settings would override the file's).

A file without a vocabulary (the tests' tiny models) is run with ``tokenizer.ggml.model`` overridden to ``none``
(llama.cpp's own setting for a model without one), so llama.cpp takes token ids only.
"""
from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

_EVAL = r"""
import json, sys
import numpy as np
import llama_cpp
path, ids_file, out_file, overrides, context, threads = sys.argv[1:7]
ids = np.load(ids_file).tolist()
llm = llama_cpp.Llama(model_path=path, n_ctx=len(ids), n_batch=len(ids), n_ubatch=len(ids),
                      logits_all=True, type_k=0, type_v=0, n_threads=int(threads), flash_attn=False, swa_full=True,
                      kv_overrides=json.loads(overrides) or None, verbose=True, **json.loads(context))
llm.eval(ids)
np.save(out_file, np.asarray(llm.scores[: len(ids)], dtype=np.float32))
"""


_TOKENIZE = r"""
import json, sys
import llama_cpp
path, texts_file = sys.argv[1:3]
llm = llama_cpp.Llama(model_path=path, vocab_only=True, verbose=False)
texts = json.load(open(texts_file, encoding="utf-8"))
print(json.dumps([llm.tokenize(t.encode("utf-8"), add_bos=True, special=True) for t in texts]))
"""


def enabled() -> bool:
    return os.environ.get("TRIFORCE_LLAMA_CPP") == "1"


def available() -> bool:
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        return False
    return True


def _overrides(path: Path) -> tuple[dict, dict]:
    """llama.cpp's metadata overrides and context parameters for the file at ``path``: ``tokenizer.ggml.model``
    ``none`` where it has no vocabulary; llama.cpp's own YaRN defaults (-1: the model's), where llama-cpp-python's
    would override them, and the file's YaRN betas, which llama.cpp reads for grok and mistral3 only (any other file
    runs at 32 / 1 there, whatever it says; docs/model.md, "What GGUF metadata is read")."""
    import gguf

    fields = gguf.GGUFReader(str(path)).fields
    arch = fields["general.architecture"].contents()
    context = {"yarn_attn_factor": -1.0, "yarn_beta_fast": -1.0, "yarn_beta_slow": -1.0}
    for k in ("yarn_beta_fast", "yarn_beta_slow"):
        if f"{arch}.rope.scaling.{k}" in fields:
            context[k] = float(fields[f"{arch}.rope.scaling.{k}"].contents())
    return {} if "tokenizer.ggml.model" in fields else {"tokenizer.ggml.model": "none"}, context


def llama_cpp_logits(path, ids, threads: int = 2, timeout: float = 600) -> np.ndarray:
    """llama.cpp's float32 logits ``[len(ids), vocab]`` for one sequence of token ``ids`` run through the GGUF at
    ``path``. Raises ``RuntimeError`` with llama.cpp's output where it refuses the file or aborts."""
    path = Path(path)
    with tempfile.TemporaryDirectory() as d:
        ids_file, out_file = Path(d) / "ids.npy", Path(d) / "out.npy"
        np.save(ids_file, np.asarray(ids, dtype=np.int64))
        overrides, context = _overrides(path)
        proc = subprocess.run([sys.executable, "-c", _EVAL, str(path), str(ids_file), str(out_file),
                               json.dumps(overrides), json.dumps(context), str(threads)],
                              capture_output=True, text=True, timeout=timeout)
        if proc.returncode != 0 or not out_file.exists():
            lines = [s for s in (proc.stderr + proc.stdout).splitlines()
                     if any(w in s.lower() for w in ("error", "failed", "exception", "abort", "assert"))]
            raise RuntimeError(f"llama.cpp (exit {proc.returncode}) on {path.name}: " + " | ".join(lines[-6:]))
        return np.load(out_file)


def llama_cpp_tokenize(path, texts, timeout: float = 600) -> list[list[int]]:
    """llama.cpp's token ids for each of ``texts`` with the GGUF's vocabulary (its BOS where the file asks for one,
    special tokens parsed)."""
    with tempfile.TemporaryDirectory() as d:
        texts_file = Path(d) / "texts.json"
        texts_file.write_text(json.dumps(list(texts)), encoding="utf-8")
        proc = subprocess.run([sys.executable, "-c", _TOKENIZE, str(path), str(texts_file)],
                              capture_output=True, text=True, timeout=timeout)
        if proc.returncode != 0:
            raise RuntimeError(f"llama.cpp (exit {proc.returncode}): {proc.stderr[-2000:]}")
        return json.loads(proc.stdout.splitlines()[-1])


def weight_types(path) -> list[str]:
    """The GGUF's tensor types (e.g. ``['F32', 'Q8_0']``)."""
    import gguf

    return sorted({t.tensor_type.name for t in gguf.GGUFReader(str(path)).tensors})


def compare(ours: np.ndarray, theirs: np.ndarray) -> dict:
    """Our logits against llama.cpp's, one sequence ``[T, V]``: the largest difference, relative to the
    largest logit, and how many positions have the same top token."""
    diff = float(np.abs(ours - theirs).max())
    scale = float(max(1.0, np.abs(theirs).max()))
    top = float((ours.argmax(-1) == theirs.argmax(-1)).mean())
    return {"max_abs": diff, "scale": scale, "rel": diff / scale, "top1": top}


def rewrite_gguf(src, dst, edit=lambda tensors: tensors):
    """A copy of the GGUF file ``src``: its metadata, its tensors passed through ``edit(dict) -> dict`` (name -> the
    array as stored; a quantised tensor keeps its type, looked up by name, or comes back as ``(array, type)``)."""
    import gguf

    reader = gguf.GGUFReader(str(src))
    w = gguf.GGUFWriter(str(dst), reader.fields["general.architecture"].contents())
    for f in reader.fields.values():
        if f.name.startswith("GGUF.") or f.name == "general.architecture":
            continue
        array = f.types[0] == gguf.GGUFValueType.ARRAY
        w.add_key_value(f.name, f.contents(), f.types[0], sub_type=f.types[-1] if array else None)
    kinds = {t.name: t.tensor_type for t in reader.tensors}
    for name, a in edit({t.name: np.array(t.data) for t in reader.tensors}).items():
        a, kind = a if isinstance(a, tuple) else (a, kinds.get(name))
        raw = kind not in (None, gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16)
        w.add_tensor(name, a, raw_dtype=kind if raw else None)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


def float32_copy(src, dst):
    """A copy of the GGUF file ``src`` with every tensor dequantised to float32 (the values the blocks hold,
    exactly): llama.cpp then multiplies float32 activations, as we do, instead of rounding them to 8-bit blocks for
    its quantised products."""
    import gguf

    kinds = {t.name: t.tensor_type for t in gguf.GGUFReader(str(src)).tensors}
    return rewrite_gguf(src, dst, lambda tensors: {
        n: (gguf.quants.dequantize(a, kinds[n]).astype(np.float32), gguf.GGMLQuantizationType.F32)
        for n, a in tensors.items()})


@contextlib.contextmanager
def ggml_gelu():
    """Our model's tanh GELU as ggml's CPU backend computes it (its default ``GGML_GELU_FP16``): the input rounded
    to float16, a table of float16 results, the identity from 10 and 0 from -10 (PyTorch's activations instead of
    the extension's while it lasts). The exact GELU too: llama.cpp's gptneox runs that same table where the
    checkpoint's GELU is erf's. Without it, the tests' tiny Gemma models' logits differ from llama.cpp's by up
    to 4.4e-2 of their largest; with it, by at most 7.6e-4 (:data:`TOL_GELU_TABLE`)."""
    import torch
    import torch.nn.functional as F

    import triforce.models.llama as L

    def table(x):
        y = F.gelu(x.half().float(), approximate="tanh").half().float()
        return torch.where(x <= -10, torch.zeros_like(x), torch.where(x >= 10, x, y))

    saved = L._ROWWISE, L.ACTIVATIONS["gelu_tanh"], L.ACTIVATIONS["gelu"]
    L._ROWWISE, L.ACTIVATIONS["gelu_tanh"], L.ACTIVATIONS["gelu"] = False, table, table
    try:
        yield
    finally:
        L._ROWWISE, L.ACTIVATIONS["gelu_tanh"], L.ACTIVATIONS["gelu"] = saved


def log_path() -> Path:
    """``$TRIFORCE_LLAMA_CPP_LOG``, by default ``triforce_llama_cpp_oracle.jsonl`` in the temporary directory (not the
    working tree)."""
    default = Path(tempfile.gettempdir()) / "triforce_llama_cpp_oracle.jsonl"
    return Path(os.environ.get("TRIFORCE_LLAMA_CPP_LOG", default))


# Largest difference from llama.cpp's logits, relative to the largest of them, of a float32 model on a float32
# copy of its file. Measured over the test suite's files (23 architectures; docs/model.md, "llama.cpp as an oracle"):
# up to 2.3e-6. Gemma's three architectures, starcoder2, phi2 and gptneox take ggml's GELU table (:func:`ggml_gelu`),
# whose float16 steps turn a last-bit difference of a layer's input into a step of 2^-11 of its output: one layer
# matches to 2e-7 at one token and 6e-5 at 48, seven layers up to 7.6e-4 of the largest logit.
# llama.cpp's qwen2vl runs the same file less exactly than its qwen2 (Qwen2's layer, M-RoPE whose sections cover
# every pair: plain RoPE on text): one layer, head_dim 64, 48 tokens, against our model in float64, its qwen2 is within
# 2.6e-6 of the logits and its qwen2vl within 5.4e-4 (1.1e-4 of the largest; 1.1e-4 already at the first token, where
# RoPE turns nothing), while ours is within 1e-6; its qwen3vl gives its qwen3's logits bit for bit.
TOL = 1e-5
TOL_GELU_TABLE = 2e-3
TOL_QWEN2VL = 5e-4
GELU_ARCHS = ("gemma", "gemma2", "gemma3", "starcoder2", "phi2", "gptneox", "falcon", "gpt2", "starcoder", "bloom",
              "mpt")
_DONE: dict = {}  # (file, size, mtime, dtype) -> its record: a file the tests load again is compared once


def tolerance(arch: str) -> float:
    return TOL_GELU_TABLE if arch in GELU_ARCHS else TOL_QWEN2VL if arch == "qwen2vl" else TOL


def check_loaded(path, model, test_id: str, length: int = 48) -> dict | None:
    """Compare ``model``, just loaded from ``path``, with llama.cpp on the same file (nothing unless ``path`` is a
    GGUF file and the model float32): ``length`` random ids (seeded), one sequence, our forward (with ggml's GELU,
    :func:`ggml_gelu`, for :data:`GELU_ARCHS`), llama.cpp's on a float32 copy of the file where it holds other types
    (:func:`float32_copy`).
    Appends the comparison to :func:`log_path` and raises ``AssertionError`` where our logits are further from
    llama.cpp's than :func:`tolerance`; a file llama.cpp refuses is logged (``refused``, llama.cpp's message)."""
    import gguf
    import torch

    from triforce.models.loading import _is_gguf

    p = Path(path).expanduser()
    if not (p.is_file() and _is_gguf(p)) or model.dtype != torch.float32:
        return None
    st = p.stat()
    key = (str(p.resolve()), st.st_size, st.st_mtime_ns)
    if key in _DONE:
        return _DONE[key]
    rs = model.config.rope_scaling or {}
    if rs.get("rope_type") == "longrope":  # llama.cpp takes the long factors whenever its context (>= 256) passes the
        length = max(length, rs["original_max_position_embeddings"] + 8)  # original; we, where the sequence does
    T = min(length, model.config.max_position_embeddings)
    ids = np.random.default_rng(0).integers(0, model.config.vocab_size, T)
    arch = gguf.GGUFReader(str(p)).fields["general.architecture"].contents()
    # ggml's GELU table where the model has a GELU; elsewhere the model as it runs (the extension's kernels)
    with torch.no_grad(), ggml_gelu() if arch in GELU_ARCHS else contextlib.nullcontext(), \
            groups_ranked_by_best_two(model) as reranked:
        ours = model(torch.as_tensor(ids)[None].to(model.device))[0].float().cpu().numpy()
    rec = {"test": test_id, "file": p.name, "arch": arch, "types": weight_types(p), "T": int(T)}
    if reranked:
        rec["groups_ranked_by_best_two"] = reranked
    try:
        with tempfile.TemporaryDirectory() as d:  # llama.cpp multiplies float32 activations by float32 weights only
            exact = p if rec["types"] == ["F32"] else float32_copy(p, Path(d) / "f32.gguf")
            rec.update(compare(ours, llama_cpp_logits(exact, ids)))
    except RuntimeError as e:
        rec["refused"] = str(e)[-1500:]
    _DONE[key] = rec
    with open(log_path(), "a") as f:
        f.write(json.dumps(rec) + "\n")
    assert rec.get("rel", 0.0) <= tolerance(rec["arch"]), f"{p.name}: our logits are off llama.cpp's: {rec}"
    return rec


@contextlib.contextmanager
def groups_ranked_by_best_two(model):
    """llama.cpp ranks every grouped router's groups by their best two scores summed (DeepSeek-V3's rule); DeepSeek-V2's
    ``group_limited_greedy`` (a deepseek2 file's softmax router with groups) ranks them by their best one, as the
    checkpoint's code does and our model does (docs/model.md, "GGUF"). Within this context such routers rank
    llama.cpp's way, every other part of the model as it is; yields how many layers changed."""
    from triforce.models.llama import SparseMoE

    changed = [m for m in model.modules() if isinstance(m, SparseMoE) and getattr(m, "deepseek", False)
               and m.groups is not None and not m.group_top2]
    for m in changed:
        m.group_top2 = True
    try:
        yield len(changed)
    finally:
        for m in changed:
            m.group_top2 = False


def summary(lines) -> list[str]:
    """Per architecture: files compared, the largest relative difference, files llama.cpp refused."""
    by = {}
    for line in lines:
        r = json.loads(line)
        a = by.setdefault(r["arch"], {"n": 0, "worst": 0.0, "refused": 0})
        a["n"] += 1
        a["refused"] += "refused" in r
        a["worst"] = max(a["worst"], r.get("rel", 0.0))
    return [f"{arch:12} {a['n']:3} files, largest difference {a['worst']:.1e} of the largest logit"
            + (f", {a['refused']} refused by llama.cpp" if a["refused"] else "") for arch, a in sorted(by.items())]
