"""Test set-up: Triton in the interpreter when there is no GPU, hypothesis profiles, background jobs.

Profiles (HYPOTHESIS_PROFILE env var): ``ci`` (default; derandomized, bounded examples, no deadline)
and ``fuzz`` (random, many examples: ``HYPOTHESIS_PROFILE=fuzz pytest tests``; ``TRIFORCE_FUZZ_EXAMPLES``
examples per test, default 2000).

Background jobs: a test marked ``@pytest.mark.background(commands=f)`` checks what a long subprocess
(compiling for a GPU, the CMake build) printed. ``commands(workdir, **params)`` returns the job's
commands, a list of ``(argv, subprocess keyword arguments)`` (or None: nothing to run), for the test's
parameters and a fresh directory. Once the run is collected, the jobs start on a worker thread, one
after another, and run while the rest of the suite does (most of it is one thread in Triton's
interpreter, so the second core is free); their tests are moved to the end of the run and get the
finished job from the ``background`` fixture. Under pytest-xdist, and for a test whose job was not
started, the fixture runs the job itself.
"""
import os
import shutil
import signal
import subprocess
import tempfile
import threading

import pytest
import torch

if not torch.cuda.is_available():
    # Must happen before anything imports triton.
    os.environ.setdefault("TRITON_INTERPRET", "1")

from hypothesis import HealthCheck, settings  # noqa: E402


def _patch_triton_language_once():
    """Triton's interpreter patches ``triton.language`` for each launch (restored after it) and again, never
    restored, at every call of a ``@triton.jit`` helper inside a kernel: a scan of the whole language per
    call, a third of an interpreted verification pass's time. A helper's patch is a no-op when the launch (or an
    earlier helper of it) already patched the ``triton.language`` modules the helper sees, so it is skipped then;
    nothing a kernel computes changes. Only under the interpreter, and only where the interpreter has the
    function this wraps (another Triton version runs unchanged)."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        return
    try:
        import triton.language as tl
        from triton.runtime import interpreter
    except ImportError:
        return
    original = getattr(interpreter, "_patch_lang", None)
    if original is None or getattr(original, "_triforce_once", False):
        return
    patched: list = []  # the modules the running launch patched, while it runs
    seen: dict = {}  # function -> the ids of the triton.language modules among its globals

    class _Skipped:
        def restore(self):
            pass

    def patch_lang(fn):
        langs = seen.get(fn)
        if langs is None:
            langs = seen[fn] = {id(v) for v in fn.__globals__.values()
                                if isinstance(v, type(tl)) and v in (tl, tl.core)}
        if patched and langs <= patched[0]:
            return _Skipped()
        scope = original(fn)
        if patched:  # a helper seeing other modules (Triton's own, under ``core``): patched until the launch ends
            patched[0] |= langs
        else:  # the launch's own patch: forgotten when it is restored
            patched.append(set(langs))
            restore = scope.restore

            def restore_and_forget():
                patched.clear()
                restore()
            scope.restore = restore_and_forget
        return scope

    patch_lang._triforce_once = True
    interpreter._patch_lang = patch_lang


_patch_triton_language_once()

settings.register_profile(
    "ci",
    derandomize=True,
    max_examples=int(os.environ.get("TRIFORCE_CI_EXAMPLES", "12")),
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
)
settings.register_profile(
    "fuzz",
    max_examples=int(os.environ.get("TRIFORCE_FUZZ_EXAMPLES", "2000")),
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


class BackgroundJob:
    """One test's commands, run in order until one fails; ``results`` holds what each printed."""

    def __init__(self, commands, workdir):
        self.commands, self.workdir = commands or [], workdir
        self.results: list[subprocess.CompletedProcess] = []
        self.done = threading.Event()

    def run(self, runner=None):
        try:
            for argv, kw in self.commands:
                proc = runner.launch(argv, kw) if runner else subprocess.Popen(
                    argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)
                if proc is None:  # the run is over
                    break
                out, err = proc.communicate()
                self.results.append(subprocess.CompletedProcess(argv, proc.returncode, out, err))
                if proc.returncode != 0:
                    break
        finally:
            self.done.set()

    def completed(self) -> list[subprocess.CompletedProcess]:
        """Every command's result, after asserting that each ran and exited with status 0."""
        self.done.wait()
        for r in self.results:
            assert r.returncode == 0, f"{' '.join(map(str, r.args))} exited with {r.returncode}:\n" \
                                      f"{r.stdout[-4000:]}\n{r.stderr[-4000:]}"
        assert len(self.results) == len(self.commands), "the run ended before this job's commands ran"
        return self.results


