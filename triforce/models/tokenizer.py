"""The tokenizer of a model: a Hugging Face ``tokenizer.json`` (read with the ``tokenizers`` package), a
SentencePiece ``tokenizer.model`` (older Llama 1/2-style directories; BPE, encoded as below), a tiktoken
``tiktoken.model`` (Kimi K2, Moonlight: :func:`_tiktoken_directory`), or the
tokenizer rebuilt from a GGUF file's embedded vocabulary (no network). The GGUF tokenizers, by
``tokenizer.ggml.model``:

``"gpt2"``: byte-level BPE from the file's merges, split first by the pre-tokenizer that ``tokenizer.ggml.pre``
names: llama.cpp's names, grouped as llama.cpp groups them, each group split as its models' ``tokenizer.json``
splits (``_GGUF_PRES``: GPT-2, SmolLM / StarCoder, Llama 3, Phi-4 / DBRX, Qwen2, Qwen 3.5, Mistral's tekken,
o200k for Phi-4-mini / Llama 4, DeepSeek-Coder, DeepSeek-LLM, DeepSeek-V3, Kimi K2, Falcon). For Llama 3's names and
tekken a split found whole in the vocabulary is that one token without merging (``ignore_merges``). Any other name
raises (its splits would differ, so the token ids would be wrong).

``"llama"``: SentencePiece BPE (Llama 1/2, TinyLlama, Mistral 7B up to v0.3, Code Llama, ...), as llama.cpp
runs it (:class:`SentencePiece`): spaces become ``▁``, one is put in front of the text and of every stretch of
text after a special token (``tokenizer.ggml.add_space_prefix``, default true), and the two adjacent symbols
whose union is the vocabulary piece of the highest score (``tokenizer.ggml.scores``) merge, the leftmost of
equal ones, until no union is a piece; a character that no piece holds is spelled in its UTF-8 bytes
(``<0x..>`` tokens). ``backend`` is then the ``tokenizers`` BPE that Hugging Face converts such a model to
(:func:`_sentencepiece_merges`), which decodes; its own encoding differs from SentencePiece's where two
different pieces of one score compete for a symbol.

Control tokens (``<|im_start|>``, ``<s>`` ...) are matched whole. A file without ``tokenizer.ggml.add_bos_token``
gets llama.cpp's default: BOS in front of a prompt for SentencePiece, Llama 3 and tekken, none otherwise.
"""
from __future__ import annotations

import heapq
import json
import numbers
import re
from pathlib import Path
from typing import NamedTuple

from tokenizers import AddedToken, Regex, Tokenizer as _HFTokenizer, decoders, models, normalizers, pre_tokenizers

_GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_SPLIT = _LLAMA3_SPLIT.replace(r"\p{N}{1,3}", r"\p{N}", 1)
# Qwen3.5: marks (\p{M}) belong to letter runs
_QWEN35_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")
# Mistral's tekken (Nemo, Small 3, Ministral) and tiktoken's o200k (gpt-4o: Phi-4-mini, Llama 4): a word is a
# run of upper-case letters then lower-case ones (CamelCase splits), with one leading non-letter; slashes and
# newlines stay with punctuation. o200k adds contractions to words and keeps digits in threes; tekken one digit.
_UPPER, _LOWER = r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]", r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]"
_TAIL = r"| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"


def _cased_words(suffix: str, digits: str) -> str:
    lead = r"[^\r\n\p{L}\p{N}]?"
    return f"{lead}{_UPPER}*{_LOWER}+{suffix}|{lead}{_UPPER}+{_LOWER}*{suffix}|{digits}{_TAIL}"


