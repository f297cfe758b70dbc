"""The benchmark harness's arithmetic and CSV handling (bench/harness.py, bench/report.py): the fractions
of the two ceilings (copy bandwidth, matmul peak) and the binding one, a results file written before
the FLOP columns existed, and the report's tables with and without those columns."""
import csv

import pytest
import torch

from bench import harness, report

TIMING = {"median_s": 0.002, "p10_s": 0.0019, "p90_s": 0.0021, "reps": 5}


def _rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_fractions_of_each_ceiling_and_the_binding_one(tmp_path):
    path = str(tmp_path / "r.csv")
    # memory-bound: 40 MB at 20 GB/s = 2 ms at the bandwidth ceiling; 1 GFLOP at 1 TFLOP/s = 1 ms
    mem = harness.record(family="f", op="op", backend="cpu", shape="s1", dtype="float32", timing=TIMING,
                         bytes_moved=40e6, bandwidth=20e9, flops=1e9, peak=1e12, csv_path=path)
    assert (mem["roofline_frac"], mem["compute_frac"], mem["bound_frac"]) == ("1.000", "0.500", "1.000")
    assert (mem["gflops"], mem["peak_gflops"], mem["flops"]) == ("500.00", "1000.00", "1000000000")
    # compute-bound: 4 GFLOP at 1 TFLOP/s = 4 ms > 2 ms: the row runs at half its roofline
    comp = harness.record(family="f", op="op", backend="cpu", shape="s2", dtype="float32",
                          timing={**TIMING, "median_s": 0.008}, bytes_moved=40e6, bandwidth=20e9, flops=4e9,
                          peak=1e12, csv_path=path)
    assert (comp["roofline_frac"], comp["compute_frac"], comp["bound_frac"]) == ("0.250", "0.500", "0.500")
    # no FLOPs: the compute columns stay empty, the bound is the bandwidth one
    plain = harness.record(family="f", op="op2", backend="cpu", shape="s3", dtype="float32", timing=TIMING,
                           bytes_moved=20e6, bandwidth=20e9, csv_path=path)
    assert (plain["flops"], plain["compute_frac"], plain["bound_frac"]) == ("", "", "0.500")
    assert [r["bound_frac"] for r in _rows(path)] == ["1.000", "0.500", "0.500"]
    assert report.roof(report.load(path)[1]) == (0.5, True)
    assert report.roof(report.load(path)[0]) == (1.0, False)


def test_a_file_from_before_the_flop_columns_gets_the_new_header(tmp_path):
    path = tmp_path / "old.csv"
    old = harness.FIELDS[: harness.FIELDS.index("extra") + 1]
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=old)
        w.writeheader()
        w.writerow({k: "" for k in old} | {"op": "old_op", "shape": "x", "median_us": "1.00", "roofline_frac": "0.250"})
    harness.record(family="f", op="new_op", backend="cpu", shape="y", dtype="float32", timing=TIMING,
                   bytes_moved=1e6, bandwidth=1e9, flops=1e6, peak=1e9, csv_path=str(path))
    rows = _rows(path)
    assert list(rows[0]) == harness.FIELDS
    assert rows[0]["op"] == "old_op" and rows[0]["roofline_frac"] == "0.250" and rows[0]["flops"] is None
    assert rows[1]["op"] == "new_op" and rows[1]["compute_frac"] == "0.500"
    assert open(path, newline="").read().count("\r\n") == 3  # the csv module's line ends throughout
    # the report reads both, and shows the compute columns for the op that has them only
    text = report.tables(report.load(str(path)))
    old_table, new_table = text.split("**new_op**")
    assert "GFLOP/s" not in old_table and "| 25% |" in old_table
    assert "| GFLOP/s | of matmul peak | of roofline |" in new_table and "| 0.50 | 50% | 50% |" in new_table


def test_the_header_names_the_newest_rows_commit(tmp_path):
    """A rerun of a configuration keeps the table position of its first run: the header's versions and
    commit are the newest row's, not the last configuration's."""
    path = tmp_path / "r.csv"
    fields = dict(family="f", op="op", backend="cpu", dtype="float32", timing=TIMING, csv_path=str(path))
    rows = [("2026-01-01T00:00:00", "aaa", "s1"), ("2026-01-02T00:00:00", "bbb", "s2"),
            ("2026-01-03T00:00:00", "ccc", "s1")]
    for date, commit, shape in rows:
        harness.record(shape=shape, **fields)
    with open(path, newline="") as f:
        written = list(csv.DictReader(f))
    for r, (date, commit, _) in zip(written, rows):
        r["date"], r["commit"] = date, commit
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=harness.FIELDS)
        w.writeheader()
        w.writerows(written)
    assert "latest commit ccc, 2026-01-03" in report.tables(report.load(str(path)))


def test_a_foreign_csv_is_not_rewritten(tmp_path):
    path = tmp_path / "foreign.csv"
    path.write_bytes(b"a,b\r\n1,2\r\n")
    with pytest.raises(ValueError, match="not a prefix"):
        harness.record(family="f", op="op", backend="cpu", shape="s", dtype="float32", timing=TIMING,
                       csv_path=str(path))
    assert path.read_bytes() == b"a,b\r\n1,2\r\n"


def test_compute_peak_is_a_measured_matmul_rate_per_dtype_and_thread_count():
    peak = harness.compute_peak("cpu", torch.float32)
    assert 1e8 < peak < 1e14  # some plausible FLOP/s, measured once per run
    assert harness.compute_peak("cpu", torch.float32) == peak
    assert ("cpu", "torch.float32", torch.get_num_threads()) in harness._PEAK


def test_streamed_sets_exceed_twice_the_last_level_cache_and_come_in_turn(monkeypatch):
    """harness.streamed: the items and enough copies (new storage) that the sets hold at least twice the
    last-level cache, each given in turn; last_level_cache_bytes reads a positive size."""
    assert harness.last_level_cache_bytes() > 0
    monkeypatch.setattr(harness, "last_level_cache_bytes", lambda: 10_000)
    items = [torch.arange(250, dtype=torch.float32) for _ in range(4)]  # 4 KB a set
    streamed = harness.streamed(items, 1000, torch.clone)
    sets = [streamed() for _ in range(10)]
    distinct = {id(s) for s in sets}
    assert len(distinct) == 5  # 5 sets x 4 KB = 20 KB: twice 10 KB, which 4 sets would not reach
    assert all(sets[i] is sets[i + 5] for i in range(5))  # in turn
    assert any(s is items for s in sets)
    storages = {t.data_ptr() for s in sets[:5] for t in s}
    assert len(storages) == 20 and all(torch.equal(t, items[0]) for s in sets for t in s)
