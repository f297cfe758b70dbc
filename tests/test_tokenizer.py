"""GGUF tokenizers against independent references.

* SentencePiece (``tokenizer.ggml.model == "llama"``: Llama 1/2, TinyLlama, Mistral 7B up to v0.3): the
  encoder that ``Tokenizer.from_gguf`` builds (``SentencePiece``, a heap of candidate pairs) equals, on
  random text, ``spm_reference`` below, a plain implementation of the rule llama.cpp applies (merge the
  adjacent pair whose union is the vocabulary piece of the highest score, leftmost first; bytes for what no
  piece covers; a space in front of the text and after every special token). The vocabulary is trained
  here; its pieces tie in threes, and runs of spaces tie as in Llama 2. Where no scores tie, the
  ``tokenizers`` BPE that serves as ``backend`` (Hugging Face's conversion) encodes the same; where they do
  it may not (the ``ab`` / ``ba`` example), which is why encoding does not use it.
* Llama 3 (``llama-bpe``): a split found whole in the vocabulary is that token, whatever the merges.
* DeepSeek-Coder's pre-tokenizer, and chat templates that write ``bos_token`` / call ``raise_exception``.
* Opt-in (``TRIFORCE_VOCABS=1``; it downloads llama.cpp's tokenizer test files, ~77 MB, once): the real
  vocabularies of Llama 2 and Phi-3 (SentencePiece), Llama 3, Qwen2, GPT-2 and DeepSeek-Coder give, on
  llama.cpp's test texts, exactly the ids that the models' own Hugging Face tokenizers give, and decode them
  back to the texts; and the Llama 2 vocabulary equals ``spm_reference`` on random text too.
"""
import json
import os
import random
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from hypothesis import given, strategies as st

from triforce.models import Llama, LlamaConfig
from triforce.models.hub import load_tokenizer
from triforce.models.tokenizer import Tokenizer

from .test_config import write_gguf

SPACE = "\u2581"
TINY = dict(vocab_size=600, hidden_size=32, intermediate_size=48, num_hidden_layers=1, num_attention_heads=2,
            num_key_value_heads=1, max_position_embeddings=64)


def spm_reference(text, vocab, scores, types, add_space_prefix=True):
    """Token ids of ``text`` under SentencePiece's BPE as llama.cpp runs it, straight from the definition.

    The text is cut at special (control, unknown) and user-defined tokens, each matched whole, the longest
    first. Each stretch of plain text gets a space in front; its spaces become ``▁``; it starts as one symbol
    per character; then, as long as some adjacent pair's union is a vocabulary piece, the pair of the highest
    score merges (the leftmost of equal ones). A symbol that is a piece is its token, any other (a character
    that no piece holds) its UTF-8 bytes' ``<0x..>`` tokens."""
    whole = sorted((t for t, ty in zip(vocab, types) if ty in (2, 3, 4)), key=len, reverse=True)
    ids = {}
    for i, t in enumerate(vocab):
        ids.setdefault(t, i)
    out, pos, plain = [], 0, ""

    def merge(stretch):
        if not stretch:
            return
        symbols = list((" " + stretch if add_space_prefix else stretch).replace(" ", SPACE))
        while True:
            best = None
            for i in range(len(symbols) - 1):
                piece = symbols[i] + symbols[i + 1]
                if piece in ids and (best is None or scores[ids[piece]] > scores[ids[best[1]]]):
                    best = (i, piece)
            if best is None:
                break
            symbols[best[0]:best[0] + 2] = [best[1]]
        for s in symbols:
            out.extend([ids[s]] if s in ids else [ids["<0x%02X>" % b] for b in s.encode("utf-8")])

    while pos < len(text):
        hit = next((t for t in whole if text.startswith(t, pos)), None)
        if hit is None:
            plain += text[pos]
            pos += 1
            continue
        merge(plain)
        plain = ""
        out.append(ids[hit])
        pos += len(hit)
    merge(plain)
    return out