_TEKKEN_SPLIT = _cased_words("", r"\p{N}")
_O200K_SPLIT = _cased_words(r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?", r"\p{N}{1,3}")
# Kimi K2's (tokenization_kimi.py; llama.cpp's kimi-k2): Han runs whole, then o200k's cased words and contractions
# without Han letters, digits in threes, punctuation runs with trailing newlines (no slashes), whitespace
_NO_HAN_UPPER, _NO_HAN_LOWER = r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]", r"[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]"
_CONTRACTION = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
_KIMI_K2_SPLIT = (rf"\p{{Han}}+|[^\r\n\p{{L}}\p{{N}}]?{_NO_HAN_UPPER}*{_NO_HAN_LOWER}+{_CONTRACTION}"
                  rf"|[^\r\n\p{{L}}\p{{N}}]?{_NO_HAN_UPPER}+{_NO_HAN_LOWER}*{_CONTRACTION}"
                  r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# DeepSeek-Coder: newlines, letter runs and punctuation runs (each with one leading space), runs of CJK
# ideographs / Samaritan..CJK / Hangul, one after another; then single digits
_CJK = "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+"
_DEEPSEEK_CODER_SPLITS = (r"[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", _CJK, r"\p{N}")
# DeepSeek-LLM's cased letters (its tokenizer.json's list: Lu / Ll / Lt blocks of Latin, Greek, Cyrillic, Armenian,
# Georgian, Cherokee, Glagolitic, Coptic, Deseret, ... with gaps where it has them)
_DEEPSEEK_LLM_LETTERS = (
    r"\s?["
    "A-Za-z\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u01ba\u01bc-\u01bf\u01c4-\u0293\u0295-\u02af"
    "\u0370-\u0373\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c\u038e-\u03a1\u03a3-\u03f5"
    "\u03f7-\u0481\u048a-\u052f\u0531-\u0556\u10a0-\u10c5\u13a0-\u13f5\u13f8-\u13fd\u1c90-\u1cba"
    "\u1cbd-\u1cbf\u1d00-\u1d2b\u1d6b-\u1d77\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45"
    "\u1f48-\u1f4d\u1f50-\u1f57\u1f59\u1f5b\u1f5d\u1f5f-\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe"
    "\u1fc2-\u1fc4\u1fc6-\u1fcc\u1fd0-\u1fd3\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4\u1ff6-\u1ffc\u2102"
    "\u2107\u210a-\u2113\u2115\u2119-\u211d\u2124\u2126\u2128\u212a-\u212d\u212f-\u2134\u2139"
    "\u213c-\u213f\u2145-\u2149\u214e\u2183\u2184\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee\u2cf2\u2cf3"
    "\ua640-\ua66d\ua680-\ua69b\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e\uab70-\uabbf\ufb00-\ufb06"
    "\ufb13-\ufb17\uff21-\uff3a\uff41-\uff5a\U00010400-\U0001044f\U000104b0-\U000104d3"
    "\U000104d8-\U000104fb\U00010c80-\U00010cb2\U00010cc0-\U00010cf2\U000118a0-\U000118df"
    "\U0001e900-\U0001e943"
    "]+")
# DeepSeek-LLM: newlines; runs of those letters and of ASCII / full-width punctuation, each with one leading space;
# trailing whitespace; CJK runs; digit runs
_DEEPSEEK_LLM_SPLITS = (
    r"[\r\n]", _DEEPSEEK_LLM_LETTERS, r"\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+",
    r"\s+$", _CJK, r"\p{N}+")
# DeepSeek-V3's (V3, R1, V3.1; llama.cpp's deepseek-v3): digits in threes; CJK and kana runs; then a word with an
# ASCII punctuation mark before ASCII letters, or letters and marks with one leading character that is no newline,
# letter, punctuation or symbol; punctuation / symbol runs with a leading space and trailing newlines; whitespace
_DEEPSEEK_V3_SPLITS = (
    r"\p{N}{1,3}", "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
    r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+")
# Falcon: punctuation runs, then the GPT-2 split, then digits in threes
_FALCON_SPLITS = (r"[\p{P}\$\+<=>\^~\|`]+", _GPT2_SPLIT, r"[0-9][0-9][0-9]")
# BLOOM's (and Poro's, GPT-3 Finnish's): runs of anything but whitespace and these marks of punctuation, one leading
# space each (llama.cpp's form of bloom's tokenizer.json regex, whose nested class is the same set)
_BLOOM_SPLIT = " ?[^(\\s|.,!?\u2026\u3002\uff0c\u3001\u0964\u06d4\u060c)]+"


class _Pre(NamedTuple):
    """A byte-level BPE pre-tokenizer: its regexes (each splits every piece the ones before left, keeping both
    the matches and what lies between them), NFC normalisation first, whether a split found whole in the
    vocabulary is that token (``ignore_merges``), and llama.cpp's BOS default for it."""
    splits: tuple[str, ...]
    nfc: bool = False
    whole: bool = False
    bos: bool = False


# llama.cpp's tokenizer.ggml.pre names, grouped as llama.cpp groups them (src/llama-vocab.cpp), each group with
# its models' tokenizer.json split
_GGUF_PRES = {
    **dict.fromkeys((None, "default", "gpt-2", "phi-2", "mpt", "olmo", "jais", "exaone4", "trillion"),
                    _Pre((_GPT2_SPLIT,))),
    **dict.fromkeys(("smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva-7b"),
                    _Pre((r"\p{N}", _GPT2_SPLIT))),
    **dict.fromkeys(("llama-bpe", "llama3", "llama-v3", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2"),
                    _Pre((_LLAMA3_SPLIT,), whole=True, bos=True)),
    **dict.fromkeys(("dbrx", "smaug-bpe"), _Pre((_LLAMA3_SPLIT,))),  # dbrx: Phi-4's cl100k vocabulary
    # GLM-4's: llama.cpp's CHATGLM4 split is Llama 3's regex, and it drops the file's BOS id (_GGUF_NO_BOS)
    **dict.fromkeys(("glm4", "chatglm-bpe"), _Pre((_LLAMA3_SPLIT,))),
    **dict.fromkeys(("qwen2", "deepseek-r1-qwen", "megrez"), _Pre((_QWEN2_SPLIT,), nfc=True)),
    "qwen35": _Pre((_QWEN35_SPLIT,)),  # no NFC: its tokenizer.json keeps decomposed marks
    "tekken": _Pre((_TEKKEN_SPLIT,), whole=True, bos=True),
    **dict.fromkeys(("gpt-4o", "llama4", "minimax-m2", "kanana2", "talkie"), _Pre((_O200K_SPLIT,))),
    "deepseek-coder": _Pre(_DEEPSEEK_CODER_SPLITS),
    "deepseek-llm": _Pre(_DEEPSEEK_LLM_SPLITS),
    # (Hunyuan's dense models: DeepSeek-V3's split; Hunyuan-A13B's tiktoken vocabulary: Qwen2's regex, no normaliser)
    **dict.fromkeys(("deepseek-v3", "hunyuan-dense"), _Pre(_DEEPSEEK_V3_SPLITS)),
    "hunyuan": _Pre((_QWEN2_SPLIT,)),
    "kimi-k2": _Pre((_KIMI_K2_SPLIT,)),
    "falcon": _Pre(_FALCON_SPLITS),
    **dict.fromkeys(("bloom", "poro-chat", "gpt3-finnish"), _Pre((_BLOOM_SPLIT,))),
}


_GGUF_NO_BOS = ("glm4", "chatglm-bpe")  # llama.cpp's special_bos_id = LLAMA_TOKEN_NULL for these pre-tokenizers


def _gguf_pre(pre) -> _Pre:
    """The pre-tokenizer that llama.cpp's ``tokenizer.ggml.pre`` name stands for (module docstring)."""
    if pre not in _GGUF_PRES:
        known = ", ".join(sorted(n for n in _GGUF_PRES if n))
        raise ValueError(f"GGUF pre-tokenizer tokenizer.ggml.pre = {pre!r} is not supported (known: {known}); its "
                         "text splits would differ, so the token ids would be wrong")
    return _GGUF_PRES[pre]


def _byte_level_splits(splits) -> pre_tokenizers.Sequence:
    """Byte-level BPE's pre-tokenizer: the text split by each regex of ``splits`` in turn (each match and each run
    between matches a piece), then written in the byte-level alphabet."""
    return pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(r), behavior="isolated") for r in splits]
                                   + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])


