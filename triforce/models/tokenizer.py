"""The tokenizer of a model: a Hugging Face ``tokenizer.json`` (read with the ``tokenizers`` package), or a
byte-level BPE tokenizer rebuilt from a GGUF file's embedded vocabulary and merges (no network).

GGUF: ``tokenizer.ggml.model == "gpt2"``: byte-level BPE, split first by the pre-tokenizer that
``tokenizer.ggml.pre`` names (llama.cpp's names, as the original checkpoints' ``tokenizer.json`` define them):

* none, ``default``, ``gpt-2``: the GPT-2 split regex;
* ``smollm`` (SmolLM2): every digit on its own, then the GPT-2 regex;
* ``qwen2`` (Qwen2/2.5/3): NFC normalisation, then Qwen2's regex (case-insensitive contractions, a
  letter run with one leading non-letter, single digits, newlines kept with punctuation);
* ``llama-bpe`` / ``llama3`` (Llama 3): the same regex with digit runs of up to three.

Any other pre-tokenizer raises (its splits would differ, so the token ids would be wrong). Control tokens
(``<|im_start|>`` ...) are matched whole.
"""
from __future__ import annotations

import json
import numbers
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer as _HFTokenizer, decoders, models, normalizers, pre_tokenizers

_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_SPLIT = _LLAMA3_SPLIT.replace(r"\p{N}{1,3}", r"\p{N}", 1)


def _gguf_pre_tokenizer(pre):
    """(normalizer or None, pre-tokenizer) for llama.cpp's ``tokenizer.ggml.pre`` name (module docstring)."""
    gpt2 = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)

    def split(regex):
        return pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(regex), behavior="isolated"),
                                        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])

    if pre in (None, "default", "gpt-2"):
        return None, gpt2
    if pre == "smollm":
        return None, pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), gpt2])
    if pre == "qwen2":
        return normalizers.NFC(), split(_QWEN2_SPLIT)
    if pre in ("llama-bpe", "llama3"):
        return None, split(_LLAMA3_SPLIT)
    raise ValueError(f"GGUF pre-tokenizer tokenizer.ggml.pre = {pre!r} is not supported (known: default, gpt-2, "
                     "smollm, qwen2, llama-bpe); its text splits would differ, so the token ids would be wrong")