def spm_vocab(ties=True):
    """A SentencePiece-style vocabulary (tokens, scores, types) trained here on Python's docs: <unk>, <s>,
    </s>, the 256 byte tokens, a user-defined token, the trained pieces (score: minus their merge order, or
    with ``ties`` minus a third of it, so that pieces tie in threes) and, as in Llama 2 but with gaps, runs of
    2-16 spaces all scoring -1e9 (not with ``ties``: minus their length, below every trained piece)."""
    from tokenizers import Tokenizer as HF, models, pre_tokenizers, trainers
    import pydoc_data.topics as topics

    hf = HF(models.BPE())
    hf.pre_tokenizer = pre_tokenizers.Metaspace(replacement=SPACE, prepend_scheme="always")
    hf.train_from_iterator(list(topics.topics.values())[:30], trainers.BpeTrainer(vocab_size=500,
                                                                                 show_progress=False))
    trained = json.loads(hf.model.__getstate__())
    tokens = ["<unk>", "<s>", "</s>"] + ["<0x%02X>" % b for b in range(256)] + ["<|user|>"]
    types = [2, 3, 3] + [6] * 256 + [4]
    scores = [0.0] * len(tokens)
    runs = [SPACE * k for k in (2, 4, 8, 16, 3, 5, 6, 7, 12, 9)]
    ranked = sorted(trained["vocab"].items(), key=lambda kv: kv[1])
    for rank, (piece, _) in enumerate(ranked):
        if piece not in runs:
            tokens.append(piece), types.append(1), scores.append(-float(rank // 3 if ties else rank))
    for piece in runs:
        tokens.append(piece), types.append(1), scores.append(-1e9 if ties else -1e9 - len(piece))
    return tokens, scores, types


@pytest.fixture(scope="module")
def spm(tmp_path_factory):
    tokens, scores, types = spm_vocab()
    path = tmp_path_factory.mktemp("spm") / "m.gguf"
    config = LlamaConfig(**{**TINY, "vocab_size": len(tokens)})
    write_gguf(path, Llama(config), tokenizer={"model": "llama", "tokens": tokens, "scores": scores,
                                               "token_type": types, "bos_token_id": 1, "eos_token_id": 2,
                                               "unknown_token_id": 0})
    return load_tokenizer(path, cache_dir=False), (tokens, scores, types), path


@pytest.fixture(scope="module")
def spm_unique(tmp_path_factory):
    tokens, scores, types = spm_vocab(ties=False)
    path = tmp_path_factory.mktemp("spm") / "u.gguf"
    write_gguf(path, Llama(LlamaConfig(**{**TINY, "vocab_size": len(tokens)})), tokenizer={
        "model": "llama", "tokens": tokens, "scores": scores, "token_type": types, "unknown_token_id": 0})
    return load_tokenizer(path, cache_dir=False)


ALPHABET = list("aeinorst THEdfx_.,:()'\"\n\t0123456789") + ["  ", "    ", "é", "日本", "😀", SPACE]
PIECES = st.lists(st.one_of(st.sampled_from(ALPHABET), st.sampled_from(["<s>", "</s>", "<|user|>", "<unk>"]),
                            st.sampled_from(["def ", "return", " the ", "class", "self", "print("])),
                  max_size=40).map("".join)


@given(text=PIECES)
def test_sentencepiece_matches_reference(spm, text):
    tok, (tokens, scores, types), _ = spm
    assert tok.encode(text) == spm_reference(text, tokens, scores, types)


@given(pieces=st.lists(st.text(alphabet="ab ▁c", min_size=1, max_size=4), min_size=1, max_size=30, unique=True),
       scores=st.lists(st.integers(-4, 0), min_size=30, max_size=30),
       text=st.text(alphabet="ab c▁dé", max_size=30))
def test_sentencepiece_matches_reference_on_random_vocabularies(pieces, scores, text):
    """Any vocabulary: pieces of a few characters (some holding ``▁`` inside, single characters missing),
    few distinct scores (many ties), characters no piece holds (spelled in bytes)."""
    from triforce.models.tokenizer import SentencePiece

    tokens = ["<unk>", "<s>"] + ["<0x%02X>" % b for b in range(256)] + pieces
    types = [2, 3] + [6] * 256 + [1] * len(pieces)
    all_scores = [0.0] * 258 + [float(s) for s in scores[:len(pieces)]]
    assert SentencePiece(tokens, all_scores, types, 0).encode(text) == spm_reference(text, tokens, all_scores, types)


@given(text=st.lists(st.sampled_from([a for a in ALPHABET if a != SPACE]), max_size=40).map("".join))
def test_sentencepiece_decodes_its_encoding(spm, text):
    tok, _, _ = spm
    assert tok.decode(tok.encode(text)) == text


def test_sentencepiece_breaks_ties_leftmost(tmp_path):
    """Pieces "ab" and "ba" of one score: SentencePiece merges the leftmost pair; a BPE ranks one merge first
    whatever the position (here "ab", the lower id), so on "bab" Hugging Face's conversion differs."""
    tokens = ["<unk>", "a", "b", "ab", "ba"]
    path = write_gguf(tmp_path / "t.gguf", Llama(LlamaConfig(**{**TINY, "vocab_size": 5})), tokenizer={
        "model": "llama", "tokens": tokens, "scores": [0.0, -5.0, -5.0, -1.0, -1.0], "token_type": [2, 1, 1, 1, 1],
        "add_space_prefix": False, "unknown_token_id": 0})
    tok = load_tokenizer(path, cache_dir=False)
    assert tok.encode("aba") == [3, 1] and tok.encode("bab") == [4, 2] and tok.encode("abab") == [3, 3]
    assert tok.backend.encode("bab").ids == [2, 3]
    assert tok.encode("c") == [0]  # no piece and no byte tokens: the unknown token


@given(text=st.lists(st.sampled_from([a for a in ALPHABET if a not in ("  ", "    ")]), max_size=40).map("".join))
def test_sentencepiece_backend_agrees_without_ties(spm_unique, text):
    tok = spm_unique
    assert tok.backend.encode(text).ids == tok.encode(text)


def test_sentencepiece_examples(spm):
    tok, (tokens, scores, types), path = spm
    ids = {t: i for i, t in enumerate(tokens)}
    # a character no piece holds is its UTF-8 bytes; the text gets one space in front, and so does the text
    # after a special token
    assert tok.encode("日") == [ids[SPACE], ids["<0xE6>"], ids["<0x97>"], ids["<0xA5>"]]
    assert tok.encode("") == [] and tok.encode(" ") == [ids[SPACE * 2]]
    hi = tok.encode("hi")
    assert tok.encode("<s>hi") == [1] + hi and tok.encode("<|user|>hi") == [ids["<|user|>"]] + hi
    # BOS: llama.cpp's default for a SentencePiece file without tokenizer.ggml.add_bos_token
    assert tok.add_bos_token and tok.encode("hi", add_special_tokens=True) == [1] + hi
    assert tok.decode([1] + hi, skip_special_tokens=True) == "hi"
    # the rebuilt tokenizer is cached beside the converted weights and loads back the same
    cache = path.parent / "cache"
    first, again = load_tokenizer(path, cache_dir=cache), load_tokenizer(path, cache_dir=cache)
    assert list((cache).rglob("tokenizer.json"))
    text = "def f(x):\n    return x  # 日本 😀"
    assert first.encode(text) == again.encode(text) == tok.encode(text)
    assert again.add_bos_token and again.decode(again.encode(text)) == text


def test_sentencepiece_model_generates_through_the_cli(spm, capsys):
    """A Llama-2-style GGUF (SentencePiece vocabulary) runs end to end: ``triforce generate`` prints the
    decoded greedy continuation of the prompt encoded with BOS in front, here on the file's own blocks."""
    import torch

    import triforce
    from triforce import cli
    from triforce.models import hub

    _, _, path = spm
    model, tok = hub.load_model(str(path), "gguf-int8")
    ids = hub.encode(tok, "def main(self):", add_special_tokens=tok.add_bos_token)
    assert ids[0] == 1 and ids[1:] == tok.encode("def main(self):")
    new = triforce.generate(model, torch.tensor([ids]), method="autoregressive", max_new_tokens=6,
                            eos_token_id=[]).tokens[0].tolist()
    assert cli.main(["generate", "--model", str(path), "--dtype", "gguf-int8", "--prompt", "def main(self):",
                     "--max-new-tokens", "6", "--ignore-eos"]) in (0, None)
    assert capsys.readouterr().out == hub.decode(tok, new) + "\n"


LLAMA2_STYLE_CHAT = ("{{ bos_token }}{% for m in messages %}"
                     "{% if (m['role'] == 'user') != (loop.index0 % 2 == 0) %}"
                     "{{ raise_exception('roles must alternate user/assistant') }}{% endif %}"
                     "{% if m['role'] == 'user' %}[INST] {{ m['content'] }} [/INST]"
                     "{% else %} {{ m['content'] }} {{ eos_token }}{% endif %}{% endfor %}")


def test_chat_template_sees_bos_eos_and_raise_exception(spm):
    """As transformers renders it: ``bos_token`` / ``eos_token`` are the tokens' text (an undefined name would
    render as nothing, silently), and ``raise_exception`` raises."""
    tok, _, _ = spm
    chat = Tokenizer(tok.backend, bos_token_id=1, eos_token_id=[2], chat_template=LLAMA2_STYLE_CHAT,
                     add_bos_token=True, sentencepiece=tok.sentencepiece)
    text = chat.apply_chat_template([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"},
                                     {"role": "user", "content": "go"}])
    assert text == "<s>[INST] hi [/INST] ok </s>[INST] go [/INST]"
    ids = chat.encode(text)
    assert ids[0] == 1 and ids.count(1) == 1 and ids.count(2) == 1
    with pytest.raises(ValueError, match="roles must alternate"):
        chat.apply_chat_template([{"role": "assistant", "content": "hi"}])
    bare = Tokenizer(tok.backend, chat_template=LLAMA2_STYLE_CHAT)
    assert bare.apply_chat_template([{"role": "user", "content": "x"}]) == "[INST] x [/INST]"


TEMPLATE_FEATURES = ("{% for m in messages %}{% if loop.index > 2 %}{% break %}{% endif %}"
                     "{% generation %}{{ m | tojson }}{% endgeneration %}\n{% endfor %}"
                     "{% if tools %}{{ tools | tojson(indent=2) }}{% endif %}{{ enable_thinking }}")


@pytest.mark.parametrize("template", [LLAMA2_STYLE_CHAT, TEMPLATE_FEATURES])
def test_chat_template_renders_as_transformers(spm, template):
    """The same text as transformers' own renderer for a template that uses what its environment offers:
    ``bos_token`` / ``eos_token``, ``tojson`` (no HTML escaping, its options), ``{% break %}``,
    ``{% generation %}`` blocks, and variables such as ``tools`` and ``enable_thinking``."""
    from transformers.utils.chat_template_utils import render_jinja_template

    tok, _, _ = spm
    chat = Tokenizer(tok.backend, bos_token_id=1, eos_token_id=2, chat_template=template)
    messages = [{"role": "user", "content": "héllo <b>&</b>"}, {"role": "assistant", "content": "ok"},
                {"role": "user", "content": "go"}]
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"x": "é"}}}]
    ours = chat.apply_chat_template(messages, tools=tools, enable_thinking=False)
    (theirs,), _ = render_jinja_template([messages], chat_template=template, add_generation_prompt=True,
                                         tools=tools, bos_token="<s>", eos_token="</s>", enable_thinking=False)
    assert ours == theirs
    if template == TEMPLATE_FEATURES:  # what the features did: no escaping, the break, the variables
        assert "<b>&</b>" in ours and '"é"' in ours and '"go"' not in ours and ours.endswith("False")