def _gguf_pre_tokenizer(pre):
    """(normalizer or None, pre-tokenizer) for llama.cpp's ``tokenizer.ggml.pre`` name."""
    spec = _gguf_pre(pre)
    return normalizers.NFC() if spec.nfc else None, _byte_level_splits(spec.splits)

# The version of from_gguf's rules, saved with a tokenizer: hub.load_tokenizer rebuilds a cached GGUF tokenizer
# of another version (2: Llama 3's whole splits, SentencePiece vocabularies, llama.cpp's BOS defaults).
GGUF_RULES = 2


class Tokenizer:
    """Minimal tokenizer: ``encode(text) -> list[int]``, ``decode(ids) -> str``, ``apply_chat_template``.

    ``backend`` is the underlying ``tokenizers.Tokenizer``, which encodes unless ``sentencepiece`` (a
    :class:`SentencePiece`: a GGUF's SentencePiece vocabulary, or a directory's ``tokenizer.model``) does.
    ``eos_token_id``: an id, a list of ids (a ``generation_config.json`` may list several) or ``None``.
    ``add_bos_token``: whether the model expects ``bos_token_id`` in front of a prompt
    (``encode(text, add_special_tokens=True)`` adds it).
    """

    def __init__(self, backend: _HFTokenizer, bos_token_id=None, eos_token_id=None, chat_template=None,
                 add_bos_token: bool = False, sentencepiece: "SentencePiece | None" = None):
        self.backend = backend
        self.sentencepiece = sentencepiece
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
        if self.sentencepiece is not None:
            ids = self.sentencepiece.encode(text)
        else:
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

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True, **variables) -> str:
        """Render ``messages`` (``{"role", "content"}`` dicts) with the model's Jinja chat template.

        The template sees what transformers gives it: ``messages``, ``add_generation_prompt``, ``bos_token`` and
        ``eos_token`` (the tokens' text, "" without one), ``raise_exception(message)``, which raises
        ``ValueError`` (Llama 2's and Mistral's templates call it for roles out of order), ``strftime_now(format)``
        (Llama 3.2's date), the ``tojson`` filter without HTML escaping, ``{% break %}`` / ``{% continue %}``,
        and ``{% generation %}`` blocks (rendered as their content); ``variables`` (``tools``,
        ``enable_thinking``, ``date_string``, ...) are passed on. A template that writes ``bos_token`` itself
        has it in the text: encode that with ``add_special_tokens=False``."""
        if not self.chat_template:
            raise ValueError("this tokenizer has no chat template")
        import datetime

        import jinja2.ext
        import jinja2.sandbox

        class Generation(jinja2.ext.Extension):  # transformers marks assistant text for training masks with it
            tags = {"generation"}

            def parse(self, parser):
                next(parser.stream)
                return parser.parse_statements(("name:endgeneration",), drop_needle=True)

        def text_of(token_id) -> str:
            token_id = token_id[0] if isinstance(token_id, (list, tuple)) and token_id else token_id
            text = self.backend.id_to_token(token_id) if isinstance(token_id, int) else None
            return text or ""

        def raise_exception(message):
            raise ValueError(f"chat template: {message}")

        env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                           extensions=[Generation, jinja2.ext.loopcontrols])
        env.filters["tojson"] = lambda x, ensure_ascii=False, indent=None, separators=None, sort_keys=False: \
            json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)
        env.globals.update(raise_exception=raise_exception,
                           strftime_now=lambda fmt: datetime.datetime.now().strftime(fmt))
        values = {"bos_token": text_of(self.bos_token_id), "eos_token": text_of(self.eos_token_id), **variables}
        return env.from_string(self.chat_template).render(messages=messages,
                                                          add_generation_prompt=add_generation_prompt, **values)

    # ---- persistence (a converted tokenizer is cached beside the converted weights)
    def save(self, directory) -> None:
        directory = Path(directory)
        self.backend.save(str(directory / "tokenizer.json"))
        if self.sentencepiece is not None:
            (directory / "sentencepiece.json").write_text(json.dumps(self.sentencepiece.state()))
        (directory / "tokenizer_meta.json").write_text(json.dumps(
            {"bos_token_id": self.bos_token_id, "eos_token_id": self.eos_token_id,
             "chat_template": self.chat_template, "add_bos_token": self.add_bos_token, "gguf_rules": GGUF_RULES}))

    @classmethod
    def load(cls, directory) -> "Tokenizer":
        directory = Path(directory)
        meta = json.loads((directory / "tokenizer_meta.json").read_text())
        meta.pop("gguf_rules", None)
        spm = directory / "sentencepiece.json"
        sentencepiece = SentencePiece(**json.loads(spm.read_text())) if spm.exists() else None
        return cls(_HFTokenizer.from_file(str(directory / "tokenizer.json")), sentencepiece=sentencepiece, **meta)

    @classmethod
    def from_pretrained(cls, path) -> "Tokenizer":
        """The tokenizer of a Hugging Face model directory or of a GGUF file.

        A directory needs ``tokenizer.json``, or else a SentencePiece ``tokenizer.model`` (older Llama 1/2-style
        checkpoints; BPE only: :func:`_read_sentencepiece_model`), or a ``tiktoken.model`` (Kimi K2, Moonlight:
        :func:`_tiktoken_directory`); ``tokenizer_config.json`` (``bos_token``,
        ``eos_token``, ``add_bos_token``, ``chat_template``; with ``tokenizer.model`` also ``legacy`` and
        ``added_tokens_decoder``), ``chat_template.jinja`` (else ``chat_template.json``: an image + text model's
        processor template), ``generation_config.json`` and ``config.json``
        (``bos_token_id`` / ``eos_token_id``) are read when present. A directory written by :meth:`save`
        (``tokenizer_meta.json``) loads as saved.

        Raises:
            FileNotFoundError: no tokenizer there (a directory without ``tokenizer.json`` or
                ``tokenizer.model``, a GGUF file without ``tokenizer.ggml.*`` metadata).
            ValueError: a tokenizer file that cannot be read.
        """
        path = Path(path).expanduser()
        if not path.is_dir():
            return cls.from_gguf(path)
        file = path / "tokenizer.json"
        if (path / "tokenizer_meta.json").exists() and file.exists():
            return cls.load(path)
        tok_cfg, gen_cfg, model_cfg = (_read_json(path / n) for n in
                                       ("tokenizer_config.json", "generation_config.json", "config.json"))
        sentencepiece, model_ids = None, {}
        if file.exists():
            try:
                backend = _HFTokenizer.from_file(str(file))
            except Exception as e:  # the tokenizers package raises a bare Exception for malformed files
                raise ValueError(f"cannot read {str(file)!r} with the tokenizers package: {e}") from None
        elif (path / "tokenizer.model").exists():
            backend, sentencepiece, model_ids = _sentencepiece_directory(path / "tokenizer.model", tok_cfg)
        elif (path / "tiktoken.model").exists():
            backend = _tiktoken_directory(path / "tiktoken.model", tok_cfg)
        else:
            raise FileNotFoundError(f"{str(path)!r} has no tokenizer.json (nor a SentencePiece tokenizer.model, nor a "
                                    "tiktoken.model): copy the tokenizer files of the original checkpoint into it")

        def token_id(entry):  # "</s>" or {"content": "</s>", ...} -> id
            content = entry.get("content") if isinstance(entry, dict) else entry
            return backend.token_to_id(content) if isinstance(content, str) else None

        bos = token_id(tok_cfg.get("bos_token"))
        bos = bos if bos is not None else gen_cfg.get("bos_token_id", model_cfg.get("bos_token_id",
                                                                                    model_ids.get("bos")))
        eos = token_id(tok_cfg.get("eos_token"))
        eos = eos if eos is not None else gen_cfg.get("eos_token_id", model_cfg.get("eos_token_id",
                                                                                    model_ids.get("eos")))
        add_bos = tok_cfg.get("add_bos_token")
        if add_bos is None and sentencepiece is not None:  # transformers' LlamaTokenizer adds BOS by default
            add_bos = bos is not None
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
        if template is None:  # (an image + text model's processor template, as transformers 4.4x saved it)
            template = _read_json(path / "chat_template.json").get("chat_template")
            template = template if isinstance(template, str) else None
        return cls(backend, bos_token_id=bos, eos_token_id=eos, chat_template=template, add_bos_token=add_bos,
                   sentencepiece=sentencepiece)

    @classmethod
    def from_gguf(cls, path, reader=None) -> "Tokenizer":
        """Rebuild the tokenizer embedded in a GGUF file (``reader``: an already open ``gguf`` reader)."""
        from .loading import gguf_field, open_gguf

        reader = reader if reader is not None else open_gguf(Path(path))
        kind = gguf_field(reader, "tokenizer.ggml.model")
        if kind is None:
            raise FileNotFoundError(f"GGUF file {str(path)!r} has no tokenizer in its metadata")
        if kind not in ("gpt2", "llama"):
            raise ValueError(f"GGUF tokenizer model {kind!r} is not supported (only byte-level BPE 'gpt2' and "
                             "SentencePiece BPE 'llama')")
        tokens = gguf_field(reader, "tokenizer.ggml.tokens")
        types = gguf_field(reader, "tokenizer.ggml.token_type") or [_NORMAL] * len(tokens or [])
        pre = gguf_field(reader, "tokenizer.ggml.pre")
        if kind == "gpt2":
            merges = gguf_field(reader, "tokenizer.ggml.merges")
            if not tokens or merges is None:
                raise ValueError(f"GGUF file {str(path)!r} has no embedded vocabulary/merges")
            normalizer, pre_tokenizer = _gguf_pre_tokenizer(pre)
            bpe = models.BPE(vocab={t: i for i, t in enumerate(tokens)},
                             merges=[tuple(m.split(" ", 1)) for m in merges], fuse_unk=False,
                             ignore_merges=_gguf_pre(pre).whole)
            backend = _HFTokenizer(bpe)
            if normalizer is not None:
                backend.normalizer = normalizer
            backend.pre_tokenizer = pre_tokenizer
            backend.decoder = decoders.ByteLevel()
            specials, sentencepiece = (_CONTROL,), None
        else:
            scores = gguf_field(reader, "tokenizer.ggml.scores")
            if not tokens or scores is None or len(scores) != len(tokens) or len(types) != len(tokens):
                raise ValueError(f"GGUF file {str(path)!r} has no embedded SentencePiece vocabulary with a score "
                                 "and a type per piece (tokenizer.ggml.tokens / scores / token_type)")
            sentencepiece = SentencePiece(tokens, scores, types,
                                          gguf_field(reader, "tokenizer.ggml.unknown_token_id"),
                                          bool(gguf_field(reader, "tokenizer.ggml.add_space_prefix", True)))
            backend = _sentencepiece_bpe(sentencepiece)
            specials = (_UNKNOWN, _CONTROL)
        _add_whole_tokens(backend, tokens, types, specials)
        add_bos = gguf_field(reader, "tokenizer.ggml.add_bos_token")
        if add_bos is None:  # llama.cpp's default for the tokenizer
            add_bos = kind == "llama" or (kind == "gpt2" and _gguf_pre(pre).bos)
        bos = gguf_field(reader, "tokenizer.ggml.bos_token_id")
        if kind == "gpt2" and pre in _GGUF_NO_BOS:  # llama.cpp sets no BOS id for these: it never prepends one
            bos, add_bos = None, False
        return cls(backend, bos_token_id=bos,
                   eos_token_id=gguf_field(reader, "tokenizer.ggml.eos_token_id"),
                   chat_template=gguf_field(reader, "tokenizer.chat_template"), add_bos_token=bool(add_bos),
                   sentencepiece=sentencepiece)