class _BackgroundRunner:
    def __init__(self, jobs):
        self.jobs, self.proc, self.stopped = jobs, None, False
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self._work, name="triforce-background-jobs", daemon=True)
        self.thread.start()

    def _work(self):
        for job in self.jobs.values():
            job.run(self)

    def launch(self, argv, kw):
        with self.lock:
            if self.stopped:
                return None
            # a session of its own: stopping the run kills the command's children too
            self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                         start_new_session=True, **kw)
            return self.proc

    def stop(self):
        with self.lock:
            self.stopped = True
            if self.proc is not None and self.proc.poll() is None:
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        self.thread.join()


_JOBS = pytest.StashKey[dict]()
_RUNNER = pytest.StashKey[_BackgroundRunner]()


def _new_job(item) -> BackgroundJob:
    marker = item.get_closest_marker("background")
    params = item.callspec.params if hasattr(item, "callspec") else {}
    workdir = tempfile.mkdtemp(prefix="triforce-test-")
    return BackgroundJob(marker.kwargs["commands"](workdir, **params), workdir)


def _skipped(item) -> bool:
    return item.get_closest_marker("skip") is not None or any(
        any(c is True for c in m.args) or m.kwargs.get("condition") is True for m in item.iter_markers("skipif"))


def pytest_configure(config):
    config.addinivalue_line("markers", "background(commands=f): a long subprocess check started when the run is "
                                       "collected (tests/conftest.py)")


@pytest.hookimpl(trylast=True)  # after -k / -m deselection
def pytest_collection_modifyitems(session, config, items):
    marked = [item for item in items if item.get_closest_marker("background")]
    if not marked or config.option.collectonly or hasattr(config, "workerinput"):
        return
    items[:] = [item for item in items if not item.get_closest_marker("background")] + marked
    jobs = {item.nodeid: _new_job(item) for item in marked if not _skipped(item)}
    config.stash[_JOBS] = jobs
    config.stash[_RUNNER] = _BackgroundRunner(jobs)


def pytest_unconfigure(config):
    runner = config.stash.get(_RUNNER, None)
    if runner is not None:
        runner.stop()
    for job in config.stash.get(_JOBS, {}).values():
        shutil.rmtree(job.workdir, ignore_errors=True)


@pytest.fixture
def background(request) -> BackgroundJob:
    """This test's finished background job (see the module docstring)."""
    job = request.config.stash.get(_JOBS, {}).get(request.node.nodeid)
    if job is None:
        job = _new_job(request.node)
        request.addfinalizer(lambda: shutil.rmtree(job.workdir, ignore_errors=True))
        job.run()
    job.done.wait()
    return job


# ---- opt-in: every GGUF a test loads is also run by llama.cpp (tests/llama_cpp_oracle.py)
_oracle = None
if os.environ.get("TRIFORCE_LLAMA_CPP") == "1":
    try:
        from tests import llama_cpp_oracle as _oracle
    except ImportError:  # this conftest copied outside the repository (tests/test_background_jobs.py)
        _oracle = None

if _oracle is not None:
    @pytest.fixture(autouse=True)
    def _llama_cpp_oracle(monkeypatch, request):
        """Wraps the GGUF loader: each float32 model loaded from a GGUF file is run on random ids by llama.cpp and by
        us (``check_loaded``: our logits must be within its tolerance of llama.cpp's, or the test fails), and the
        comparison is appended to ``$TRIFORCE_LLAMA_CPP_LOG`` (JSON lines; by default in the temporary directory)."""
        import triforce.models.loading as loading
        import triforce.models.smollm2 as smollm2

        original = loading.load_pretrained

        def checked(path, *args, **kwargs):
            model = original(path, *args, **kwargs)
            _oracle.check_loaded(path, model, request.node.nodeid)
            return model

        monkeypatch.setattr(loading, "load_pretrained", checked)
        monkeypatch.setattr(smollm2, "load_pretrained", checked)

    _LOG_START = []

    def pytest_sessionstart(session):
        _LOG_START.append(_oracle.log_path().stat().st_size if _oracle.log_path().exists() else 0)

    def pytest_terminal_summary(terminalreporter):
        if not _oracle.log_path().exists():
            return
        with open(_oracle.log_path()) as f:
            f.seek(_LOG_START[0] if _LOG_START else 0)
            lines = _oracle.summary(f.read().splitlines())
        terminalreporter.section(f"llama.cpp oracle ({_oracle.log_path()})")
        for line in lines or ["no GGUF file loaded"]:
            terminalreporter.write_line(line)
