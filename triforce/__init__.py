"""triforce: lossless long-context speculative decoding (model layer and engines).

``triforce.models``: Llama, loading, the embedded SmolLM2-135M default, KV caches.
"""
__version__ = "0.1.0"

from . import models  # noqa: F401
from .generate import GenerationOutput, generate  # noqa: F401,E402
