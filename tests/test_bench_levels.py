"""The cost model (bench/cost_model.py) and TriForce's level benchmark (bench/bench_levels.py), run on tiny
shapes on the CPU: the same code a GPU run of the Llama-3.1-8B shape goes through."""
import csv
import json
import os

import pytest
from hypothesis import given, strategies as st

from bench import bench_levels
from bench.cost_model import (chain_acceptance, expected_tokens, per_token_acceptance, speculative_speedup,
                              triforce_speedup)


def test_expected_tokens_and_chain_acceptance_at_known_points():
    assert expected_tokens(1.0, 4) == 5 and expected_tokens(0.0, 4) == 1
    assert expected_tokens(0.5, 2) == pytest.approx(1.75)
    assert chain_acceptance(0.5, 2) == pytest.approx((0.5 + 0.25) / 2)
    assert chain_acceptance(1.0, 6) == 1.0 and chain_acceptance(0.0, 6) == 0.0


@given(st.floats(0.0, 1.0), st.integers(1, 12))
def test_per_token_acceptance_inverts_the_chain_rate(a, g):
    assert per_token_acceptance(chain_acceptance(a, g), g) == pytest.approx(a, abs=1e-9)


def test_per_token_acceptance_refuses_a_rate_outside_0_1():
    with pytest.raises(ValueError, match="rate must be in"):
        per_token_acceptance(1.5, 2)


def test_speedups_by_hand():
    # one level: a = 0.5, gamma 2 -> 1.75 tokens per round of 2 drafts at 0.1 and a verification at 1.2
    assert speculative_speedup(0.5, 2, 0.1, 1.2, 1.0) == pytest.approx(1.75 / 1.4)
    # TriForce, every draft accepted at both levels: gamma2 = 6 tokens take 6 / 3 = 2 middle blocks of
    # 2 drafts (0.1 each) and a middle pass (0.5); the full pass (1.2) then yields 7 tokens
    assert triforce_speedup(1.0, 1.0, 2, 6, 0.1, 0.5, 1.2, 1.0) == pytest.approx(7 / (2 * 0.7 + 1.2))
    # nothing accepted anywhere: 6 blocks for the middle's 6 tokens, 1 token per round; and a rebuild
    # charged per emitted token
    assert triforce_speedup(0.0, 0.0, 2, 6, 0.1, 0.5, 1.2, 1.0, rebuild=0.3) == pytest.approx(1 / (6 * 0.7 + 1.2 + 0.3))


def test_levels_benchmark_on_tiny_shapes(tmp_path, monkeypatch):
    monkeypatch.setenv("TRIFORCE_BENCH_CSV", str(tmp_path / "r.csv"))
    out = bench_levels.main(["--target", "tiny", "--draft", "tiny", "--context", "384", "--batch", "1", "2",
                             "--budget", "64", "--rebuild-stride", "64", "--window", "48", "--device", "cpu",
                             "--dtype", "float32", "--reps", "1", "--warmup", "0", "--json", str(tmp_path / "r.json")])
    assert json.load(open(tmp_path / "r.json")) == json.loads(json.dumps(out))
    assert [(s["batch"], s["context"]) for s in out["shapes"]] == [(1, 384), (2, 384)]
    for s in out["shapes"]:
        p = s["passes"]
        assert (p["autoregressive"]["cache_tokens"], p["autoregressive"]["tokens"]) == (384, 1)
        assert (p["full"]["cache_tokens"], p["full"]["tokens"]) == (384, 7)
        assert (p["retrieval"]["cache_tokens"], p["retrieval"]["tokens"]) == (64 + 32, 3)
        assert (p["draft"]["cache_tokens"], p["draft"]["tokens"]) == (16 + 48, 1)
        assert all(r["ms"] > 0 for r in p.values())
        assert set(s["predicted_speedup"]) == set(out["acceptance"]) and all(v > 0 for v in s["predicted_speedup"].values())
    # the embedded model's measured TriForce rates, converted to per-token rates that give them back
    measured = [k for k in out["acceptance"] if k.startswith("long_results")]
    assert len(measured) == 2
    rate = json.load(open(bench_levels.ROOT + "/bench/long_results_recent.json"))["runs"]["triforce"]["acceptance"][
        "draft->retrieval"]
    a1 = out["acceptance"][next(k for k in measured if "recent" in k)][0]
    assert chain_acceptance(a1, 2) == pytest.approx(rate)
    rows = list(csv.DictReader(open(tmp_path / "r.csv")))
    assert [r["op"] for r in rows[:5]] == ["pass:autoregressive", "pass:full", "pass:retrieval", "pass:draft",
                                            "pass:rebuild"]
    assert len(rows) == 10 and all(r["family"] == "levels" for r in rows)


