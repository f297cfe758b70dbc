"""``triforce.generate``: one entry point for every decoding method (DESIGN.md section 4)."""
from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass, field

import torch

from .engines import METHODS, Decode
from .engines.steps import Sampling


@dataclass
class GenerationOutput:
    """``tokens[b]``: int64 ``[max_new_tokens]``, the new tokens of sequence ``b`` only.
    ``stats``: ``prefill_s``, ``decode_s`` (wall seconds), ``tokens_per_s`` (new tokens of the whole
    batch / ``decode_s``), ``acceptance`` (per level, ``"drafter->verifier"``: accepted / offered
    drafts), ``mean_accepted`` (tokens emitted per full-cache target verification and sequence),
    ``target_passes`` (full-cache target forwards after prefill), ``time_s`` (wall seconds per level:
    ``draft``, ``retrieval``, ``full``) and ``accepted_hist`` (count of verifications that advanced a
    sequence by i tokens)."""

    tokens: list[torch.Tensor]
    stats: dict = field(default_factory=dict)


def generate(target, prompt_ids, *, method: str, max_new_tokens: int, temperature: float = 0.0,
             top_k: int | None = None, top_p: float | None = None, draft=None, seed: int | None = None,
             progress=None, **method_options) -> GenerationOutput:
    """Generate ``max_new_tokens`` tokens after each prompt with ``method``; lossless: greedy output is
    token-for-token the autoregressive output, sampled output has the target's distribution.

    Args:
        target: a :class:`triforce.models.Llama` (the model whose output is reproduced).
        prompt_ids: int64 ``[B, P]`` tensor, or a list of 1-D int tensors of different lengths
            (ragged batch; every sequence advances by its own accepted length).
        method: ``"autoregressive"``, ``"speculative"``, ``"triforce"``, ``"magicdec"`` or ``"tree"``.
        max_new_tokens: tokens to generate per sequence (>= 1).
        temperature, top_k, top_p: 0 = greedy; otherwise every level samples from
            ``tk.logits_to_probs(logits, temperature, top_k, top_p)``.
        draft: draft model (same vocabulary). Defaults: ``speculative``: the target's first half of
            layers + head (``target.layer_skip``; ``draft_layers`` picks k); ``triforce``: the target
            itself on the StreamingLLM window (or ``layer_skip(draft_layers)``); ``magicdec``/``tree``:
            the target. Any draft keeps the output lossless; only speed depends on it.
        seed: seeds the sampling generator (``None``: torch's default RNG).
        progress: optional callable receiving the number of tokens every sequence has, per step.
        method_options: ``gamma`` (speculative, magicdec; default 4), ``gamma1``/``gamma2``
            (triforce; 2/6), ``budget`` (retrieval-cache tokens, 4096, capped by the prompt),
            ``chunk_size`` (8), ``sink``/``window`` (StreamingLLM caches; 16/240), ``tree`` (branching
            factors per depth; (2, 2, 1, 1)), ``draft_layers`` (layers of the default layer-skip draft),
            ``draft_cache`` (magicdec: ``"streaming"`` or ``"retrieval"``).

    Returns:
        :class:`GenerationOutput`.

    Example::

        model, tok = triforce.models.smollm2_135m()
        ids = torch.tensor([tok.encode("The capital of France is")])
        out = triforce.generate(model, ids, method="magicdec", max_new_tokens=32)
        print(tok.decode(out.tokens[0].tolist()), out.stats["tokens_per_s"])
    """
    if method not in METHODS:
        raise ValueError(f"method: expected one of {', '.join(METHODS)}, got {method!r}")
    engine = importlib.import_module(f"triforce.engines.{method}")
    allowed = set(inspect.signature(engine.run).parameters) - {"d", "draft"}
    unknown = sorted(set(method_options) - allowed)
    if unknown:
        raise TypeError(f"method_options: {method!r} takes {sorted(allowed) or 'no options'}, got {unknown}")
    if not isinstance(max_new_tokens, int) or isinstance(max_new_tokens, bool) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens: expected an int >= 1, got {max_new_tokens!r}")
    if not (isinstance(temperature, (int, float)) and temperature >= 0):
        raise ValueError(f"temperature: expected a number >= 0, got {temperature!r}")
    prompts = _prompts(prompt_ids, _device(target), target.config.vocab_size)
    if draft is not None and draft.config.vocab_size != target.config.vocab_size:
        raise ValueError("draft: its vocab_size must equal the target's")
    generator = None
    if seed is not None:
        generator = torch.Generator(prompts[0].device).manual_seed(int(seed))
    sampling = Sampling(float(temperature), top_k, top_p, generator)
    with torch.inference_mode():
        tokens, stats = engine.run(Decode(target, prompts, max_new_tokens, sampling, progress),
                                   draft=draft, **method_options)
    stats["method"] = method
    return GenerationOutput(tokens=tokens, stats=stats)


def _device(model) -> torch.device:
    return next(model.parameters()).device


def _prompts(prompt_ids, device, vocab: int) -> list[torch.Tensor]:
    if isinstance(prompt_ids, torch.Tensor):
        if prompt_ids.dim() != 2:
            raise ValueError(f"prompt_ids: expected a [B, P] tensor, got shape {tuple(prompt_ids.shape)}")
        rows = list(prompt_ids)
    elif isinstance(prompt_ids, (list, tuple)):
        rows = [torch.as_tensor(p) for p in prompt_ids]
    else:
        raise TypeError(f"prompt_ids: expected a [B, P] tensor or a list of 1-D sequences, got "
                        f"{type(prompt_ids).__name__}")
    if not rows:
        raise ValueError("prompt_ids: expected at least one prompt")
    out = []
    for p in rows:
        if p.dim() != 1 or p.numel() == 0:
            raise ValueError("prompt_ids: every prompt must be a non-empty 1-D sequence of token ids")
        if p.dtype.is_floating_point or p.dtype == torch.bool:
            raise TypeError(f"prompt_ids: expected integer token ids, got {p.dtype}")
        if int(p.min()) < 0 or int(p.max()) >= vocab:
            raise ValueError(f"prompt_ids: token ids must lie in [0, {vocab})")
        out.append(p.to(device=device, dtype=torch.int64))
    return out
