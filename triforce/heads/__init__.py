"""``triforce.heads``: trained draft heads on a target's own hidden states (docs/heads.md).

    heads = triforce.heads.load_heads("my-medusa.safetensors", model)
    out = triforce.generate(model, ids, method="tree", draft=heads, max_new_tokens=64)
    out = triforce.generate(model, ids, method="tree", draft="medusa", max_new_tokens=64)  # shipped set

Training: ``python -m triforce train-heads --kind medusa`` (:mod:`triforce.heads.train`).
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from .modules import (KINDS, DraftHeads, EarlyExitHeads, HiddenTransfer, MedusaHeads, MLPSpeculator,  # noqa: F401
                      default_layer, load_heads, make_heads, target_identity, token_rank)

TRAINED_DIR = Path(__file__).parent / "trained"


def shipped_heads_path(model, kind: str) -> Path:
    """The head set of ``kind`` shipped in ``triforce/heads/trained`` for a model like ``model``."""
    if kind not in KINDS:
        raise ValueError(f"draft: expected a head kind ({', '.join(KINDS)}), a DraftHeads or a path, got {kind!r}")
    want = target_identity(model.config)
    from safetensors import safe_open

    for path in sorted(TRAINED_DIR.glob("*.safetensors")):
        with safe_open(os.fspath(path), "pt") as f:
            meta = json.loads((f.metadata() or {}).get("triforce_heads", "{}"))
        if meta.get("kind") == kind and meta.get("target") == want:
            return path
    raise FileNotFoundError(f"no trained {kind!r} heads ship for this model (hidden_size={want['hidden_size']}, "
                            f"vocab_size={want['vocab_size']}, layers={want['num_hidden_layers']}); train a set with "
                            f"`python -m triforce train-heads --kind {kind} ...` and pass draft=<its path>")