# llama.cpp's token types (tokenizer.ggml.token_type)
_NORMAL, _UNKNOWN, _CONTROL, _USER_DEFINED, _UNUSED, _BYTE = 1, 2, 3, 4, 5, 6
_SPACE = "\u2581"  # SentencePiece's visible space, ▁


class SentencePiece:
    """Encoding with a SentencePiece BPE vocabulary exactly as llama.cpp does it (module docstring).

    ``tokens``, ``scores`` and ``types`` (llama.cpp's token types) per id, ``unk_id`` (for a byte that has no
    ``<0x..>`` token), ``add_space_prefix``. Control, unknown and user-defined tokens in the text are matched
    whole, the longest first. The space prefix goes in front of every stretch of text that starts the text or
    follows such a token (llama.cpp, and transformers' ``legacy`` Llama tokenizer); with ``prefix_after_special``
    false only in front of the text's start (transformers' ``legacy: false``). Merging keeps the candidate pairs
    in a heap keyed by (minus the score, the left symbol's position); a pair whose symbols changed since it
    was queued is dropped when it comes up."""

    def __init__(self, tokens, scores, types, unk_id=None, add_space_prefix: bool = True,
                 prefix_after_special: bool = True):
        self.tokens, self.scores, self.types = list(tokens), [float(x) for x in scores], [int(t) for t in types]
        self.unk_id = unk_id if isinstance(unk_id, int) and 0 <= unk_id < len(self.tokens) else None
        self.add_space_prefix, self.prefix_after_special = bool(add_space_prefix), bool(prefix_after_special)
        self.ids: dict[str, int] = {}
        for i, t in enumerate(self.tokens):
            self.ids.setdefault(t, i)
        self._compile_whole()
        self._bytes = [self.ids.get("<0x%02X>" % b, self.ids.get(chr(b), self.unk_id)) for b in range(256)]

    def _compile_whole(self) -> None:
        whole = sorted({t for t, ty in zip(self.tokens, self.types)
                        if ty in (_UNKNOWN, _CONTROL, _USER_DEFINED) and t}, key=len, reverse=True)
        self._whole = re.compile("|".join(map(re.escape, whole))) if whole else None

    def add_whole(self, text: str, token_id: int) -> None:
        """A token past the vocabulary (a checkpoint's added token) matched whole in the text."""
        if token_id != len(self.tokens):
            raise ValueError(f"an added token takes the next id, {len(self.tokens)}, not {token_id}")
        self.tokens.append(text), self.scores.append(0.0), self.types.append(_USER_DEFINED)
        self.ids.setdefault(text, token_id)
        self._compile_whole()

    def state(self) -> dict:
        return {"tokens": self.tokens, "scores": self.scores, "types": self.types, "unk_id": self.unk_id,
                "add_space_prefix": self.add_space_prefix, "prefix_after_special": self.prefix_after_special}

    def encode(self, text: str) -> list[int]:
        out: list[int] = []
        pos = 0  # every stretch of text starts the text or follows a whole token
        for m in self._whole.finditer(text) if self._whole is not None else ():
            self._merge(text[pos:m.start()], pos == 0 or self.prefix_after_special, out)
            out.append(self.ids[m.group()])
            pos = m.end()
        self._merge(text[pos:], pos == 0 or self.prefix_after_special, out)
        return out

    def _merge(self, text: str, prefix: bool, out: list[int]) -> None:
        if not text:
            return
        text = (" " + text if prefix and self.add_space_prefix else text).replace(" ", _SPACE)
        ids, scores, n = self.ids, self.scores, len(text)
        size = [1] * n  # symbol i is text[i : i + size[i]]; 0 once merged into its left neighbour
        prev, nxt = list(range(-1, n - 1)), list(range(1, n)) + [-1]

        def pair(left: int, right: int):  # the heap entry of adjacent symbols left, right, or None
            if left < 0 or right < 0:
                return None
            i = ids.get(text[left:left + size[left] + size[right]])
            return None if i is None else (-scores[i], left, right, size[left] + size[right])

        heap = [p for p in map(pair, range(n - 1), range(1, n)) if p is not None]
        heapq.heapify(heap)
        while heap:
            _, left, right, length = heapq.heappop(heap)
            if size[left] == 0 or size[right] == 0 or size[left] + size[right] != length:
                continue  # a symbol of the pair has changed since it was queued
            size[left], size[right] = length, 0
            nxt[left] = nxt[right]
            if nxt[right] >= 0:
                prev[nxt[right]] = left
            for p in (pair(prev[left], left), pair(left, nxt[left])):
                if p is not None:
                    heapq.heappush(heap, p)
        i = 0
        while i != -1:
            piece = text[i:i + size[i]]
            j = ids.get(piece)
            if j is not None:
                out.append(j)
            else:  # a character that no piece holds: its UTF-8 bytes
                spelled = [self._bytes[b] for b in piece.encode("utf-8")]
                if None in spelled:
                    raise ValueError(f"{piece!r} is in no piece of this vocabulary, which has neither its bytes' "
                                     "<0x..> tokens nor an unknown token")
                out.extend(spelled)
            i = nxt[i]


