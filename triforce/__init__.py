"""triforce: lossless long-context speculative decoding (model layer and engines).

``triforce.models``: Llama, loading, the embedded SmolLM2-135M default, KV caches.

Importing it sets ``OMP_WAIT_POLICY=PASSIVE`` (unless set) and torch's CPU thread count
(``TRIFORCE_NUM_THREADS``); see ``triforce/_threads.py`` and docs/development.md ("CPU threads").
"""
__version__ = "0.1.0"

from . import _threads

_threads.set_wait_policy()  # before `models` imports torch (and with it the OpenMP runtime)

from . import models  # noqa: F401,E402
from .generate import GenerationOutput, generate  # noqa: F401,E402

_threads.apply()