def test_sentencepiece_flags_and_errors(tmp_path):
    tokens, scores, types = spm_vocab()
    model = Llama(LlamaConfig(**{**TINY, "vocab_size": len(tokens)}))
    base = {"model": "llama", "tokens": tokens, "scores": scores, "token_type": types, "bos_token_id": 1}

    def build(name, **kw):
        path = write_gguf(tmp_path / name, model, tokenizer={**base, **kw})
        return load_tokenizer(path, cache_dir=False)

    plain = build("noprefix.gguf", add_space_prefix=False, add_bos_token=False)
    assert not plain.add_bos_token and build("prefix.gguf").add_bos_token
    assert plain.encode(" hi") == spm_reference(" hi", tokens, scores, types, add_space_prefix=False)
    assert plain.encode("hi") != build("prefix2.gguf").encode("hi")
    assert plain.decode(plain.encode(" x  y")) == " x  y"
    with pytest.raises(ValueError, match="score"):
        build("noscores.gguf", scores=scores[:-1])
    with pytest.raises(ValueError, match="'bert' is not supported.*'llama'"):
        build("bert.gguf", model="bert")


DATA = Path(__file__).parent / "data"


def spm_directory(tmp_path, name, tok_cfg=None):
    """A Hugging Face directory with only tests/data/spm_bpe.model as its tokenizer.model (and ``tok_cfg``)."""
    import shutil

    d = tmp_path / name
    d.mkdir()
    shutil.copy(DATA / "spm_bpe.model", d / "tokenizer.model")
    if tok_cfg is not None:
        (d / "tokenizer_config.json").write_text(json.dumps(tok_cfg))
    return d


def test_the_chat_template_from_each_file_a_directory_may_hold_it_in(tmp_path):
    """tokenizer_config.json's, else chat_template.jinja, else chat_template.json's (an image + text model's
    processor template: LLaVA's, Qwen2-VL's repositories)."""
    one = "A{{ messages[0]['content'] }}"
    d = spm_directory(tmp_path, "json", {})
    (d / "chat_template.json").write_text(json.dumps({"chat_template": one}))
    assert Tokenizer.from_pretrained(d).apply_chat_template([{"role": "user", "content": "x"}]) == "Ax"
    (d / "chat_template.jinja").write_text("B{{ messages[0]['content'] }}")
    assert Tokenizer.from_pretrained(d).chat_template.startswith("B")
    (d / "tokenizer_config.json").write_text(json.dumps({"chat_template": "C"}))
    assert Tokenizer.from_pretrained(d).chat_template == "C"