def _add_whole_tokens(backend: _HFTokenizer, tokens, types, specials) -> None:
    """Tokens of the types ``specials`` as special (matched whole, skipped by ``decode(skip_special_tokens=True)``)
    and user-defined ones as plain added tokens (matched whole) of ``backend``."""
    backend.add_special_tokens([AddedToken(t, normalized=False, special=True)
                                for t, ty in zip(tokens, types) if ty in specials])
    backend.add_tokens([AddedToken(t, normalized=False, special=False)
                        for t, ty in zip(tokens, types) if ty == _USER_DEFINED])


def _sentencepiece_merges(sp: SentencePiece) -> list[tuple[str, str]]:
    """BPE merges that tokenize nearly as ``sp`` does, as Hugging Face converts SentencePiece models: every
    split of a normal piece into two pieces that can be symbols while merging (a single character, or a
    normal piece: what merges build), highest score of the merged piece first (ties: the piece's id; one
    piece's splits by their first part's length). BPE merges the adjacent pair of the lowest rank, the
    leftmost of equal ones; SentencePiece the pair whose union scores highest, the leftmost of equal scores.
    The two differ only where different pieces of one score compete for a symbol."""
    symbol = {t for t, ty in zip(sp.tokens, sp.types) if ty == _NORMAL or len(t) == 1}
    ranked = []
    for i, (piece, ty) in enumerate(zip(sp.tokens, sp.types)):
        if ty != _NORMAL or sp.ids[piece] != i:
            continue
        for k in range(1, len(piece)):
            a, b = piece[:k], piece[k:]
            if a in symbol and b in symbol:
                ranked.append((-sp.scores[i], i, k, a, b))
    ranked.sort(key=lambda m: m[:3])
    return [(a, b) for *_, a, b in ranked]


