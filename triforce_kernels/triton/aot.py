"""Compile every Triton kernel for a GPU that this machine does not have, and check the result.

``python -m triforce_kernels compile-check`` (docs/gpu_compile.md). The Triton interpreter runs the
kernels' semantics on the CPU but never compiles them: block shapes that only the GPU launch plan
uses (bf16 ``tl.dot``, 64-key tiles, the SM-count split plan), shared memory, registers and launch
grids are never checked there. This module runs each op's real Triton launcher on CPU tensors with a
compile-only Triton driver in place of the GPU one:

- the launcher plans for the chosen GPU (its SM count; never the interpreter's small plan);
- Triton specialises and compiles each kernel exactly as on that GPU (PTX, then ptxas to a cubin);
- the launch is recorded instead of run, with the cubin's registers, local memory (spills) and
  shared memory read back with ``cuobjdump``, and its tensor-core instructions counted in the SASS
  (``HMMA`` = mma.sync, ``HGMMA`` = Hopper's wgmma, ``UTC*MMA`` = Blackwell's tcgen05.mma).

A problem is anything that would fail on the GPU: a compile error, more shared memory or threads
than the GPU allows, a grid dimension over CUDA's limits; and a launcher that reads a device value
on the host (a synchronisation the ops' contract rules out). Spills are reported as warnings. Nothing
here runs a kernel, so it says nothing about results or speed: that takes a GPU.
"""
from __future__ import annotations

import contextlib
import dataclasses
import itertools
import math
import os
import re
import subprocess
import tempfile
from typing import Callable, Iterator

import torch


@dataclasses.dataclass(frozen=True)
class GPU:
    """What a launch on this GPU is checked against (per-block limits are CUDA's for the arch)."""

    name: str
    arch: int  # compute capability as Triton spells it (90 = sm_90a)
    sm_count: int
    max_shared: int  # bytes of shared memory one block may opt into
    shared_per_sm: int
    regs_per_sm: int = 65536
    max_warps_per_sm: int = 64
    max_blocks_per_sm: int = 32


GPUS = {
    "h100": GPU("NVIDIA H100 SXM (sm_90a)", 90, 132, 232448, 233472),
    "h200": GPU("NVIDIA H200 (sm_90a)", 90, 132, 232448, 233472),
    "b200": GPU("NVIDIA B200 (sm_100a)", 100, 148, 232448, 233472),
}

_GRID_LIMITS = (2**31 - 1, 65535, 65535)