def test_sentencepiece_model_file_matches_the_sentencepiece_library(tmp_path):
    """A directory whose tokenizer is a SentencePiece tokenizer.model (older Llama 1/2-style checkpoints)
    encodes as the SentencePiece library itself does: tests/data/spm_bpe.json holds 240 texts and the ids that
    sentencepiece 0.2.3 gave for them with tests/data/spm_bpe.model (made by tests/data/make_spm_fixture.py),
    and the ids decode back to the texts."""
    tok = load_tokenizer(spm_directory(tmp_path, "m"))
    cases = json.loads((DATA / "spm_bpe.json").read_text(encoding="utf-8"))["cases"]
    assert len(cases) == 240 and tok.vocab_size == 1200 and tok.sentencepiece is not None
    assert [tok.encode(c["text"]) for c in cases] == [c["ids"] for c in cases]
    assert [tok.decode(c["ids"]) for c in cases] == [c["text"] for c in cases]
    # transformers' defaults for a Llama tokenizer: BOS in front, the model's <s> / </s>
    assert tok.add_bos_token and tok.bos_token_id == 1 and tok.eos_token_id == 2
    assert tok.encode("<|user|>x")[0] == 3  # its user-defined piece, whole


def test_sentencepiece_model_file_config(tmp_path):
    """tokenizer_config.json: ``legacy: false`` puts the space prefix only in front of the text's start;
    ``added_tokens_decoder`` adds tokens after the model's pieces (in order) and must agree with it."""
    legacy = load_tokenizer(spm_directory(tmp_path, "l", {}))
    plain = load_tokenizer(spm_directory(tmp_path, "p", {"legacy": False, "add_bos_token": False}))
    hi = legacy.encode("hi")
    assert plain.encode("hi") == hi and not plain.add_bos_token
    bare = legacy.sentencepiece.encode("<s>hi")[1:]  # prefixed after <s>
    assert bare == hi and plain.encode("<s>hi")[1:] != hi
    no_prefix = Tokenizer.from_pretrained(spm_directory(tmp_path, "n")).sentencepiece
    no_prefix.add_space_prefix = False
    assert plain.encode("<s>hi") == [1] + no_prefix.encode("hi")
    assert plain.encode("hi</s>there") == hi + [2] + no_prefix.encode("there")
    assert legacy.encode("hi</s>there") == hi + [2] + legacy.encode("there")
    added = load_tokenizer(spm_directory(tmp_path, "a", {"added_tokens_decoder": {
        "1": {"content": "<s>", "special": True}, "1200": {"content": "<pad>", "special": True},
        "1201": {"content": "<|tool|>", "special": False}}}))
    assert added.vocab_size == 1202
    assert added.encode("x<pad>y<|tool|>") == legacy.encode("x") + [1200] + legacy.encode("y") + [1201]
    assert added.decode([1200], skip_special_tokens=True) == "" and added.decode([1201]) == "<|tool|>"
    for cfg, match in (({"added_tokens_decoder": {"1201": {"content": "<gap>"}}}, "not the next id"),
                       ({"added_tokens_decoder": {"0": {"content": "<x>"}}}, "piece 0 is '<unk>'")):
        with pytest.raises(ValueError, match=match):
            load_tokenizer(spm_directory(tmp_path, f"bad{len(match)}", cfg))
    (tmp_path / "none").mkdir()
    with pytest.raises(FileNotFoundError, match="tokenizer.model"):
        Tokenizer.from_pretrained(tmp_path / "none")


def test_sentencepiece_model_file_errors(tmp_path):
    """Garbage is not a model; a Unigram model, or one that normalises or drops spaces, raises naming it
    (this encoder would segment it differently)."""
    import struct

    def varint(n):
        out = b""
        while True:
            out += bytes([(n & 0x7F) | (0x80 if n > 0x7F else 0)])
            n >>= 7
            if not n:
                return out

    def field(number, value):  # int: a varint; bytes: length-delimited
        if isinstance(value, int):
            return varint(number << 3) + varint(value)
        return varint(number << 3 | 2) + varint(len(value)) + value

    piece = field(1, field(1, b"a") + varint(2 << 3 | 5) + struct.pack("<f", -1.0) + field(3, 1))

    def model(model_type=2, name=b"identity", extra_spaces=0):
        return piece + field(2, field(3, model_type)) + field(3, field(1, name) + field(4, extra_spaces))

    from triforce.models.tokenizer import _read_sentencepiece_model

    (tmp_path / "ok.model").write_bytes(model())
    m = _read_sentencepiece_model(tmp_path / "ok.model")
    assert m["tokens"] == ["a"] and m["scores"] == [-1.0] and m["types"] == [1] and m["model_type"] == 2
    for i, (bad, match) in enumerate(((b"\xff\xff\xff", "not a SentencePiece model"),
                                      (model(model_type=1), "model type 1"),
                                      (model(name=b"nmt_nfkc"), "normalizer 'nmt_nfkc'"),
                                      (model(extra_spaces=1), "remove_extra_whitespaces"))):
        d = tmp_path / f"d{i}"
        d.mkdir()
        (d / "tokenizer.model").write_bytes(bad)
        with pytest.raises(ValueError, match=match):
            Tokenizer.from_pretrained(d)


@given(data=st.data())
def test_sentencepiece_model_parser_never_crashes(tmp_path_factory, data):
    """Random bytes, and the real model with bytes changed or cut: a ValueError or a model, never another
    exception (the parser reads untrusted files)."""
    from triforce.models.tokenizer import _read_sentencepiece_model

    real = bytearray((DATA / "spm_bpe.model").read_bytes())
    if data.draw(st.booleans()):
        blob = data.draw(st.binary(max_size=300))
    else:
        for _ in range(data.draw(st.integers(1, 8))):
            real[data.draw(st.integers(0, len(real) - 1))] = data.draw(st.integers(0, 255))
        blob = bytes(real[:data.draw(st.integers(0, len(real)))])
    path = tmp_path_factory.mktemp("fuzz") / "tokenizer.model"
    path.write_bytes(blob)
    try:
        m = _read_sentencepiece_model(path)
    except ValueError:
        return
    assert len(m["tokens"]) == len(m["scores"]) == len(m["types"]) > 0


