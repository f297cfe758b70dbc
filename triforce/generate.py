"""``triforce.generate``: one entry point for every decoding method (docs/design.md section 4)."""
from __future__ import annotations

import os
from dataclasses import dataclass, field

import torch

from .engines.decode import Decode
from .engines.methods import resolve
from .engines.steps import Sampling


@dataclass
class GenerationOutput:
    """``tokens[b]``: int64 ``[max_new_tokens]``, the new tokens of sequence ``b`` only.
    ``stats``: ``prefill_s``, ``decode_s`` (wall seconds), ``tokens_per_s`` (new tokens of the whole
    batch / ``decode_s``), ``acceptance`` (per level, ``"drafter->verifier"``: accepted / offered
    drafts), ``mean_accepted`` (tokens emitted per full-cache target verification and sequence),
    ``target_passes`` (full-cache target forwards after prefill: as many as the slowest sequence needs),
    ``row_passes`` (those forwards counted once per sequence still decoding in them: over the batch size, the
    passes a sequence needed on average), ``time_s`` (wall seconds per level:
    ``draft``, ``retrieval``, ``full``) and ``accepted_hist`` (count of verifications that advanced a
    sequence by i tokens), ``lengths`` (real new tokens per sequence: ``max_new_tokens``, or up to and
    including its first EOS id).

    ``tokens_per_s`` counts the tokens produced after prefill (the first new token of each sequence
    comes from the prefill's logits and is timed in ``prefill_s``)."""

    tokens: list[torch.Tensor]
    stats: dict = field(default_factory=dict)

    @property
    def lengths(self) -> list[int]:
        """Real new tokens per sequence (``tokens[b][:lengths[b]]``; the rest is padding after EOS)."""
        return self.stats["lengths"]