def test_a_shape_that_does_not_fit_is_skipped_and_said(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TRIFORCE_BENCH_CSV", str(tmp_path / "r.csv"))
    monkeypatch.setattr(bench_levels, "free_bytes", lambda device: 2**20)
    out = bench_levels.main(["--target", "tiny", "--draft", "tiny", "--context", "256", "--batch", "1",
                             "--budget", "64", "--rebuild-stride", "64", "--device", "cpu", "--reps", "1"])
    assert out["shapes"] == [{"batch": 1, "context": 256, "skipped": out["shapes"][0]["skipped"]}]
    assert "GiB free" in out["shapes"][0]["skipped"] and "skipped" in capsys.readouterr().out
    assert not (tmp_path / "r.csv").exists()


def test_bad_budget_is_refused():
    with pytest.raises(SystemExit):
        bench_levels.main(["--target", "tiny", "--context", "256", "--budget", "60", "--device", "cpu"])


def test_profile_step_smoke(tmp_path, capsys):
    """bench/profile_step.py on a tiny model (a CPU here, the GPU where there is one): a step's time, its
    memory-bound floor and the table of its ops, and a Chrome trace per shape."""
    from bench import profile_step
    rows = profile_step.main(["--model", "tiny", "--batch", "1", "2", "--context", "32", "--reps", "2",
                              "--top", "5", "--trace", str(tmp_path)])
    assert [(r["batch"], r["context"], r["tokens"]) for r in rows] == [(1, 32, 1), (2, 32, 1)]
    assert all(r["wall_ms"] > 0 and 0 < r["floor_ms"] < r["wall_ms"] for r in rows)
    out = capsys.readouterr().out
    assert "batch 2 x 32 tokens, 1 per row: step" in out and "memory-bound floor" in out and "Name" in out
    assert sorted(os.listdir(tmp_path)) == ["step_B1_N32_T1.json", "step_B2_N32_T1.json"]
    rows = profile_step.main(["--model", "tiny", "--batch", "2", "--context", "40", "--reps", "2", "--streaming"])
    assert rows[0]["streaming"] and rows[0]["wall_ms"] > 0
    assert "batch 2 x 40 tokens (StreamingLLM cache), 1 per row: step" in capsys.readouterr().out


def test_windowed_targets_read_only_their_windows():
    """The sliding-window shapes: a pass's KV bytes count a windowed layer's last W positions only (Mistral-7B:
    every layer 4096; Gemma-3-4B: 29 layers of 34 at 1024, the 5 global ones the whole cache)."""
    import torch

    for shape, layers in (("mistral-7b", [4096] * 32), ("gemma3-4b", [0 if (i + 1) % 6 == 0 else 1024
                                                                      for i in range(34)])):
        model = bench_levels.build(shape, None, 32768, "meta", torch.bfloat16)
        assert model.config.layer_windows == tuple(layers)
        per_layer = bench_levels.kv_bytes_per_token(model) // len(layers)
        assert bench_levels.kv_read_bytes(model, 32768) == per_layer * sum(w or 32768 for w in layers)
        assert bench_levels.kv_read_bytes(model, 1000) == per_layer * 1000 * len(layers)  # inside every window