@pytest.mark.parametrize("pre", ["llama-bpe", "llama3", "llama-v3", "falcon3"])
def test_llama3_takes_a_whole_split_from_the_vocabulary(tmp_path, pre):
    """Llama 3 (llama-bpe, and the names llama.cpp treats alike): a split that is a vocabulary token is that
    token, even where the merges would not build it; other byte-level pre-tokenizers merge it. (Real case,
    llama.cpp's test text "Cửa Việt": the Llama 3 vocabulary holds " Việt" whole; its merges end in " Vi",
    "á»", "ĩ", "t".)"""
    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)] + ["Ġ"]
    tokens = letters + ["ab", "abc", "<|begin_of_text|>"]
    common = {"model": "gpt2", "tokens": tokens, "merges": ["a b"], "token_type": [1] * (len(tokens) - 1) + [3],
              "bos_token_id": len(tokens) - 1}
    model = Llama(LlamaConfig(**{**TINY, "vocab_size": len(tokens)}))
    llama3 = load_tokenizer(write_gguf(tmp_path / "l3.gguf", model, tokenizer={**common, "pre": pre}),
                            cache_dir=False)
    qwen2 = load_tokenizer(write_gguf(tmp_path / "q2.gguf", model, tokenizer={**common, "pre": "qwen2"}),
                           cache_dir=False)
    ids = {t: i for i, t in enumerate(tokens)}
    assert llama3.encode("abc") == [ids["abc"]] and qwen2.encode("abc") == [ids["ab"], ids["c"]]
    assert llama3.encode("abd") == qwen2.encode("abd") == [ids["ab"], ids["d"]]
    # BOS by default for Llama 3 (llama.cpp's), not for the others
    assert llama3.add_bos_token and not qwen2.add_bos_token
    # a tokenizer cached by earlier rules (no "gguf_rules" in its meta: merged whole splits) is rebuilt
    cache = tmp_path / "cache"
    assert load_tokenizer(tmp_path / "l3.gguf", cache_dir=cache).encode("abc") == [ids["abc"]]
    (meta,) = cache.rglob("tokenizer_meta.json")
    old = json.loads(meta.read_text())
    del old["gguf_rules"]
    meta.write_text(json.dumps({**old, "add_bos_token": False}))
    assert load_tokenizer(tmp_path / "l3.gguf", cache_dir=cache).add_bos_token
    assert json.loads(meta.read_text())["gguf_rules"] >= 2


def test_deepseek_coder_splits(tmp_path):
    """DeepSeek-Coder's pre-tokenizer: newlines, letter runs and punctuation runs (one leading space each) split
    off in turn, then single digits; the rest stays whole ("=" is a symbol, not punctuation)."""
    from .test_families import gguf_tokenizer

    model = Llama(LlamaConfig(**{**TINY, "vocab_size": 300}))
    tok = load_tokenizer(write_gguf(tmp_path / "d.gguf", model, tokenizer=gguf_tokenizer("deepseek-coder", 300)),
                         cache_dir=False)
    splits = [s for s, _ in tok.backend.pre_tokenizer.pre_tokenize_str("x  = 12;\nif a1 b:")]
    assert splits == ["x", "ĠĠ=Ġ", "1", "2", ";", "Ċ", "if", "Ġa", "1", "Ġb", ":"]
    assert tok.decode(tok.encode("x  = 12;\nif a1 b:")) == "x  = 12;\nif a1 b:"


def _gguf_bpe(tmp_path, pre):
    from .test_families import gguf_tokenizer

    model = Llama(LlamaConfig(**{**TINY, "vocab_size": 300}))
    return load_tokenizer(write_gguf(tmp_path / f"{pre}.gguf", model, tokenizer=gguf_tokenizer(pre, 300)),
                          cache_dir=False)


def _splits(tok, text):
    """The pre-tokenizer's pieces, as text (the byte-level alphabet undone)."""
    from tokenizers import decoders

    return [decoders.ByteLevel().decode([s]) for s, _ in tok.backend.pre_tokenizer.pre_tokenize_str(text)]


# the tokenizer.json regexes of Mistral's tekken and tiktoken's o200k, written out here (independently of the
# module's composition of them) for the `regex` package to split by
_CASED = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+%s"
          r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*%s|%s"
          r"| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_CONTRACTIONS = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
CASED_SPLITS = {"tekken": _CASED % ("", "", r"\p{N}"),
                "gpt-4o": _CASED % (_CONTRACTIONS, _CONTRACTIONS, r"\p{N}{1,3}")}
CASED_CASES = [
    # text, tekken's pieces, o200k's pieces
    ("HelloWorld's 12345 a/b\n\nc", ["Hello", "World", "'s", " ", "1", "2", "3", "4", "5", " a", "/b", "\n\n", "c"],
     ["Hello", "World's", " ", "123", "45", " a", "/b", "\n\n", "c"]),
    ("ABCdef ABC helloWORLD", ["ABCdef", " ABC", " hello", "WORLD"], ["ABCdef", " ABC", " hello", "WORLD"]),
    ("path/to/x+=1;\r\n", ["path", "/to", "/x", "+=", "1", ";\r\n"], ["path", "/to", "/x", "+=", "1", ";\r\n"]),
    ("I'M élan ÉCOLE naïve", ["I", "'M", " élan", " ÉCOLE", " naïve"], ["I'M", " élan", " ÉCOLE", " naïve"]),
]


@pytest.mark.parametrize("pre", ["tekken", "gpt-4o", "llama4", "minimax-m2"])
def test_cased_word_splits(tmp_path, pre):
    """Mistral's tekken (Nemo, Small 3, Ministral) and tiktoken's o200k (gpt-4o, llama4, minimax-m2: Phi-4-mini, Llama
    4, MiniMax-M2, whose tokenizer.json has o200k's regex)
    split words at a lower-to-upper case change, keep slashes and newlines with punctuation; o200k attaches
    contractions and keeps digits in threes, tekken takes single digits. Pieces written out by hand, then random
    text against the `regex` package running the tokenizer.json regex."""
    import regex

    tok = _gguf_bpe(tmp_path, pre)
    name = "tekken" if pre == "tekken" else "gpt-4o"
    for text, tekken, o200k in CASED_CASES:
        assert _splits(tok, text) == (tekken if name == "tekken" else o200k), text
        assert tok.decode(tok.encode(text)) == text
    pattern = regex.compile(CASED_SPLITS[name])
    rng = random.Random(1)
    alphabet = list("aAbBzZ'sStTmM dD 0123456789/\n\r\t.,;+-_\u00e9\u00c9\u0301\u4e2d\u01c5\u02b0") + ["  ", "'ll"]
    for _ in range(300):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randrange(1, 30)))
        assert _splits(tok, text) == pattern.findall(text), text
    # llama.cpp's defaults: tekken puts BOS in front and takes a split found whole in the vocabulary unmerged;
    # o200k neither
    assert tok.add_bos_token == (pre == "tekken")
    assert tok.backend.model.ignore_merges == (pre == "tekken")


