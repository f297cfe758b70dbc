"""A model and its tokenizer by name, for the CLI, the demo and the benchmarks.

``name`` is ``"smollm2"`` (the embedded SmolLM2-135M-Instruct), a Hugging Face directory
(``config.json`` + ``*.safetensors``, tokenizer from ``tokenizer.json``), a GGUF file (weights, and
the tokenizer when its metadata carries one), or one of the opt-in pair's names
``"qwen2.5-coder-0.5b"`` / ``"qwen2.5-coder-1.5b"`` (:mod:`triforce.models.pair`: downloaded and
checked on first use, then cached). Nothing else is downloaded.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from .tokenizer import GGUF_RULES, Tokenizer

DTYPES = ("float32", "bfloat16", "float16")
# weight formats a model loads in: DTYPES, "gguf": float32 activations on the GGUF file's own Q4_1 / Q8_0
# blocks (triforce.models.gguf_copy; bitwise the float32 model, on the CPU), or "gguf-int8": the same blocks
# with activations rounded to int8 blocks and integer dot products, the other GGUF_I8_TYPES' blocks too
# (gguf_copy(..., activations="int8"): Q4_0 / Q5_0 / Q5_1 / Q2_K / Q3_K / Q4_K / Q5_K / Q6_K / IQ4_NL / IQ4_XS /
# MXFP4 / IQ1_S / IQ1_M / IQ2_XXS / IQ2_XS / IQ2_S / IQ3_XXS / IQ3_S / TQ1_0 / TQ2_0), or an MXFP4 checkpoint
# directory's experts (OpenAI's GPT-OSS: quant.load_mxfp4_int8); "fp8": an FP8 checkpoint directory on its own
# float8 weights with float32 activations (quant.load_fp8; bitwise the float32 model, on the CPU); "compressed": a
# compressed-tensors checkpoint directory on its own FP8 / integer / FP4 codes (quant.load_compressed; likewise)
GGUF_WEIGHTS = ("gguf", "gguf-int8")
WEIGHTS = DTYPES + GGUF_WEIGHTS + ("fp8", "compressed")
OWN_WEIGHTS = GGUF_WEIGHTS + ("fp8", "compressed")  # the formats that run a model on its file's own weights (CPU)
PAIR_NAMES = {"qwen2.5-coder-0.5b": "draft", "qwen2.5-coder-1.5b": "target"}  # -> triforce.models.pair


def model_path(name: str) -> str:
    """``name`` itself, or for a name of :data:`PAIR_NAMES` the path of its GGUF (fetched if not cached)."""
    if name in PAIR_NAMES:
        from .pair import fetch

        return str(fetch(PAIR_NAMES[name]))
    return name


def _dtype(dtype: str | None):
    if dtype is None:
        return None
    if dtype not in WEIGHTS:
        raise ValueError(f"dtype: expected one of {', '.join(WEIGHTS)}, got {dtype!r}")
    return torch.float32 if dtype in OWN_WEIGHTS else getattr(torch, dtype)


def _check_gguf_weights(path, device, dtype: str = "gguf") -> None:
    """``dtype="gguf"`` (or ``"gguf-int8"``) needs a GGUF file (``"gguf-int8"``: or an MXFP4 checkpoint directory),
    ``"fp8"`` an FP8 checkpoint directory, ``"compressed"`` a compressed-tensors one, and each the CPU
    (``ValueError`` before anything loads)."""
    from .loading import _is_gguf
    from .quant import is_compressed_checkpoint, is_fp8_checkpoint, is_mxfp4_checkpoint

    if dtype == "fp8":
        if not is_fp8_checkpoint(path):
            raise ValueError(f"dtype 'fp8' runs an FP8 checkpoint on its own float8 weights; {str(path)!r} is not a "
                             "directory whose config.json has an fp8 quantization_config")
    elif dtype == "compressed":
        if not is_compressed_checkpoint(path):
            raise ValueError(f"dtype 'compressed' runs a compressed-tensors checkpoint on its own codes; "
                             f"{str(path)!r} is not a directory whose config.json has a compressed-tensors "
                             "quantization_config")
    elif not (_is_gguf(Path(path)) or (dtype == "gguf-int8" and is_mxfp4_checkpoint(path))):
        raise ValueError(f"dtype {dtype!r} runs a model on its GGUF file's own weights ('gguf-int8': or an MXFP4 "
                         f"checkpoint's); {str(path)!r} is not a GGUF file")
    if device is not None and device_of(str(device)).type != "cpu":
        raise ValueError(f"dtype {dtype!r} runs on the CPU only (its kernels are CPU kernels), got device "
                         f"{str(device)!r}")


def device_of(name: str | None) -> torch.device:
    """The device a CLI or benchmark flag names: ``"auto"`` (or ``None``) is the GPU when torch sees one,
    else the CPU; ``"cpu"``, ``"cuda"`` or ``"cuda:N"`` must exist (``ValueError`` naming what is there).
    A GPU comes back indexed (``cuda`` is the current one, ``cuda:0`` on one GPU), as a tensor there
    reports it."""
    from .cache import as_device
    if name in (None, "auto"):
        return as_device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(name)
    except (RuntimeError, TypeError):
        dev = None
    if dev is None or dev.type not in ("cpu", "cuda"):
        raise ValueError(f"device: expected auto, cpu, cuda or cuda:N, got {name!r}")
    if dev.type == "cuda":
        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if n == 0:
            raise ValueError(f"device: {name!r} asked for, but this torch sees no CUDA device "
                             f"(torch {torch.__version__}, built {'with' if torch.version.cuda else 'without'} CUDA)")
        if dev.index is not None and dev.index >= n:
            raise ValueError(f"device: {name!r} asked for, but there {'is' if n == 1 else 'are'} only {n} "
                             f"CUDA device{'s' if n > 1 else ''}")
    return as_device(dev)


def load_model(name: str = "smollm2", dtype: str | None = None, device=None):
    """-> ``(model, tokenizer or None)``; ``None`` when the directory / GGUF file has no tokenizer.
    ``dtype``: ``"float32"`` (default), ``"bfloat16"``, ``"float16"``, ``"gguf"`` (a GGUF file's model on
    its own Q4_1 / Q8_0 blocks, bitwise the float32 model, CPU only: :func:`triforce.models.gguf_copy`) or
    ``"gguf-int8"`` (those blocks, and Q4_0 / Q5_0 / Q5_1 / Q2_K / Q3_K / Q4_K / Q5_K / Q6_K / IQ4 / MXFP4 ones, with
    activations rounded to int8 blocks: integer dot products, CPU only; built straight from the file's blocks,
    :func:`triforce.models.quant.load_gguf_int8`; an MXFP4 checkpoint directory, OpenAI's GPT-OSS: its experts on
    their blocks, :func:`triforce.models.quant.load_mxfp4_int8`) or ``"fp8"`` (an FP8 checkpoint directory on its
    own float8 weights, float32 activations, bitwise the float32 model, CPU only: :func:`triforce.models.quant
    .load_fp8`) or ``"compressed"`` (a compressed-tensors checkpoint directory on its own FP8, integer and FP4
    codes, likewise: :func:`triforce.models.quant.load_compressed`); ``device``: where the weights go (default:
    the CPU)."""
    from .llama import Llama
    from .quant import gguf_copy, is_mxfp4_checkpoint, load_compressed, load_fp8, load_gguf_int8, load_mxfp4_int8
    from .smollm2 import smollm2_135m, smollm2_gguf_path

    dt = _dtype(dtype)
    path = smollm2_gguf_path() if name == "smollm2" else model_path(name)
    if dtype in OWN_WEIGHTS:
        _check_gguf_weights(path, device, dtype)
    if dtype in ("fp8", "compressed"):
        return (load_fp8 if dtype == "fp8" else load_compressed)(path), load_tokenizer(path)
    if dtype == "gguf-int8":  # straight from the blocks: no float32 copy of the packed layers on the way
        if is_mxfp4_checkpoint(path):  # OpenAI's GPT-OSS checkpoints: the experts on their MXFP4 blocks
            return load_mxfp4_int8(path), load_tokenizer(path)
        return load_gguf_int8(path), load_tokenizer(path)
    if name == "smollm2":
        model, tok = smollm2_135m(device=device, dtype=dt)
    else:
        model, tok = Llama.from_pretrained(path, device=device, dtype=dt), load_tokenizer(path)
    if dtype == "gguf":
        model = gguf_copy(model, path)
    return model, tok


def set_kv_dtype(model, kv_dtype: str | None):
    """``model`` with :attr:`Llama.kv_dtype` set from a name: ``"float32"``, ``"bfloat16"``, ``"float16"``, or
    ``None`` (the model's own dtype): the dtype of the KV caches the engines make for it."""
    if kv_dtype is not None and kv_dtype not in DTYPES:
        raise ValueError(f"kv_dtype: expected one of {', '.join(DTYPES)}, got {kv_dtype!r}")
    model.kv_dtype = None if kv_dtype is None else getattr(torch, kv_dtype)
    return model


def load_draft(name: str, dtype: str | None = None, device=None):
    """A draft model (no tokenizer: a draft shares the target's vocabulary): ``"smollm2"``, a pair name or a path."""
    from .llama import Llama
    from .smollm2 import smollm2_135m

    if dtype in OWN_WEIGHTS:
        return load_model(name, dtype, device)[0]
    if name == "smollm2":
        return smollm2_135m(device=device, dtype=_dtype(dtype))[0]
    return Llama.from_pretrained(model_path(name), device=device, dtype=_dtype(dtype))


def load_tokenizer(path, cache_dir=None) -> Tokenizer | None:
    """The tokenizer of a Hugging Face directory or GGUF file, or ``None`` when it has none. A GGUF
    tokenizer is rebuilt once and cached in the GGUF's cache entry, beside the converted weights, whichever
    of the two is written first (``cache_dir``: as in :meth:`Llama.from_pretrained`; ``False``: no cache)."""
    from .loading import _is_gguf, gguf_cache_path, gguf_field, open_gguf, publish, touch_cache_entry

    path = Path(path).expanduser()
    if path.is_dir():
        has = any((path / f).exists() for f in ("tokenizer.json", "tokenizer.model", "tiktoken.model"))
        return Tokenizer.from_pretrained(path) if has else None
    if not _is_gguf(path):
        return None
    cached = gguf_cache_path(path, cache_dir) if cache_dir is not False else None
    if cached is not None and (cached / "tokenizer.json").exists() and _current_rules(cached / "tokenizer_meta.json"):
        touch_cache_entry(cached)
        return Tokenizer.load(cached)
    reader = open_gguf(path)
    if gguf_field(reader, "tokenizer.ggml.model") is None:
        return None
    tokenizer = Tokenizer.from_gguf(path, reader)
    if cached is not None:
        try:
            publish(cached, tokenizer.save, last="tokenizer_meta.json")
        except OSError:  # a read-only cache only costs the rebuild next time
            pass
    return tokenizer


def _current_rules(meta: Path) -> bool:
    """Whether the cached tokenizer whose tokenizer_meta.json is ``meta`` was rebuilt by the current rules (an older
    one, or none, is rebuilt; :data:`triforce.models.tokenizer.GGUF_RULES`)."""
    try:
        return json.loads(meta.read_text()).get("gguf_rules") == GGUF_RULES
    except (OSError, ValueError):
        return False


def eos_token_ids(model, tokenizer) -> list[int]:
    """The ids that end a generation: the tokenizer's EOS and ``model.config.eos_token_id`` (each an
    int, a list of ints or ``None``), deduplicated, in that order."""
    ids: list[int] = []
    for source in (getattr(tokenizer, "eos_token_id", None), getattr(model.config, "eos_token_id", None)):
        for i in source if isinstance(source, (list, tuple)) else [source]:
            if isinstance(i, int) and not isinstance(i, bool) and i >= 0 and i not in ids:
                ids.append(i)
    return ids


def encode(tokenizer, text: str, add_special_tokens: bool = False) -> list[int]:
    """Token ids of ``text`` (a :class:`Tokenizer` or a bare ``tokenizers.Tokenizer``)."""
    ids = tokenizer.encode(text, add_special_tokens=add_special_tokens)
    return list(getattr(ids, "ids", ids))


def decode(tokenizer, ids) -> str:
    return tokenizer.decode([int(i) for i in ids])