@dataclasses.dataclass
class Launch:
    """One recorded launch of one compiled kernel."""

    case: str
    kernel: str
    grid: tuple[int, int, int]
    num_warps: int
    num_stages: int
    shared: int
    regs: int
    local: int  # bytes of local memory per thread (register spills and stack arrays)
    hgmma: int  # wgmma (Hopper warpgroup tensor-core) instructions in the SASS
    hmma: int  # mma.sync tensor-core instructions in the SASS
    utcmma: int  # tcgen05.mma (Blackwell tensor-memory tensor-core) instructions in the SASS
    signature: str
    problems: list[str] = dataclasses.field(default_factory=list)

    def occupancy(self, gpu: GPU) -> float:
        """Resident warps per SM over the maximum, from registers, shared memory and block limits."""
        warps = self.num_warps
        regs_per_warp = math.ceil(max(self.regs, 1) * 32 / 256) * 256
        by_regs = (gpu.regs_per_sm // regs_per_warp) // warps
        by_shared = gpu.shared_per_sm // (self.shared + 1024) if self.shared else gpu.max_blocks_per_sm
        blocks = min(by_regs, by_shared, gpu.max_warps_per_sm // warps, gpu.max_blocks_per_sm)
        return blocks * warps / gpu.max_warps_per_sm


@dataclasses.dataclass
class CaseError:
    case: str
    error: str


def _tool(name: str) -> str:
    import triton

    path = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", name)
    return path if os.path.exists(path) else name


def _inspect_cubin(cubin: bytes) -> tuple[int, int, int, int, int]:
    """(registers, local bytes, HGMMA, HMMA and UTC*MMA counts) of a one-kernel cubin."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        out = subprocess.run([_tool("cuobjdump"), "-res-usage", "-sass", f.name], capture_output=True,
                             text=True, check=True).stdout
    usage = re.search(r"REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)", out)
    if usage is None:
        raise RuntimeError(f"cuobjdump printed no resource usage:\n{out[:2000]}")
    regs, local = int(usage.group(1)), int(usage.group(4))
    count = lambda pattern: len(re.findall(pattern, out))  # noqa: E731
    return regs, local, count(r"\bHGMMA\."), count(r"\bHMMA\."), count(r"\bUTC[A-Z]*MMA\b")


class _Binary:
    """What the compile-only driver 'loads': the cubin's resource usage and instruction counts."""

    def __init__(self, name: str, cubin: bytes):
        self.name = name
        self.regs, self.local, self.hgmma, self.hmma, self.utcmma = _inspect_cubin(cubin)


class _Utils:
    def __init__(self, gpu: GPU):
        self.gpu = gpu

    def load_binary(self, name, cubin, shared, device):
        b = _Binary(name, cubin)
        regs_per_thread = math.ceil(max(b.regs, 1) / 8) * 8
        max_threads = min(1024, (self.gpu.regs_per_sm // regs_per_thread) // 32 * 32)
        return b, b, b.regs, b.local, max_threads

    def unload_module(self, module):
        pass

    def get_device_properties(self, device):
        g = self.gpu
        return {"max_shared_mem": g.max_shared, "multiprocessor_count": g.sm_count, "max_num_regs": g.regs_per_sm,
                "warpSize": 32}


class _CompileOnlyDriver:
    """Enough of Triton's driver interface for the JIT to compile and 'launch' without a GPU."""

    def __init__(self, gpu: GPU, on_launch: Callable[..., None]):
        from triton.backends.compiler import GPUTarget

        self.target = GPUTarget("cuda", gpu.arch, 32)
        self.utils = _Utils(gpu)
        self._on_launch = on_launch

    def get_current_target(self):
        return self.target

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0

    def launcher_cls(self, src, metadata):
        def launch(gx, gy, gz, stream, function, packed_metadata, launch_metadata, enter_hook, exit_hook, *args):
            self._on_launch(src, metadata, function, (gx, gy, gz))

        return launch

    def get_benchmarker(self):
        raise RuntimeError("compile-only Triton driver: nothing can be timed")


@contextlib.contextmanager
def compile_only(gpu: GPU) -> Iterator[list[tuple]]:
    """Within this block, Triton launches on CPU tensors compile for ``gpu`` and are recorded
    (``(src, metadata, binary, grid)`` appended to the yielded list) instead of run."""
    from triton import knobs
    from triton.runtime.driver import driver

    from . import _target

    if knobs.runtime.interpret:
        raise RuntimeError("compile-check needs Triton's compiler, not its interpreter: run it with "
                           "TRITON_INTERPRET=0 set before Triton is imported (python -m triforce_kernels "
                           "compile-check does this)")
    launches: list[tuple] = []
    previous = driver._active
    driver.set_active(_CompileOnlyDriver(gpu, lambda *a: launches.append(a)))
    try:
        with _target.plan_for(gpu.sm_count):
            yield launches
    finally:
        # Drop what was compiled for the absent GPU (while its driver can still 'unload' it): a later
        # launch in this process must compile for the device it really runs on.
        for fn in _jit_functions():
            fn.device_caches.clear()
        driver._active = previous


def _jit_functions():
    import sys

    from triton.runtime.jit import JITFunction

    for name, mod in list(sys.modules.items()):
        if name.startswith(__package__ + ".") and mod is not None:
            yield from (v for v in vars(mod).values() if isinstance(v, JITFunction))


# --------------------------------------------------------------------------------------------------
# The cases: each op at the shapes it is benchmarked at on a GPU (docs/benchmarks.md) and at its
# boundaries. CPU tensors from torch.empty: pages are never touched, so 128K-token caches cost nothing.


def _attention_cases(quick: bool):
    from .._backend import implementation

    va = implementation("verify_attention", "triton")
    heads = [(32, 8, 128), (9, 3, 64)] if quick else [(32, 8, 128), (9, 3, 64), (12, 2, 128), (32, 32, 128),
                                                        (64, 8, 128), (8, 8, 256), (28, 4, 128)]
    dtypes = [torch.bfloat16, torch.float32] if quick else [torch.bfloat16, torch.float16, torch.float32]
    Ts = (1, 16, 64) if quick else (1, 2, 5, 7, 16, 17, 64, 128)
    shapes = [(1, 32768), (8, 131072)] if not quick else [(1, 32768)]
    for Hq, Hkv, D in heads:
        for dtype in dtypes:
            for T in Ts:
                for tree in (False, True):
                    for B, N in shapes:
                        name = (f"verify_attention B={B} N={N} Hq={Hq} Hkv={Hkv} D={D} T={T} "
                                f"{str(dtype)[6:]} {'tree' if tree else 'causal'}")

                        def run(B=B, N=N, Hq=Hq, Hkv=Hkv, D=D, T=T, dtype=dtype, tree=tree):
                            q = torch.empty(B, T, Hq, D, dtype=dtype)
                            k = torch.empty(B, N, Hkv, D, dtype=dtype)
                            v = torch.empty(B, N, Hkv, D, dtype=dtype)
                            lens = torch.full((B,), N, dtype=torch.int32)
                            mask = torch.ones(B, T, T, dtype=torch.bool).tril() if tree else None
                            va(q, k, v, lens, mask, D ** -0.5)

                        yield name, run
    # sliding windows, soft-capped scores, left padding and ALiBi (Mistral / Gemma 2 / Gemma 3, a StreamingLLM cache's
    # windowed layers, BLOOM / MPT / Falcon-RW): their own specialisations (HAS_WINDOW, SOFTCAP, HAS_LEFTPAD, ALIBI),
    # at those models' heads (Gemma's D = 256)
    quick_variants = [(1024, 50.0, False, False), (1024, 50.0, True, False),  # (Gemma 2's soft cap)
                      (None, None, False, True)]  # (ALiBi)
    variants = [(4096, None, False, False), (4096, None, True, False), (None, 50.0, False, False),
                (4096, None, True, True)] + quick_variants
    for (Hq, Hkv, D), dtype, T, tree, (window, cap, leftpad, alibi) in itertools.product(
            [(32, 8, 128), (8, 4, 256)] if quick else [(32, 8, 128), (8, 4, 256), (16, 8, 256), (9, 3, 64)],
            [torch.bfloat16] if quick else [torch.bfloat16, torch.float16, torch.float32],
            (16,) if quick else (1, 7, 16, 64), (False, True), quick_variants if quick else variants):
        def run_w(Hq=Hq, Hkv=Hkv, D=D, T=T, dtype=dtype, tree=tree, window=window, cap=cap, leftpad=leftpad,
                  alibi=alibi):
            q = torch.empty(1, T, Hq, D, dtype=dtype)
            k = torch.empty(1, 32768, Hkv, D, dtype=dtype)
            lens = torch.full((1,), 32768, dtype=torch.int32)
            mask = torch.ones(1, T, T, dtype=torch.bool).tril() if tree else None
            va(q, k, k, lens, mask, D ** -0.5, window=window, softcap=cap,
               cache_leftpad=torch.full((1,), 16, dtype=torch.int32) if leftpad else None,
               alibi_slopes=torch.ones(Hq) if alibi else None)

        yield (f"verify_attention B=1 N=32768 Hq={Hq} Hkv={Hkv} D={D} T={T} {str(dtype)[6:]} "
               f"{'tree' if tree else 'causal'} window={window} softcap={cap}"
               f"{' leftpad' if leftpad else ''}{' alibi' if alibi else ''}"), run_w
    if not quick:  # the benchmark's other T-independent row block (bench_verify_attention: triton_rows16)
        for T in (1, 7, 16, 64):
            for tree in (False, True):
                def run16(T=T, tree=tree):
                    q = torch.empty(8, T, 32, 128, dtype=torch.bfloat16)
                    k = torch.empty(8, 131072, 8, 128, dtype=torch.bfloat16)
                    lens = torch.full((8,), 131072, dtype=torch.int32)
                    mask = torch.ones(8, T, T, dtype=torch.bool).tril() if tree else None
                    va(q, k, k, lens, mask, 128 ** -0.5, block_rows=16)

                yield f"verify_attention B=8 N=131072 Hq=32 Hkv=8 D=128 T={T} bfloat16 " \
                      f"{'tree' if tree else 'causal'} rows16", run16


def _retrieval_cases(quick: bool):
    from .._backend import implementation

    chunk_mean = implementation("chunk_mean_keys", "triton")
    build = implementation("build_retrieval_cache", "triton")
    # quick keeps 12/2 heads (g = 6, Qwen2.5's): Triton 3.6 failed to compile the score combine there
    heads = [(32, 8, 128), (12, 2, 128)] if quick else [(32, 8, 128), (9, 3, 64), (12, 2, 128), (32, 32, 128),
                                                        (8, 8, 256)]
    dtypes = [torch.bfloat16] if quick else [torch.bfloat16, torch.float16, torch.float32]
    shapes = [(1, 16384, 1024, 8)] if quick else [(1, 16384, 1024, 8), (1, 131072, 4096, 8), (8, 32768, 2048, 16),
                                                  (1, 131072, 4096, 1), (1, 1048576, 4096, 8)]
    for Hq, Hkv, D in heads:
        for dtype in dtypes:
            for B, N, budget, cs in shapes:
                tag = f"B={B} N={N} Hq={Hq} Hkv={Hkv} D={D} chunk={cs} budget={budget} {str(dtype)[6:]}"

                def mean(B=B, N=N, Hkv=Hkv, D=D, cs=cs, dtype=dtype):
                    chunk_mean(torch.empty(B, N, Hkv, D, dtype=dtype), cs)

                def run(B=B, N=N, Hq=Hq, Hkv=Hkv, D=D, cs=cs, budget=budget, dtype=dtype):
                    C = N // cs
                    q = torch.empty(B, Hq, D, dtype=dtype)
                    k = torch.empty(B, N, Hkv, D, dtype=dtype)
                    v = torch.empty(B, N, Hkv, D, dtype=dtype)
                    keys = torch.empty(B, C, Hkv, D, dtype=torch.float32)
                    n = torch.full((B,), C, dtype=torch.int32)
                    out_k = torch.empty(B, budget, Hkv, D, dtype=dtype)
                    out_v = torch.empty(B, budget, Hkv, D, dtype=dtype)
                    build(q, k, v, keys, n, cs, budget // cs, out_k, out_v, 1, 2)

                yield f"chunk_mean_keys {tag}", mean
                yield f"build_retrieval_cache {tag}", run


def _sampling_cases(quick: bool):
    from .._backend import implementation

    chain = implementation("chain_speculative_sample", "triton")
    tree = implementation("tree_speculative_sample", "triton")
    chain_g = implementation("chain_greedy_verify", "triton")
    tree_g = implementation("tree_greedy_verify", "triton")
    # FlashInfer's published chain shapes, a 64-node tree, vocabularies up to 256K
    # quick keeps n = 0 (T = 1): Triton 3.6 failed to compile the sampler there
    shapes = [(16, 5, 32000), (1, 64, 128256), (1, 0, 32000)] if quick else [
        (16, 5, 32000), (32, 8, 128256), (1, 64, 128256), (1, 1, 49152), (4, 128, 152064), (2, 16, 256000),
        (256, 4, 49152), (1, 0, 32000)]
    for B, n, V in shapes:
        tag = f"B={B} n={n} V={V}"

        def run_chain(B=B, n=n, V=V):
            toks = torch.zeros(B, n, dtype=torch.int64)
            chain(toks, torch.empty(B, n, V), torch.empty(B, n + 1, V), torch.empty(B, n + 1, 2))
            chain(toks, None, torch.empty(B, n + 1, V), torch.empty(B, n + 1, 2))

        def run_tree(B=B, T=n + 1, V=V):
            toks = torch.zeros(B, T, dtype=torch.int64)
            parents = torch.zeros(B, T, dtype=torch.int64)
            tree(toks, parents, torch.empty(B, T, V), torch.empty(B, T, V), torch.empty(B, T, 2))
            tree(toks, parents, None, torch.empty(B, T, V), torch.empty(B, T, 2))

        def run_greedy(B=B, n=n, V=V):
            toks = torch.zeros(B, n, dtype=torch.int64)
            for dtype in (torch.float32, torch.bfloat16, torch.float16):
                chain_g(toks, torch.empty(B, n + 1, V, dtype=dtype))
                tree_g(torch.zeros(B, n + 1, dtype=torch.int64), torch.zeros(B, n + 1, dtype=torch.int64),
                       torch.empty(B, n + 1, V, dtype=dtype))

        yield f"chain_speculative_sample {tag}", run_chain
        yield f"tree_speculative_sample B={B} T={n + 1} V={V}", run_tree
        yield f"greedy verify (chain and tree) {tag}", run_greedy


def _model_layer_cases(quick: bool):
    """The model layer's kernels: a StreamingLLM eviction's slot moves and the decoder layer's elementwise
    work, at SmolLM2-135M's shape (batch 256, the MagicDec regime) and Llama-3.1-8B's."""
    from . import layer_ops, slot_move

    # (name, layers, Hkv * D, hidden, heads q / kv, head dim, intermediate, batch)
    models = [("smollm2", 30, 192, 576, 9, 3, 64, 1536, 256)]
    if not quick:
        models.append(("llama3-8b", 32, 1024, 4096, 32, 8, 128, 14336, 8))
    dtypes = [torch.bfloat16] if quick else [torch.bfloat16, torch.float16, torch.float32]
    for name, layers, R, hidden, hq, hkv, d, inter, B in models:
        cap, sink = 16 + 240 + 5, 16

        def move(layers=layers, R=R, B=B):
            buf = torch.empty(3 * layers, B, cap, R, dtype=torch.bfloat16)
            idx = torch.empty(B, cap - sink, dtype=torch.int64)
            slot_move.move_slots(buf, idx, idx, torch.empty(B, dtype=torch.int64))

        yield f"StreamingCache eviction slot moves {name} B={B} window=240", move
        for dtype in dtypes:
            for T in (1, 7):
                tag = f"{name} B={B} T={T} {str(dtype)[6:]}"

                def layer(B=B, T=T, dtype=dtype, hidden=hidden, hq=hq, hkv=hkv, d=d, inter=inter):
                    h = torch.empty(B, T, hidden, dtype=dtype)
                    w = torch.empty(hidden, dtype=dtype)
                    layer_ops.rms_norm(h, w, 1e-5)
                    layer_ops.rms_norm(h, w, 1e-5, h)
                    cos = torch.empty(B, T, 1, d, dtype=dtype)
                    layer_ops.rope(torch.empty(B, T, hq, d, dtype=dtype), cos, cos)
                    layer_ops.rope(torch.empty(B, T, hkv, d, dtype=dtype), cos, cos)
                    g = torch.empty(B, T, inter, dtype=dtype)
                    layer_ops.silu_mul(g, g)

                yield f"decoder layer elementwise (norms, RoPE, SiLU) {tag}", layer


def cases(quick: bool = False):
    """(name, thunk) pairs: each thunk calls one op's Triton launcher once or a few times."""
    yield from _attention_cases(quick)
    yield from _retrieval_cases(quick)
    yield from _sampling_cases(quick)
    yield from _model_layer_cases(quick)


def _sync_watch():
    """A dispatch mode that records the aten ops which read a device value on the host (a CUDA
    synchronisation) while a launcher runs: ``.item()``/``int()``, ``nonzero``, boolean-mask indexing."""
    from torch.utils._python_dispatch import TorchDispatchMode

    aten = torch.ops.aten
    syncing = {aten._local_scalar_dense.default, aten.nonzero.default, aten.masked_select.default,
               aten.is_nonzero.default, aten.equal.default, aten._unique2.default, aten.unique_consecutive.default,
               aten.repeat_interleave.Tensor}

    class SyncWatch(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.found: list[str] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            bool_index = func in (aten.index.Tensor, aten.index_put.default, aten.index_put_.default) and any(
                isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in (args[1] or ()))
            if func in syncing or bool_index:
                self.found.append(str(func))
            return func(*args, **kwargs)

    return SyncWatch()


def _explain(e: BaseException) -> str:
    """The error and, for a compile error raised inside a called @triton.jit function, its root cause
    (Triton nests one CompilationError per call level)."""
    text = f"{type(e).__name__}: {e}".rstrip()
    root = e
    while root.__cause__ is not None or (root.__context__ is not None and not root.__suppress_context__):
        root = root.__cause__ or root.__context__
    if root is not e:
        text += f"\n  root cause: {type(root).__name__}: {str(root).strip()}"
    return text


def _describe_signature(src) -> str:
    names = src.fn.arg_names
    consts = {names[path[0]]: val for path, val in src.constants.items() if len(path) == 1}
    dtypes = sorted({t[1:] for t in src.signature.values() if isinstance(t, str) and t.startswith("*")})
    parts = [f"{k}={v}" for k, v in consts.items()]
    return " ".join(parts + ["ptr:" + "/".join(dtypes)])


def _problems(gpu: GPU, launch: Launch) -> list[str]:
    out = []
    for dim, (g, limit) in enumerate(zip(launch.grid, _GRID_LIMITS)):
        if g > limit:
            out.append(f"grid dimension {'xyz'[dim]} = {g} exceeds CUDA's limit {limit}")
    if launch.shared > gpu.max_shared:
        out.append(f"{launch.shared} bytes of shared memory, more than the {gpu.max_shared} a block may use")
    return out


def check(gpu: GPU, quick: bool = False, match: str = "", dump: str | None = None,
          progress: Callable[[str], None] | None = None) -> tuple[list[Launch], list[CaseError]]:
    """Run every case under :func:`compile_only`; returns the recorded launches and the cases that
    raised (a compile error or a resource limit Triton enforces at load time)."""
    launches: list[Launch] = []
    errors: list[CaseError] = []
    with _dumping(dump), compile_only(gpu) as recorded:
        for name, thunk in cases(quick):
            if match and not re.search(match, name):
                continue
            if progress:
                progress(name)
            recorded.clear()
            watch = _sync_watch()
            try:
                with watch:
                    thunk()
            except Exception as e:  # noqa: BLE001 -- every failure is reported, none is fatal
                errors.append(CaseError(name, _explain(e)))
                continue
            for src, md, binary, grid in recorded:
                rec = Launch(case=name, kernel=md.name, grid=tuple(int(g) for g in grid), num_warps=md.num_warps,
                             num_stages=md.num_stages, shared=md.shared, regs=binary.regs, local=binary.local,
                             hgmma=binary.hgmma, hmma=binary.hmma, utcmma=binary.utcmma,
                             signature=_describe_signature(src))
                rec.problems = _problems(gpu, rec)
                launches.append(rec)
            if watch.found:  # every Triton launcher is promised free of host synchronisation
                syncs = ", ".join(sorted(set(watch.found)))
                errors.append(CaseError(name, f"host synchronisation in the launcher: {syncs}"))
    if not match and not errors:  # every kernel of the package must be compiled by some case
        launched = {x.kernel for x in launches}  # (a failed case hides which kernels it would have compiled)
        for fn in sorted(kernel_names()):
            if fn not in launched:
                errors.append(CaseError(fn, "no case launches this kernel: it was never compiled"))
    return launches, errors


def kernel_names() -> set[str]:
    """Every Triton kernel (a ``@triton.jit`` function named ``*_kernel``) of the package's ops."""
    import importlib
    import pkgutil

    from triton.runtime.jit import JITFunction

    from .. import triton as package

    names = set()
    for info in pkgutil.iter_modules(package.__path__):
        mod = importlib.import_module(f"{package.__name__}.{info.name}")
        names |= {v.fn.__name__ for v in vars(mod).values()
                  if isinstance(v, JITFunction) and v.fn.__name__.endswith("_kernel")}
    return names


@contextlib.contextmanager
def _dumping(directory: str | None) -> Iterator[None]:
    """With a directory: compile into a fresh Triton cache (so exactly this run's kernels are there),
    then copy each kernel's PTX, cubin and TTGIR into ``directory`` as ``<cache key>-<kernel>.<ext>``."""
    if directory is None:
        yield
        return
    import shutil

    from triton import knobs

    previous = knobs.cache.dir
    with tempfile.TemporaryDirectory() as cache:
        knobs.cache.dir = cache
        try:
            yield
        finally:
            knobs.cache.dir = previous
            os.makedirs(directory, exist_ok=True)
            for root, _, files in os.walk(cache):
                for f in files:
                    if f.endswith((".ptx", ".cubin", ".ttgir")):
                        shutil.copy2(os.path.join(root, f),
                                     os.path.join(directory, f"{os.path.basename(root)[:8]}-{f}"))


def kernel_table(gpu: GPU, launches: list[Launch]) -> list[dict]:
    """One row per distinct compiled kernel (name + specialisation): resources and a case using it."""
    rows: dict[tuple, dict] = {}
    for x in launches:
        key = (x.kernel, x.signature, x.num_warps)
        if key not in rows:
            rows[key] = dict(kernel=x.kernel, signature=x.signature, num_warps=x.num_warps, num_stages=x.num_stages,
                             regs=x.regs, local=x.local, shared=x.shared, occupancy=x.occupancy(gpu),
                             tensor_cores=("tcgen05" if x.utcmma else "wgmma" if x.hgmma else
                                           "mma.sync" if x.hmma else "-"),
                             launches=0, example=x.case)
        rows[key]["launches"] += 1
    return sorted(rows.values(), key=lambda r: (r["kernel"], r["signature"]))


def report(gpu: GPU, launches: list[Launch], errors: list[CaseError]) -> tuple[str, int]:
    """Markdown report and the number of problems (errors + limit violations)."""
    import triton

    lines = [f"# Triton kernels compiled for {gpu.name} with triton {triton.__version__} (compile only: nothing ran)",
             ""]
    problems = [(x.case, p) for x in launches for p in x.problems] + [(e.case, e.error) for e in errors]
    cases = {x.case for x in launches} | {e.case for e in errors}
    table = kernel_table(gpu, launches)
    spills = [r for r in table if r["local"]]
    lines.append(f"{len(cases)} cases, {len(launches)} launches, {len(table)} distinct kernels; "
                 f"{len(problems)} problems, {len(spills)} kernels with local memory (spills)")
    lines += ["", "| kernel | specialisation | warps | stages | regs | local B | shared B | occupancy | tensor cores "
              "| launches |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in table:
        lines.append(f"| {r['kernel']} | {r['signature']} | {r['num_warps']} | {r['num_stages']} | {r['regs']} | "
                     f"{r['local']} | {r['shared']} | {r['occupancy']:.0%} | {r['tensor_cores']} | {r['launches']} |")
    if problems:
        lines += ["", "## Problems", ""] + [f"- {case}: {p}" for case, p in problems]
    return "\n".join(lines) + "\n", len(problems)
