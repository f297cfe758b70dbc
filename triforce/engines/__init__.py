"""Decoding engines behind :func:`triforce.generate`: one module per method (the table of methods and
their options is :mod:`triforce.engines.methods`), sharing the per-call state
:class:`~triforce.engines.decode.Decode` and the step helpers of :mod:`triforce.engines.steps`.

    autoregressive  one target forward per token (the baseline every method must reproduce)
    speculative     a draft model on its own full cache proposes ``gamma`` tokens, the target verifies
    magicdec        the target on a StreamingLLM (or retrieval) cache drafts for the full-cache target
    triforce        draft on a StreamingLLM cache -> target on a retrieval cache -> target, full cache
    tree            a static token tree drafted by the self-draft, verified in one tree-masked pass
"""
from .methods import METHODS  # noqa: F401