# bloom's tokenizer.json pre-tokenizer regex, its nested class as written there, independently of the module's form
_BLOOM_JSON = " ?[^(\\s|[.,!?\u2026\u3002\uff0c\u3001\u0964\u06d4\u060c])]+"


@pytest.mark.parametrize("pre", ["bloom", "poro-chat", "gpt3-finnish"])
def test_bloom_splits(tmp_path, pre):
    """BLOOM's pre-tokenizer (``bloom``; llama.cpp's ``poro-chat`` and ``gpt3-finnish`` split alike): runs of anything
    but whitespace and ``( | ) . , ! ? … 。 ， 、 । ۔ ،``, each with one leading space; those marks and the other
    whitespace in pieces between. Pieces written out by hand, then random text against tokenizers' own Split by
    bloom's tokenizer.json regex."""
    from tokenizers import Regex, pre_tokenizers

    tok = _gguf_bpe(tmp_path, pre)
    text = "Hello, world! (a|b)  x\u2026y\u3002\n12"
    assert _splits(tok, text) == ["Hello", ",", " world", "! (", "a", "|", "b", ") ", " x", "\u2026", "y",
                                  "\u3002\n", "12"]
    assert tok.decode(tok.encode(text)) == text and not tok.add_bos_token
    reference = pre_tokenizers.Split(Regex(_BLOOM_JSON), behavior="isolated")
    rng = random.Random(2)
    alphabet = list("aZx'.,!?()|$ \t\n0123456789\u00e9\u4e2d\u2026\u3002\uff0c\u3001\u0964\u06d4\u060c") + ["  "]
    for _ in range(300):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randrange(1, 30)))
        assert _splits(tok, text) == [p for p, _ in reference.pre_tokenize_str(text)], text


def test_deepseek_llm_splits(tmp_path):
    """DeepSeek-LLM's pre-tokenizer: newlines; runs of cased letters (not CJK, not Lo letters such as Hebrew)
    and of ASCII / full-width punctuation, each with one leading space; trailing whitespace; CJK runs; digit
    runs whole. Its punctuation range ``:-~`` holds the ASCII letters, so a word of ASCII and other letters
    splits again where they meet (" Wörld": " W", "ö", "rld"), as llama.cpp's test ids for it show."""
    tok = _gguf_bpe(tmp_path, "deepseek-llm")
    text = "Hello, Wörld! 12345\nΓειά σου 中文 ok  \nשלום x"
    assert _splits(tok, text) == ["Hello", ",", " W", "ö", "rld", "!", " ", "12345", "\n", "Γειά", " σου", " ",
                                  "中文", " ok", "  ", "\n", "שלום", " x"]
    assert tok.decode(tok.encode(text)) == text and not tok.add_bos_token


# DeepSeek-V3's tokenizer.json pre-tokenizer (as llama.cpp's deepseek-v3 copies it), written out here independently
# of the module's: three isolated splits in turn
_DEEPSEEK_V3 = (r"\p{N}{1,3}", "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
                r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"
                r"| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def test_deepseek_v3_splits(tmp_path):
    """DeepSeek-V3's pre-tokenizer (V3, R1, V3.1 GGUF files: tokenizer.ggml.pre deepseek-v3): digits in threes, CJK
    and kana runs, then words (a punctuation mark may lead ASCII letters; one space or other non-letter may lead
    letters and marks), punctuation / symbol runs with one leading space and trailing newlines, whitespace. Pieces
    written out by hand, then random text against the `regex` package splitting by the three regexes in turn."""
    import regex

    tok = _gguf_bpe(tmp_path, "deepseek-v3")
    text = "Hello, World! 12345\n\u65e5\u672c\u8a9e\u30c6\u30b9\u30c8 ok.x  \nna\u0069\u0308ve $5"
    assert _splits(tok, text) == ["Hello", ",", " World", "!", " ", "123", "45", "\n",
                                  "\u65e5\u672c\u8a9e\u30c6\u30b9\u30c8", " ok", ".x", "  \n",
                                  "na\u0069\u0308ve", " $", "5"]
    assert tok.decode(tok.encode(text)) == text and not tok.add_bos_token

    def split(text):
        pieces = [text]
        for r in _DEEPSEEK_V3:
            pattern, out = regex.compile(r), []
            for piece in pieces:  # each match and each run between matches, in order
                at = 0
                for m in pattern.finditer(piece):
                    out += [piece[at:m.start()]] if m.start() > at else []
                    out.append(m.group())
                    at = m.end()
                out += [piece[at:]] if at < len(piece) else []
            pieces = out
        return pieces

    rng = random.Random(4)
    alphabet = list("aZx'.,!$+-_/ \t\n\r0123456789\u00e9\u0301\u4e2d\u3042\u30a2\u05d0\u0416") + ["  ", "\r\n"]
    for _ in range(300):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randrange(1, 30)))
        assert _splits(tok, text) == split(text), text


# Kimi K2's regex as tokenization_kimi.py writes it (the `regex` package reads its class intersections with V1)
_KIMI_K2 = (r"[\p{Han}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&"
            r"[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+"
            r"[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
            r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def test_kimi_k2_splits(tmp_path):
    """Kimi K2's pre-tokenizer (its GGUF files: tokenizer.ggml.pre kimi-k2): Han runs whole (a Han character never
    joins a word), o200k's cased words with contractions, digits in threes, punctuation runs with trailing newlines
    (a slash is punctuation: "/y"), whitespace. Pieces written out by hand, then random text against the `regex`
    package running tokenization_kimi.py's regex."""
    import regex

    tok = _gguf_bpe(tmp_path, "kimi-k2")
    text = "Hello\u4e2d\u6587World's 12345 x/y\n\nThe  end\u3042\u4e2d"
    assert _splits(tok, text) == ["Hello", "\u4e2d\u6587", "World's", " ", "123", "45", " x", "/y", "\n\n", "The",
                                  " ", " end\u3042", "\u4e2d"]
    assert tok.decode(tok.encode(text)) == text and not tok.add_bos_token
    pattern = regex.compile(_KIMI_K2, flags=regex.V1)
    rng = random.Random(6)
    alphabet = list("aAzZ'sStT dD0123456789/\n\r\t.,;+-_\u00e9\u00c9\u0301\u4e2d\u6587\u3042\u30a2\u01c5\u02b0") + ["'ll"]
    for _ in range(300):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randrange(1, 30)))
        assert _splits(tok, text) == pattern.findall(text), text