class Tokenizer:
    """Minimal tokenizer: ``encode(text) -> list[int]``, ``decode(ids) -> str``, ``apply_chat_template``.

    ``backend`` is the underlying ``tokenizers.Tokenizer``. ``eos_token_id``: an id, a list of ids (a
    ``generation_config.json`` may list several) or ``None``. ``add_bos_token``: whether the model
    expects ``bos_token_id`` in front of a prompt (``encode(text, add_special_tokens=True)`` adds it).
    """

    def __init__(self, backend: _HFTokenizer, bos_token_id=None, eos_token_id=None, chat_template=None,
                 add_bos_token: bool = False):
        self.backend = backend
        self.bos_token_id = bos_token_id
        self.eos_token_id = eos_token_id
        self.chat_template = chat_template
        self.add_bos_token = bool(add_bos_token)

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:  # the backend's error said "must be str"
            raise ValueError(f"text is not valid Unicode: {e.reason} at index {e.start} "
                             f"({text[e.start:e.end]!r}); it cannot be tokenized") from None
        ids = self.backend.encode(text, add_special_tokens=False).ids
        if add_special_tokens and self.bos_token_id is not None:
            ids = [self.bos_token_id] + ids
        return ids

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        """Text of token ``ids`` (ints, a 1-D or 0-d tensor). Ids past the tokenizer's vocabulary (a model's
        padded rows) decode to nothing, as in transformers; a negative id raises ``ValueError``."""
        if hasattr(ids, "tolist"):
            ids = ids.tolist()
        ids = [ids] if isinstance(ids, numbers.Integral) else list(ids)
        bad = [i for i in ids if isinstance(i, bool) or not isinstance(i, numbers.Integral) or i < 0]
        if bad:
            raise ValueError(f"ids must be non-negative ints (token ids), got {bad[:5]}")
        return self.backend.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        """Render ``messages`` (``{"role", "content"}`` dicts) with the model's Jinja chat template."""
        if not self.chat_template:
            raise ValueError("this tokenizer has no chat template")
        import jinja2.sandbox

        env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        return env.from_string(self.chat_template).render(messages=messages,
                                                          add_generation_prompt=add_generation_prompt)

    # ---- persistence (a converted tokenizer is cached beside the converted weights)
    def save(self, directory) -> None:
        directory = Path(directory)
        self.backend.save(str(directory / "tokenizer.json"))
        (directory / "tokenizer_meta.json").write_text(json.dumps(
            {"bos_token_id": self.bos_token_id, "eos_token_id": self.eos_token_id,
             "chat_template": self.chat_template, "add_bos_token": self.add_bos_token}))

    @classmethod
    def load(cls, directory) -> "Tokenizer":
        directory = Path(directory)
        meta = json.loads((directory / "tokenizer_meta.json").read_text())
        return cls(_HFTokenizer.from_file(str(directory / "tokenizer.json")), **meta)

    @classmethod
    def from_pretrained(cls, path) -> "Tokenizer":
        """The tokenizer of a Hugging Face model directory or of a GGUF file.

        A directory needs ``tokenizer.json``; ``tokenizer_config.json`` (``bos_token``, ``eos_token``,
        ``add_bos_token``, ``chat_template``), ``chat_template.jinja``, ``generation_config.json`` and
        ``config.json`` (``bos_token_id`` / ``eos_token_id``) are read when present. A directory written
        by :meth:`save` (``tokenizer_meta.json``) loads as saved.

        Raises:
            FileNotFoundError: no tokenizer there (a directory without ``tokenizer.json``, a GGUF file
                without ``tokenizer.ggml.*`` metadata).
            ValueError: a tokenizer file that cannot be read.
        """
        path = Path(path).expanduser()
        if not path.is_dir():
            return cls.from_gguf(path)
        file = path / "tokenizer.json"
        if not file.exists():
            raise FileNotFoundError(f"{str(path)!r} has no tokenizer.json: copy the tokenizer.json of the "
                                    "original checkpoint into it")
        if (path / "tokenizer_meta.json").exists():
            return cls.load(path)
        try:
            backend = _HFTokenizer.from_file(str(file))
        except Exception as e:  # the tokenizers package raises a bare Exception for malformed files
            raise ValueError(f"cannot read {str(file)!r} with the tokenizers package: {e}") from None
        tok_cfg, gen_cfg, model_cfg = (_read_json(path / n) for n in
                                       ("tokenizer_config.json", "generation_config.json", "config.json"))

        def token_id(entry):  # "</s>" or {"content": "</s>", ...} -> id
            content = entry.get("content") if isinstance(entry, dict) else entry
            return backend.token_to_id(content) if isinstance(content, str) else None

        bos = token_id(tok_cfg.get("bos_token"))
        bos = bos if bos is not None else gen_cfg.get("bos_token_id", model_cfg.get("bos_token_id"))
        eos = token_id(tok_cfg.get("eos_token"))
        eos = eos if eos is not None else gen_cfg.get("eos_token_id", model_cfg.get("eos_token_id"))
        add_bos = tok_cfg.get("add_bos_token")
        if add_bos is None:  # no flag: the post-processor of tokenizer.json decides (Llama 3 adds BOS there)
            with_special = backend.encode("a", add_special_tokens=True).ids
            plain = backend.encode("a", add_special_tokens=False).ids
            add_bos = bos is not None and len(with_special) > len(plain) and with_special[0] == bos
        template = tok_cfg.get("chat_template")
        if isinstance(template, list):  # [{"name": "default", "template": ...}, {"name": "tool_use", ...}]
            named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
            template = named.get("default", next(iter(named.values()), None))
        if template is None and (path / "chat_template.jinja").exists():
            template = (path / "chat_template.jinja").read_text(encoding="utf-8")
        return cls(backend, bos_token_id=bos, eos_token_id=eos, chat_template=template, add_bos_token=add_bos)

    @classmethod
    def from_gguf(cls, path, reader=None) -> "Tokenizer":
        """Rebuild the tokenizer embedded in a GGUF file (``reader``: an already open ``gguf`` reader)."""
        from .loading import gguf_field, open_gguf

        reader = reader if reader is not None else open_gguf(Path(path))
        kind = gguf_field(reader, "tokenizer.ggml.model")
        if kind is None:
            raise FileNotFoundError(f"GGUF file {str(path)!r} has no tokenizer in its metadata")
        if kind != "gpt2":
            raise ValueError(f"GGUF tokenizer model {kind!r} is not supported (only byte-level BPE 'gpt2')")
        normalizer, pre_tokenizer = _gguf_pre_tokenizer(gguf_field(reader, "tokenizer.ggml.pre"))
        tokens = gguf_field(reader, "tokenizer.ggml.tokens")
        merges = gguf_field(reader, "tokenizer.ggml.merges")
        if not tokens or merges is None:
            raise ValueError(f"GGUF file {str(path)!r} has no embedded vocabulary/merges")
        types = gguf_field(reader, "tokenizer.ggml.token_type") or [1] * len(tokens)
        vocab = {t: i for i, t in enumerate(tokens)}
        bpe = models.BPE(vocab=vocab, merges=[tuple(m.split(" ", 1)) for m in merges], fuse_unk=False)
        backend = _HFTokenizer(bpe)
        if normalizer is not None:
            backend.normalizer = normalizer
        backend.pre_tokenizer = pre_tokenizer
        backend.decoder = decoders.ByteLevel()
        # 3 = CONTROL (special, matched whole, skipped by decode(skip_special_tokens=True)); 4 = USER_DEFINED.
        backend.add_special_tokens([AddedToken(t, normalized=False, special=True)
                                    for t, ty in zip(tokens, types) if ty == 3])
        backend.add_tokens([AddedToken(t, normalized=False, special=False) for t, ty in zip(tokens, types) if ty == 4])
        return cls(backend, bos_token_id=gguf_field(reader, "tokenizer.ggml.bos_token_id"),
                   eos_token_id=gguf_field(reader, "tokenizer.ggml.eos_token_id"),
                   chat_template=gguf_field(reader, "tokenizer.chat_template"),
                   add_bos_token=bool(gguf_field(reader, "tokenizer.ggml.add_bos_token", False)))


def _read_json(path: Path) -> dict:
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{str(path)!r} is not valid JSON: {e}") from None
    return data if isinstance(data, dict) else {}
