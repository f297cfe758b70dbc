"""Model layer: a compact Llama, weight loading, the embedded SmolLM2-135M default, and KV caches."""
from .cache import FullCache, RetrievalCache, StreamingCache, TokenTree
from .config import LlamaConfig
from .llama import Llama
from .quant import Fp8Linear, Int8DotLinear, Q4Linear, gguf_copy, int8_copy, load_compressed, load_fp8
from .smollm2 import smollm2_135m
from .tokenizer import Tokenizer

__all__ = ["Llama", "LlamaConfig", "smollm2_135m", "Tokenizer", "FullCache", "StreamingCache", "RetrievalCache",
           "TokenTree", "int8_copy", "gguf_copy", "Q4Linear", "Int8DotLinear", "Fp8Linear", "load_fp8",
           "load_compressed"]