def write_tiktoken_directory(directory, ranks: dict, specials: dict, pattern: str, module: str = "tokenization_kimi"):
    """A Hugging Face directory as Kimi K2's holds its tokenizer: ``tiktoken.model`` (``ranks``: bytes -> rank, a
    base64 line each), ``tokenizer_config.json`` (``auto_map`` to ``<module>.TikTokenTokenizer``, ``specials``: id
    -> content in ``added_tokens_decoder``, ``[BOS]`` / ``[EOS]``) and the class's module with its ``pat_str`` as
    ``"|".join`` of raw strings and ``num_reserved_special_tokens`` (the code is read, not run)."""
    import base64

    directory.mkdir(parents=True, exist_ok=True)
    (directory / "tiktoken.model").write_text("".join(f"{base64.b64encode(t).decode()} {r}\n"
                                                      for t, r in sorted(ranks.items(), key=lambda kv: kv[1])))
    (directory / "tokenizer_config.json").write_text(json.dumps({
        "auto_map": {"AutoTokenizer": [f"{module}.TikTokenTokenizer", None]}, "bos_token": "[BOS]",
        "eos_token": "[EOS]", "added_tokens_decoder": {str(i): {"content": c, "special": True}
                                                       for i, c in specials.items()}}))
    parts = ",\n".join(f"            r\"\"\"{p}\"\"\"" for p in pattern.split("\n"))
    (directory / f"{module}.py").write_text(
        "import tiktoken\n\n\nclass TikTokenTokenizer:\n    num_reserved_special_tokens = 8\n\n"
        f"    pat_str = \"|\".join(\n        [\n{parts}\n        ]\n    )\n\n    def __init__(self):\n        raise "
        "RuntimeError('not run')\n")
    return directory


def test_a_tiktoken_directory_encodes_as_tiktoken(tmp_path):
    """A directory with Kimi K2's tokenizer files (tiktoken.model, the class's pat_str read from its source, its
    special tokens) encodes as tiktoken itself with the same ranks, pattern and special tokens: the texts of the
    cased-word tests and 300 random mixes of letters, marks, digits, Han, kana, punctuation, whitespace and the
    special tokens; it decodes back; BOS / EOS are [BOS] / [EOS]; the reserved ids are named as the class names
    them."""
    tiktoken = pytest.importorskip("tiktoken")
    from tiktoken._educational import bpe_train

    from triforce.models.hub import load_tokenizer

    rng = random.Random(0)
    words = ["hello", "world", "the", "token", "\u4e2d\u6587", "\u5b57\u7b26", "\u65e5\u672c\u8a9e",
             "\u30c6\u30ad\u30b9\u30c8", "CamelCase", "ALLCAPS", "don't", "I'm", "12345", "3.14", "na\u00efve",
             "caf\u00e9", "x/y", "\n\n", "  "]
    ranks = bpe_train(" ".join(rng.choice(words) for _ in range(600)), 330, r"\S+|\s+", visualise=None)
    n = len(ranks)
    specials = {n: "[BOS]", n + 1: "[EOS]", n + 3: "<|im_end|>"}
    tok = load_tokenizer(write_tiktoken_directory(tmp_path / "kimi", ranks, specials, _KIMI_K2))
    named = {c: i for i, c in specials.items()}
    reserved = {f"<|reserved_token_{i}|>": i for i in range(n, n + 8) if i not in specials}
    enc = tiktoken.Encoding("kimi", pat_str=_KIMI_K2, mergeable_ranks=ranks, special_tokens={**named, **reserved})
    assert (tok.bos_token_id, tok.eos_token_id, tok.vocab_size) == (n, n + 1, n + 8) and not tok.add_bos_token
    alphabet = list("aAzZ'sStT dD0123456789/\n\r\t.,;+-_\u00e9\u00c9\u0301\u4e2d\u6587\u3042\u30a2\u01c5") + [
        "'ll", "hello", "world", " the", "[BOS]", "<|im_end|>", f"<|reserved_token_{n + 2}|>"]
    texts = [t for t, _, _ in CASED_CASES] + ["".join(rng.choice(alphabet) for _ in range(rng.randrange(1, 40)))
                                              for _ in range(300)]
    for text in texts:
        ids = tok.encode(text)
        assert ids == enc.encode(text, allowed_special="all"), text
        assert tok.decode(ids) == text


def test_a_tiktoken_directory_that_cannot_be_read_raises(tmp_path):
    """A tiktoken.model directory whose class names no pattern, or whose pattern is no literal, or whose ranks or
    added tokens do not fit, raises naming what."""
    from triforce.models.hub import load_tokenizer

    ranks = {bytes([b]): b for b in range(256)}
    with pytest.raises(ValueError, match="no tokenizer class"):
        d = write_tiktoken_directory(tmp_path / "a", ranks, {}, r"\S+")
        (d / "tokenizer_config.json").write_text("{}")
        load_tokenizer(d)
    d = write_tiktoken_directory(tmp_path / "b", ranks, {}, r"\S+")
    (d / "tokenization_kimi.py").write_text("class TikTokenTokenizer:\n    pat_str = make()\n")
    with pytest.raises(ValueError, match="no literal pat_str"):
        load_tokenizer(d)
    with pytest.raises(ValueError, match="not the ids"):
        load_tokenizer(write_tiktoken_directory(tmp_path / "c", {**ranks, b"ab": 300}, {}, r"\S+"))
    with pytest.raises(ValueError, match="no merge of two"):
        load_tokenizer(write_tiktoken_directory(tmp_path / "d", {**ranks, b"abc": 256}, {}, r"\S+"))
    with pytest.raises(ValueError, match="outside the special ids"):
        load_tokenizer(write_tiktoken_directory(tmp_path / "e", ranks, {300: "[X]"}, r"\S+"))
    d = write_tiktoken_directory(tmp_path / "f", ranks, {}, r"\S+")
    (d / "tiktoken.model").write_text("not base64!! 1\n")
    with pytest.raises(ValueError, match="line 1 is not a base64 token"):
        load_tokenizer(d)


