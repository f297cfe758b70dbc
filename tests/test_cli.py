"""CLI: argument parsing, ``triforce demo --quick`` and ``triforce generate`` end to end on the embedded
model (loaded once, shared with tests/test_engines.py), ``python -m triforce``."""
import io
import json
import subprocess
import sys

import pytest

from triforce import cli, demo
from tests.test_engines import load_smollm2


@pytest.fixture
def smol(monkeypatch):
    monkeypatch.setattr(demo, "load_model", lambda name="smollm2", dtype=None: load_smollm2())


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


def test_demo_quick(smol, capsys):
    assert cli.main(["demo", "--quick", "--context", "120", "--max-new-tokens", "8"]) == 0
    out = capsys.readouterr().out
    assert "pass key" in out and "speed-up" in out
    for method in ("autoregressive", "speculative", "triforce", "magicdec", "tree"):
        assert method in out
    assert "greedy outputs identical to autoregressive: yes" in out


def test_generate_from_stdin(smol, monkeypatch, capsys):
    monkeypatch.setattr(sys, "stdin", io.StringIO("The Python language reference describes"))
    assert cli.main(["generate", "--method", "magicdec", "--max-new-tokens", "6", "--window", "32", "--stats"]) == 0
    captured = capsys.readouterr()
    assert captured.out.strip()
    stats = json.loads(captured.err.strip().splitlines()[-1])
    assert stats["method"] == "magicdec" and stats["new_tokens"] == 6
    assert "6/6 tokens" in captured.err  # the progress bar


def test_python_m_triforce_help():
    r = subprocess.run([sys.executable, "-m", "triforce", "--help"], capture_output=True, text=True)
    assert r.returncode == 0 and "generate" in r.stdout and "demo" in r.stdout