def generate(target, prompt_ids, *, method: str, max_new_tokens: int, temperature: float = 0.0,
             top_k: int | None = None, top_p: float | None = None, draft=None, seed: int | None = None,
             eos_token_id=None, pad_token_id: int | None = None, progress=None,
             **method_options) -> GenerationOutput:
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
        draft: draft model (same vocabulary), or for ``method="tree"`` trained heads on the target's
            hidden states: a :class:`triforce.heads.DraftHeads`, a kind (``"medusa"``, ``"mlp"``,
            ``"hidden_transfer"``, ``"early_exit"``: the set shipped for the target) or a saved set's
            path (docs/heads.md); for ``method="speculative"`` (and ``"triforce"``'s bottom level),
            ``"lookup"``: prompt lookup, drafts copied from each sequence's own earlier tokens (no model;
            ``ngram`` its n-gram, ``lookup_length`` its proposals' length; docs/engines.md, "Prompt
            lookup"); for ``method="tree"``, ``"lookup"`` drafts a tree of the continuations of a sequence's
            earlier occurrences (``tree`` bounds the children per depth). Defaults: ``speculative``: the
            target's first half of layers + head (``target.layer_skip``; ``draft_layers`` picks k);
            ``triforce``: the target itself on the StreamingLLM window (or ``layer_skip(draft_layers)``);
            ``magicdec``/``tree``: the target. Any draft keeps the output lossless; only speed depends on it.
        seed: seeds the sampling generator (``None``: torch's default RNG).
        eos_token_id: an id or a list of ids (``None``: none). A sequence that emits one stops: it
            drafts no more, its remaining tokens are ``pad_token_id`` (default: the first EOS id) and
            ``stats`` count only its real tokens (``stats["lengths"]``).
        pad_token_id: the id written after a sequence's EOS.
        progress: optional callable receiving the number of tokens every sequence has, per step.
        method_options: the method's options; every option, its default and its meaning are in the
            table :data:`triforce.engines.methods.OPTIONS` (``gamma``, ``gamma1``/``gamma2``, ``budget``,
            ``chunk_size``, ``rebuild_stride``, ``sink``/``window``, ``tree``, ``draft_layers``,
            ``draft_cache``, ``ngram``, ``lookup_length``, ``sliding_layers``);
            :data:`~triforce.engines.methods.METHODS` says which method takes which.
            ``None`` means the default. A bad value raises ``ValueError`` naming the option.

    Returns:
        :class:`GenerationOutput`.

    Example::

        model, tok = triforce.models.smollm2_135m()
        ids = torch.tensor([tok.encode("The capital of France is")])
        out = triforce.generate(model, ids, method="magicdec", max_new_tokens=32)
        print(tok.decode(out.tokens[0].tolist()), out.stats["tokens_per_s"])
    """
    spec, options = resolve(method, method_options)
    if not isinstance(max_new_tokens, int) or isinstance(max_new_tokens, bool) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens: expected an int >= 1, got {max_new_tokens!r}")
    if not (isinstance(temperature, (int, float)) and 0 <= temperature < float("inf")):
        raise ValueError(f"temperature: expected a finite number >= 0, got {temperature!r}")
    prompts = _prompts(prompt_ids, _device(target), target.config.vocab_size)
    longest, context = max(len(p) for p in prompts), target.config.max_position_embeddings
    if longest >= context:
        raise ValueError(f"prompt_ids: a prompt of {longest} tokens leaves no room in the model's context of "
                         f"{context} tokens for a new token; shorten it to at most {context - 1} tokens")
    if longest + max_new_tokens > context:
        raise ValueError(f"max_new_tokens: a prompt of {longest} tokens + {max_new_tokens} new tokens exceed the "
                         f"model's context of {context} tokens; ask for at most {context - longest} new "
                         f"tokens (or shorten the prompt)")
    from .engines.heads import is_heads_source
    from .engines.lookup import is_lookup

    if method_options.get("ngram") is not None and not is_lookup(draft):
        raise ValueError("ngram: the n-gram length of prompt lookup, which drafts with draft='lookup' only")
    if method_options.get("lookup_length") is not None and not is_lookup(draft):
        raise ValueError("lookup_length: the length rule of prompt lookup's proposals, which drafts with "
                         "draft='lookup' only")
    if is_lookup(draft):
        if method not in ("speculative", "triforce", "tree"):
            raise ValueError(f"draft: prompt lookup (draft='lookup') drafts for method='speculative', 'tree' or "
                             f"'triforce' (its bottom level) only, not {method!r}")
        for name in ("sink", "window"):
            if method == "tree" and method_options.get(name) is not None:
                raise ValueError(f"{name}: sizes the draft model's StreamingLLM cache; method='tree' with "
                                 f"draft='lookup' runs no draft model")
        if method_options.get("draft_layers") is not None:
            raise ValueError("draft_layers: picks the layers of a layer-skip draft model; draft='lookup' runs none")
        if method_options.get("draft_vocab") is not None:
            raise ValueError("draft_vocab: a draft vocabulary restricts trained heads; draft='lookup' copies tokens")
    elif is_heads_source(draft):
        if method not in ("tree", "triforce"):
            what = repr(draft) if isinstance(draft, (str, os.PathLike)) else f"a {draft.kind} set"
            raise ValueError(f"draft: trained heads ({what}) draft for method='tree' or 'triforce' (its bottom "
                             f"level) only, not {method!r}")
    elif draft is not None and not (isinstance(draft, torch.nn.Module) and hasattr(draft, "config")):
        raise TypeError(f"draft: expected None, a draft model (triforce.models.Llama), trained heads (a kind "
                        f"name, a DraftHeads or a saved set's path), got {type(draft).__name__}")
    else:
        if options.get("draft_vocab") is not None:
            raise ValueError("draft_vocab: a draft vocabulary restricts trained heads (draft='medusa', 'mlp', "
                             "'hidden_transfer', 'early_exit', a DraftHeads or a saved set's path)")
        if draft is not None and draft.config.vocab_size != target.config.vocab_size:
            raise ValueError("draft: its vocab_size must equal the target's")
    generator = None
    if seed is not None:
        if isinstance(seed, bool) or not isinstance(seed, int) or not -2 ** 63 <= seed < 2 ** 64:
            raise ValueError(f"seed: expected an int in [-2**63, 2**64) (torch.Generator's range) or None, "
                             f"got {seed!r}")
        generator = torch.Generator(prompts[0].device).manual_seed(seed)
    sampling = Sampling(float(temperature), top_k, top_p, generator)
    eos = _token_ids("eos_token_id", eos_token_id, target.config.vocab_size)
    if pad_token_id is not None:
        _token_ids("pad_token_id", pad_token_id, target.config.vocab_size)
    _import_custom_op_runtime()
    with torch.inference_mode():
        decode = Decode(target, prompts, max_new_tokens, sampling, progress, eos, pad_token_id)
        tokens, stats = spec.run(decode, draft, **options)
    stats["method"] = method
    return GenerationOutput(tokens=tokens, stats=stats)


def _import_custom_op_runtime() -> None:
    """The first call of a ``torch.library`` custom op in a process imports ``torch._dynamo`` (1.5 s on this
    project's CPU). The decoding loops call ``tk``'s ops (verification, sampling, retrieval), so the import
    happens here, before any clock starts, instead of inside the first timed step of whichever method
    calls one first (the model layer's attention, which used to pay it during the prefill, no longer
    goes through the custom op: ``verify_attention_trusted``)."""
    import torch._dynamo  # noqa: F401


def _token_ids(name: str, ids, vocab: int) -> list[int]:
    """``None`` / an id / a list of ids -> list of ids in ``[0, vocab)``."""
    if ids is None:
        return []
    items = [ids] if isinstance(ids, int) or (isinstance(ids, torch.Tensor) and ids.dim() == 0) else list(ids)
    out = []
    for i in items:
        if isinstance(i, bool) or not isinstance(i, (int, torch.Tensor)) or not 0 <= int(i) < vocab:
            raise ValueError(f"{name}: expected token ids in [0, {vocab}), got {ids!r}")
        out.append(int(i))
    return out


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