# ---- opt-in: the real vocabularies in llama.cpp's tokenizer tests

VOCABS = ["llama-spm", "phi-3", "llama-bpe", "qwen2", "gpt-2", "deepseek-coder", "deepseek-llm", "qwen35",
          "command-r", "starcoder", "refact", "mpt", "falcon"]
LLAMA_CPP_SDIST = "llama_cpp_python-0.3.36"  # its vendored llama.cpp holds models/ggml-vocab-*.gguf{,.inp,.out}


@pytest.fixture(scope="module")
def real_vocabs():
    """llama.cpp's tokenizer test files for VOCABS, fetched once into the triforce cache (``<cache>/vocabs``,
    ``~/.cache/triforce/vocabs`` by default): the llama-cpp-python source archive from PyPI, of which only
    those files are kept."""
    if os.environ.get("TRIFORCE_VOCABS") != "1":
        pytest.skip("opt-in: set TRIFORCE_VOCABS=1 to fetch llama.cpp's tokenizer test files (~77 MB once)")
    from triforce.models.loading import default_cache_dir

    root = default_cache_dir() / "vocabs"
    names = [f"ggml-vocab-{v}.gguf{ext}" for v in VOCABS for ext in ("", ".inp", ".out")]
    if not all((root / n).exists() for n in names):
        root.mkdir(parents=True, exist_ok=True)
        version = LLAMA_CPP_SDIST.split("-")[1]
        subprocess.run([sys.executable, "-m", "pip", "download", f"llama-cpp-python=={version}", "--no-deps",
                        "--no-binary", ":all:", "-q", "-d", str(root)], check=True)
        with tarfile.open(root / f"{LLAMA_CPP_SDIST}.tar.gz") as archive:
            for n in names:
                member = archive.extractfile(f"{LLAMA_CPP_SDIST}/vendor/llama.cpp/models/{n}")
                (root / n).write_bytes(member.read())
        (root / f"{LLAMA_CPP_SDIST}.tar.gz").unlink()
    return root


def vocab_cases(root, name):
    """llama.cpp's test texts (separated by a marker line) and the ids that the model's own Hugging Face
    tokenizer gave for each (one line each)."""
    texts = (root / f"ggml-vocab-{name}.gguf.inp").read_text(encoding="utf-8").split("\n__ggml_vocab_test__\n")
    lines = (root / f"ggml-vocab-{name}.gguf.out").read_text(encoding="utf-8").split("\n")
    return [(t, [int(i) for i in line.split()]) for t, line in zip(texts, lines)]


@pytest.mark.parametrize("name", VOCABS)
def test_real_vocabularies_match_their_tokenizers(real_vocabs, name):
    tok = load_tokenizer(real_vocabs / f"ggml-vocab-{name}.gguf", cache_dir=False)
    cases = vocab_cases(real_vocabs, name)
    assert len(cases) >= 40
    assert [tok.encode(text) for text, _ in cases] == [ids for _, ids in cases]
    assert [tok.decode(ids) for _, ids in cases] == [text for text, _ in cases]
    if tok.chat_template:  # Phi-3's and Qwen2's files carry theirs: rendered as transformers renders it
        from transformers.utils.chat_template_utils import render_jinja_template

        messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"},
                    {"role": "assistant", "content": "hello"}, {"role": "user", "content": "2+2?"}]
        text = lambda i: tok.backend.id_to_token(i) if isinstance(i, int) else ""  # noqa: E731
        (theirs,), _ = render_jinja_template([messages], chat_template=tok.chat_template, add_generation_prompt=True,
                                             bos_token=text(tok.bos_token_id), eos_token=text(tok.eos_token_id))
        assert tok.apply_chat_template(messages) == theirs


def test_llama2_vocabulary_matches_reference_on_random_text(real_vocabs):
    from triforce.models.loading import gguf_field, open_gguf

    path = real_vocabs / "ggml-vocab-llama-spm.gguf"
    reader = open_gguf(path)
    tokens, scores, types = (gguf_field(reader, f"tokenizer.ggml.{k}") for k in ("tokens", "scores", "token_type"))
    tok = Tokenizer.from_gguf(path, reader)
    rng = random.Random(0)
    import pydoc_data.topics as topics

    corpus = " ".join(topics.topics.values())
    for k in range(2000):
        if k % 2:
            start = rng.randrange(len(corpus) - 300)
            text = corpus[start:start + rng.randrange(1, 300)]
        else:
            text = "".join(rng.choice(ALPHABET + [" " * 17, " " * 33, "<s>", "</s>"]) for _ in range(30))
        assert tok.encode(text) == spm_reference(text, tokens, scores, types), text


@pytest.mark.parametrize("pre", ["glm4", "chatglm-bpe"])
def test_glm4_pre_tokenizer_is_llama3_split_without_bos(tmp_path, pre):
    """GLM-4's pre-tokenizers (llama.cpp's CHATGLM4): Llama 3's split (the same pieces and ids as a dbrx file of the
    same vocabulary), and no BOS token, not even where the file asks for one (llama.cpp drops its BOS id)."""
    from .test_families import gguf_tokenizer

    model = Llama(LlamaConfig(**{**TINY, "vocab_size": 300}))
    glm = load_tokenizer(write_gguf(tmp_path / "g.gguf", model, tokenizer={**gguf_tokenizer(pre, 300),
                                                                         "add_bos_token": True}), cache_dir=False)
    dbrx = _gguf_bpe(tmp_path, "dbrx")
    text = "It's 12345 items, i.e.\n\n  THE end's"
    assert _splits(glm, text) == _splits(dbrx, text)
    assert glm.encode(text) == dbrx.encode(text) and glm.decode(glm.encode(text)) == text
    assert glm.bos_token_id is None and not glm.add_bos_token
