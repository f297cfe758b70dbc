"""The background jobs of tests/conftest.py: a marked test's commands start when the run is collected and
run while the other tests do, the marked tests run last, a failing command stops its job, and a skipped
test's job never starts."""
import os
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_TESTS = r'''
import os, sys, time
import pytest

STAMPS = os.environ["STAMPS"]


# first in the file, so its job would be the first to run were it started
def _skipped(workdir):
    return [([sys.executable, "-c", f"open({os.path.join(STAMPS, 'skipped')!r}, 'w')"], {})]


@pytest.mark.skipif(True, reason="never runs")
@pytest.mark.background(commands=_skipped)
def test_skipped(background):
    pass


def _job(workdir, n):
    stamp = os.path.join(STAMPS, f"job{n}")
    return [([sys.executable, "-c", f"open({stamp!r}, 'w').write({workdir!r})"], {}),
            ([sys.executable, "-c", f"print('second', {n})"], {})]


@pytest.mark.background(commands=_job)
@pytest.mark.parametrize("n", [1, 2])
def test_job(n, background):
    first, second = background.completed()
    assert second.stdout == f"second {n}\n"
    assert open(os.path.join(STAMPS, f"job{n}")).read() == background.workdir


def test_plain():
    # job 1 runs while this test (collected before it, run before it) waits
    deadline = time.time() + 20
    while not os.path.exists(os.path.join(STAMPS, "job1")):
        assert time.time() < deadline, "the background job did not start while the other tests ran"
        time.sleep(0.05)


def _failing(workdir):
    return [([sys.executable, "-c", "import sys; print('out'); sys.exit(3)"], {}),
            ([sys.executable, "-c", f"open({os.path.join(STAMPS, 'after_failure')!r}, 'w')"], {})]


@pytest.mark.background(commands=_failing)
def test_failing(background):
    assert [r.returncode for r in background.results] == [3]
    with pytest.raises(AssertionError, match="exited with 3"):
        background.completed()

'''


def test_background_jobs_run_while_the_other_tests_do(tmp_path):
    shutil.copy(os.path.join(ROOT, "tests", "conftest.py"), tmp_path / "conftest.py")
    (tmp_path / "test_jobs.py").write_text(_TESTS)
    stamps = tmp_path / "stamps"
    stamps.mkdir()
    r = subprocess.run([sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", "--strict-markers",
                        "test_jobs.py"], capture_output=True, text=True, cwd=tmp_path,
                       env=dict(os.environ, STAMPS=str(stamps)))
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    ran = [line.split("::")[1].split()[0] for line in r.stdout.splitlines() if line.startswith("test_jobs.py::")]
    assert ran == ["test_plain", "test_skipped", "test_job[1]", "test_job[2]", "test_failing"], ran
    assert "4 passed, 1 skipped" in r.stdout
    assert sorted(os.listdir(stamps)) == ["job1", "job2"]  # not the skipped job, nor a command after a failure
    assert not any(os.path.exists(open(stamps / f).read()) for f in ("job1", "job2"))  # work directories removed