def _sentencepiece_bpe(sp: SentencePiece) -> _HFTokenizer:
    """The ``tokenizers`` backend of a GGUF SentencePiece vocabulary (module docstring): BPE with byte fallback
    over the whole text, spaces as ``▁``; decoding undoes both and drops the prefix space."""
    unk = sp.tokens[sp.unk_id] if sp.unk_id is not None else None
    backend = _HFTokenizer(models.BPE(vocab=dict(sp.ids), merges=_sentencepiece_merges(sp), unk_token=unk,
                                      fuse_unk=False, byte_fallback=True))
    space = normalizers.Replace(" ", _SPACE)
    backend.normalizer = normalizers.Sequence([normalizers.Prepend(_SPACE), space]) if sp.add_space_prefix else space
    steps = [decoders.Replace(_SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    backend.decoder = decoders.Sequence(steps + ([decoders.Strip(" ", 1, 0)] if sp.add_space_prefix else []))
    return backend


def _protobuf_fields(buf: bytes):
    """(field number, value) of each field of one protobuf message, in order: an int for a varint (read as a
    signed 64-bit value), bytes for a length-delimited or fixed-width field."""
    def varint(i):
        value = shift = 0
        while True:
            b = buf[i]
            value |= (b & 0x7F) << shift
            i, shift = i + 1, shift + 7
            if b < 0x80:
                return value, i

    i = 0
    while i < len(buf):
        key, i = varint(i)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, i = varint(i)
            value = value - (1 << 64) if value >= 1 << 63 else value
        elif wire in (1, 5):
            size = 8 if wire == 1 else 4
            value, i = buf[i:i + size], i + size
        elif wire == 2:
            size, i = varint(i)
            value, i = buf[i:i + size], i + size
        else:
            raise ValueError(f"protobuf wire type {wire}")
        if i > len(buf):
            raise ValueError("truncated")
        yield number, value


def _read_sentencepiece_model(path: Path) -> dict:
    """The parts of a SentencePiece ``tokenizer.model`` (a ``ModelProto``) that encoding reads: its pieces'
    text, score and type (SentencePiece's types are llama.cpp's), the trainer's model type and unknown /
    BOS / EOS ids, and the normalizer's name and flags (with SentencePiece's defaults where a field is
    absent). Read from the protobuf wire format directly: no protobuf package needed."""
    import struct

    def fields(buf, defaults: dict) -> dict:  # the message's known fields, each of its default's wire kind
        out = dict(defaults)
        for number, value in _protobuf_fields(buf):
            if number in out:
                if type(value) is not type(defaults[number]):
                    raise ValueError(f"field {number} has the wrong wire type")
                out[number] = value
        return out

    # TrainerSpec: model_type (UNIGRAM by default), unk, bos, eos ids, whitespace as suffix; NormalizerSpec:
    # name, charsmap, dummy prefix, remove extra spaces, escape spaces
    trainer_defaults, normalizer_defaults = {3: 1, 40: 0, 41: 1, 42: 2, 24: 0}, {1: b"", 2: b"", 3: 1, 4: 1, 5: 1}
    try:
        tokens, scores, types = [], [], []
        trainer, normalizer = trainer_defaults, normalizer_defaults
        for number, value in _protobuf_fields(path.read_bytes()):
            if number in (1, 2, 3) and not isinstance(value, bytes):
                raise ValueError(f"field {number} is not a message")
            if number == 1:  # a SentencePiece: piece 1, score 2 (float32), type 3 (NORMAL by default)
                piece = fields(value, {1: b"", 2: struct.pack("<f", 0.0), 3: _NORMAL})
                if not _NORMAL <= piece[3] <= _BYTE:
                    raise ValueError(f"piece {len(tokens)} has the unknown type {piece[3]}")
                tokens.append(piece[1].decode("utf-8"))
                scores.append(struct.unpack("<f", piece[2])[0])
                types.append(piece[3])
            elif number == 2:
                trainer = fields(value, trainer_defaults)
            elif number == 3:
                normalizer = fields(value, normalizer_defaults)
    except (ValueError, IndexError, struct.error, UnicodeDecodeError) as e:
        raise ValueError(f"{str(path)!r} is not a SentencePiece model (tokenizer.model): {e}") from None
    if not tokens:
        raise ValueError(f"{str(path)!r} is not a SentencePiece model (tokenizer.model): it has no pieces")
    return {"tokens": tokens, "scores": scores, "types": types, "model_type": trainer[3], "unk_id": trainer[40],
            "bos_id": trainer[41], "eos_id": trainer[42], "whitespace_as_suffix": bool(trainer[24]),
            "normalizer": normalizer[1].decode("utf-8", "replace"), "charsmap": bool(normalizer[2]),
            "add_dummy_prefix": bool(normalizer[3]), "remove_extra_whitespaces": bool(normalizer[4]),
            "escape_whitespaces": bool(normalizer[5])}


def _sentencepiece_directory(path: Path, tok_cfg: dict) -> tuple[_HFTokenizer, "SentencePiece", dict]:
    """(backend, encoder, the model's own BOS / EOS ids) of a Hugging Face directory's SentencePiece
    ``tokenizer.model`` with its
    ``tokenizer_config.json`` ``tok_cfg``: ``legacy`` (default true, as transformers) puts the space prefix
    after special tokens too; ``added_tokens_decoder`` entries past the model's pieces are added (in id order,
    without gaps). Only what this encoder computes exactly loads: BPE, no normalisation (Llama's
    ``identity``), spaces kept and escaped as ``▁``, the prefix in front; anything else raises."""
    m = _read_sentencepiece_model(path)
    wrong = [what for what, bad in (
        (f"model type {m['model_type']} (only BPE, 2: a Unigram model segments differently)", m["model_type"] != 2),
        (f"normalizer {m['normalizer']!r} (only 'identity')", m["normalizer"] not in ("identity", "") or m["charsmap"]),
        ("remove_extra_whitespaces (only false)", m["remove_extra_whitespaces"]),
        ("escape_whitespaces false", not m["escape_whitespaces"]),
        ("treat_whitespace_as_suffix", m["whitespace_as_suffix"])) if bad]
    if wrong:
        raise ValueError(f"{str(path)!r}: SentencePiece settings not supported: {'; '.join(wrong)}")
    legacy = tok_cfg.get("legacy")
    sp = SentencePiece(m["tokens"], m["scores"], m["types"], m["unk_id"], m["add_dummy_prefix"],
                       prefix_after_special=legacy is None or bool(legacy))
    backend = _sentencepiece_bpe(sp)
    _add_whole_tokens(backend, sp.tokens, sp.types, (_UNKNOWN, _CONTROL))
    added = tok_cfg.get("added_tokens_decoder") or {}
    for key in sorted(added, key=lambda k: int(k)):
        i, entry = int(key), added[key]
        content = entry.get("content") if isinstance(entry, dict) else None
        if i < len(sp.tokens):
            if content != sp.tokens[i]:
                raise ValueError(f"{str(path)!r}: tokenizer_config.json's added token {i} is {content!r}, the "
                                 f"model's piece {i} is {sp.tokens[i]!r}")
            continue
        if i != len(sp.tokens) or not isinstance(content, str) or content in sp.ids:
            raise ValueError(f"{str(path)!r}: tokenizer_config.json adds token {i} ({content!r}) after the model's "
                             f"{len(sp.tokens)} tokens: not the next id, or not a new text")
        token = AddedToken(content, normalized=False, special=bool(entry.get("special", True)))
        (backend.add_special_tokens if token.special else backend.add_tokens)([token])
        if backend.token_to_id(content) != i:
            raise ValueError(f"{str(path)!r}: added token {content!r} did not get its id {i}")
        sp.add_whole(content, i)
    own = {k: m[f"{k}_id"] for k in ("bos", "eos") if 0 <= m[f"{k}_id"] < len(m["tokens"])}
    return backend, sp, own


def _byte_chars() -> list[str]:
    """GPT-2's byte-level alphabet (``tokenizers``' ByteLevel): the character each byte is written as."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("\u00a1"), ord("\u00ac") + 1), *range(ord("\u00ae"), 256)]
    out, extra = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b], extra = chr(256 + extra), extra + 1
    return [out[b] for b in range(256)]


def _rank_parts(ranks: dict, token: bytes, max_rank: int) -> list[bytes]:
    """``token``'s bytes merged as tiktoken merges them, only through pieces ranked below ``max_rank``: the adjacent
    pair whose union has the lowest rank first, until none has one."""
    parts = [token[i:i + 1] for i in range(len(token))]
    while len(parts) > 1:
        best, at = max_rank, -1
        for i in range(len(parts) - 1):
            rank = ranks.get(parts[i] + parts[i + 1], max_rank)
            if rank < best:
                best, at = rank, i
        if at < 0:
            break
        parts[at:at + 2] = [parts[at] + parts[at + 1]]
    return parts


def _tiktoken_settings(directory: Path, tok_cfg: dict) -> tuple[str, int]:
    """(``pat_str``, ``num_reserved_special_tokens``) of the tokenizer class a directory's ``tokenizer_config.json``
    names (``auto_map.AutoTokenizer``: Kimi K2's ``tokenization_kimi.TikTokenTokenizer``, Moonlight's
    ``tokenization_moonshot``), read from that module's source as literals (string constants, or ``"|".join`` of a
    list of them): the remote code is not run."""
    import ast

    names = (tok_cfg.get("auto_map") or {}).get("AutoTokenizer")
    name = names[0] if isinstance(names, list) and names else names
    if not isinstance(name, str) or "." not in name:
        raise ValueError(f"{str(directory)!r} has a tiktoken.model but its tokenizer_config.json names no tokenizer "
                         "class (auto_map.AutoTokenizer) whose split pattern could be read")
    module, cls = name.split("--")[-1].rsplit(".", 1)
    source = directory / f"{module}.py"
    try:
        tree = ast.parse(source.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError) as e:
        raise ValueError(f"cannot read the tokenizer class {name!r} from {str(source)!r}: {e}") from None

    def literal(node):
        if isinstance(node, ast.Constant) and isinstance(node.value, (str, int)):
            return node.value
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "join"
                and isinstance(node.func.value, ast.Constant) and len(node.args) == 1
                and isinstance(node.args[0], (ast.List, ast.Tuple))):
            items = [literal(e) for e in node.args[0].elts]
            if all(isinstance(i, str) for i in items):
                return node.func.value.value.join(items)
        return None

    found = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == cls:
            for stmt in node.body:
                target = stmt.targets[0] if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 else (
                    stmt.target if isinstance(stmt, ast.AnnAssign) and stmt.value is not None else None)
                if isinstance(target, ast.Name) and target.id in ("pat_str", "num_reserved_special_tokens"):
                    found[target.id] = literal(stmt.value)
    pattern, reserved = found.get("pat_str"), found.get("num_reserved_special_tokens", 256)
    if not isinstance(pattern, str) or not isinstance(reserved, int):
        raise ValueError(f"{str(source)!r}: class {cls} has no literal pat_str (and num_reserved_special_tokens) to "
                         "split by")
    return pattern, reserved


def _tiktoken_directory(path: Path, tok_cfg: dict) -> _HFTokenizer:
    """The backend of a Hugging Face directory's tiktoken vocabulary (``tiktoken.model``: a token's bytes in base64
    and its rank a line, the ranks the ids 0..n-1; Kimi K2's, Moonlight's), as tiktoken encodes: the text split by
    the tokenizer class's ``pat_str`` (:func:`_tiktoken_settings`), each split that is a token whole that token
    (``ignore_merges``, tiktoken's rule; with merges derived so, merging gives the same), else its bytes merged by
    rank (the merges derived from the ranks, as Hugging Face's and llama.cpp's converters derive them: each token's
    two parts where merging its bytes by lower ranks stops; a few seconds for Kimi K2's 163,840 tokens); then
    ``num_reserved_special_tokens`` special tokens from id n on, named by ``added_tokens_decoder`` (the rest
    ``<|reserved_token_{id}|>``, as the class names them)."""
    import base64

    ranks = {}
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines()):
        if not line.strip():
            continue
        try:
            token, rank = line.split()
            ranks[base64.b64decode(token, validate=True)] = int(rank)
        except ValueError:
            raise ValueError(f"{str(path)!r} line {n + 1} is not a base64 token and its rank") from None
    if sorted(ranks.values()) != list(range(len(ranks))):
        raise ValueError(f"{str(path)!r}: the ranks are not the ids 0..{len(ranks) - 1}, each once")
    pattern, reserved = _tiktoken_settings(path.parent, tok_cfg)
    chars = _byte_chars()
    text = lambda b: "".join(chars[x] for x in b)  # noqa: E731
    merges = []
    for token, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
        if len(token) > 1:
            parts = _rank_parts(ranks, token, rank)
            if len(parts) != 2:
                raise ValueError(f"{str(path)!r}: token {rank} ({token!r}) is no merge of two lower-ranked tokens")
            merges.append((text(parts[0]), text(parts[1])))
    backend = _HFTokenizer(models.BPE(vocab={text(t): r for t, r in ranks.items()}, merges=merges, fuse_unk=False,
                                      ignore_merges=True))
    backend.pre_tokenizer = _byte_level_splits((pattern,))
    backend.decoder = decoders.ByteLevel()
    added = {int(k): v.get("content") if isinstance(v, dict) else None
             for k, v in (tok_cfg.get("added_tokens_decoder") or {}).items()}
    for i in range(len(ranks), len(ranks) + reserved):
        content = added.pop(i, None) or f"<|reserved_token_{i}|>"
        backend.add_special_tokens([AddedToken(content, normalized=False, special=True)])
        if backend.token_to_id(content) != i:
            raise ValueError(f"{str(path)!r}: special token {content!r} did not get its id {i} (named twice?)")
    if added:
        raise ValueError(f"{str(path)!r}: tokenizer_config.json's added tokens {sorted(added)[:3]} lie outside the "
                         f"special ids {len(ranks)}..{len(ranks) + reserved - 1}")
    return backend


def _read_json(path: Path) -> dict:
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{str(path)!r} is not valid JSON: {e}") from None
    return data if isinstance(data, dict) else {}
