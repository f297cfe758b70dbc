"""Build checks: the torch-free C++ kernels build and pass their unit tests with CMake (ctest); when
nvcc is present, the CUDA sources compile for sm_90; every Triton kernel compiles for an H100
(sm_90a) within its limits -- no GPU needed."""
import dataclasses
import glob
import os
import re
import shutil
import subprocess
import sys
import sysconfig

import pytest
import torch
from torch.utils import cpp_extension

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(cmd, **kw):
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    assert r.returncode == 0, f"{' '.join(cmd)} failed:\n{r.stdout[-4000:]}\n{r.stderr[-4000:]}"
    return r


def _cmake_build_and_ctest(workdir):
    return [(["cmake", "-S", ROOT, "-B", workdir, "-DCMAKE_BUILD_TYPE=Release"], {}),
            (["cmake", "--build", workdir, "-j", "2"], {}),
            (["ctest", "--test-dir", workdir, "--output-on-failure"], {})]


@pytest.mark.skipif(shutil.which("cmake") is None, reason="cmake not installed")
@pytest.mark.background(commands=_cmake_build_and_ctest)
def test_cmake_build_and_ctest(background):
    r = background.completed()[-1]
    assert "tests passed" in r.stdout
    # the CUDA samplers run through the CPU emulation, plain and under ThreadSanitizer
    assert "test_sampling_cuda_emu " in r.stdout and "test_sampling_cuda_emu_tsan " in r.stdout, r.stdout


def _nvcc_sm90(workdir, src):
    if src is None:
        return None
    tinc = os.path.join(os.path.dirname(torch.__file__), "include")
    cmd = ["nvcc", "-std=c++20", "-c", src, "-o", os.path.join(workdir, "x.o"), "-arch=sm_90",
           "-DTRIFORCE_WITH_CUDA", f"-I{ROOT}/csrc/include", f"-I{ROOT}/csrc", f"-I{tinc}",
           f"-I{tinc}/torch/csrc/api/include", f"-I{sysconfig.get_paths()['include']}",
           "-D_GLIBCXX_USE_CXX11_ABI=1", "-O3", "-lineinfo", "-Xptxas", "-v"]
    cmd += [f for f in cpp_extension.COMMON_NVCC_FLAGS if f not in cmd]  # as setup.py's CUDAExtension builds it
    return [(cmd, {})]


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not found")
@pytest.mark.parametrize("src", sorted(glob.glob(os.path.join(ROOT, "csrc", "cuda", "*.cu"))) or [None])
@pytest.mark.background(commands=_nvcc_sm90)
def test_cuda_launchers_compile_for_sm90(src, background):
    """The torch launchers in csrc/cuda compile for sm_90 against this torch's headers (the CPU
    wheel ships the CUDA headers too), and no kernel spills registers. Compile only: nothing runs."""
    if src is None:
        pytest.skip("no CUDA launchers yet")
    log = background.completed()[0].stderr
    # C++20 as torch.utils.cpp_extension compiles it (torch >= 2.10 headers need it): a clean build log
    assert "warning" not in log.lower(), log[-4000:]
    # every kernel instantiation: no register spills (ptxas -v reports each entry function)
    entries = log.count("Compiling entry function")
    assert entries > 0, log[-2000:]
    assert log.count("0 bytes spill stores, 0 bytes spill loads") == entries, log[-4000:]


def _triton_nvidia_tools():
    try:
        import triton
    except ImportError:
        return None
    path = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    return path if os.path.exists(os.path.join(path, "ptxas")) else None


def _no_interpreter():
    return {"env": {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}, "cwd": ROOT}


def _compile_check_h100(workdir, triton_version):
    cmd = [sys.executable, "-m", "triforce_kernels", "compile-check", "--quick", "--json",
           os.path.join(workdir, "aot.json"), "--dump", os.path.join(workdir, "dump")]
    return [(cmd + (["--triton", triton_version] if triton_version else []), _no_interpreter())]


@pytest.mark.skipif(_triton_nvidia_tools() is None, reason="triton without its NVIDIA backend (ptxas)")
@pytest.mark.parametrize("triton_version", [None, "3.6.0"], ids=["installed", "3.6.0"])
@pytest.mark.background(commands=_compile_check_h100)
def test_triton_kernels_compile_for_h100(triton_version, background):
    """Every Triton kernel compiles for sm_90a at the launch plans of the GPU shapes (bf16 tl.dot,
    64-key tiles, SM-count splits: code the interpreter never compiles), within the H100's shared
    memory, thread and grid limits, without spilling registers or syncing the host. With the installed
    Triton and with 3.6.0, the release torch 2.11 pins: 3.6 crashed on two kernels
    that 3.9 compiles. Compile only: nothing runs."""
    import json

    r = background.completed()[0]
    assert f"with triton {triton_version or ''}" in r.stdout
    res = json.loads(open(os.path.join(background.workdir, "aot.json")).read())
    assert not res["errors"]
    kernels = {x["kernel"] for x in res["launches"]}
    assert {"_verify_attention_split_kernel", "_verify_attention_merge_kernel", "_tree_sample_kernel",
            "_tree_greedy_kernel", "_select_kernel", "_gather_kernel"} <= kernels
    assert all(x["local"] == 0 for x in res["launches"]), "a kernel spills registers to local memory"
    # the bf16 attention runs on tensor cores (wgmma once a tile has 64 query rows)
    bf16 = [x for x in res["launches"] if x["kernel"] == "_verify_attention_split_kernel"
            and "LOWP_DOT=True" in x["signature"]]
    assert bf16 and all(x["hgmma"] + x["hmma"] > 0 for x in bf16)
    assert any(x["hgmma"] > 0 for x in bf16)
    assert any("ALIBI=True" in x["signature"] for x in bf16), "ALiBi's specialisation was not compiled"
    # the prefix loop pipelines its loads (num_stages buffers of shared memory) with a sliding window too:
    # a branch in that loop had cut the windowed kernel to one stage's worth
    prefix = {}
    for x in bf16:
        if "TAIL=False" in x["signature"]:
            blocks = re.sub(r"^.*(BLOCK_R=\S+ BLOCK_N=\S+ BLOCK_D=\S+).*$", r"\1", x["signature"])
            prefix.setdefault(blocks, {})[("HAS_WINDOW=True" in x["signature"])] = x["shared"]
    both = [v for v in prefix.values() if len(v) == 2]
    assert both and all(v[True] >= v[False] for v in both), prefix
    _check_one_tile_arithmetic(os.path.join(background.workdir, "dump"))
    _check_silu_is_pytorchs(os.path.join(background.workdir, "dump"))


def _fp_ops(ttgir: str) -> list[str]:
    """The floating-point ops of a TTGIR module in order, with SSA names dropped and layout aliases
    replaced by their definitions."""
    import re

    fp = re.compile(r"warp_group_dot |tt\.dot |arith\.(mulf|addf|subf|divf|maxnumf|maximumf|truncf|cmpf)|"
                    r"math\.(exp2|log2?) |tt\.reduce|arith\.select .*f32|ttg\.convert_layout .*x(f32|bf16|f16)")
    alias = {m.group(1): m.group(2) for m in re.finditer(r"^(#\w+) = (.*)$", ttgir, re.M)}

    def norm(line):
        line = re.sub(r"\s*loc\(.*$", "", re.sub(r"%[\w#]+", "%", line)).strip()
        line = re.sub(r"!ttg\.memdesc<([\dx]+x\w+)[^>]*>", r"memdesc<\1>", line)
        line = re.sub(r",? ?isAsync = true", "", line)  # where an operand sits in shared memory, not arithmetic
        return re.sub(r"#\w+", lambda m: alias.get(m.group(0), m.group(0)), line)

    return [norm(line) for line in ttgir.split("\n") if fp.search(line)]


def _tile_updates(ttgir: str) -> list[list[str]]:
    """The floating-point ops of each tile of the online softmax (from a dot to the next dot)."""
    tiles, cur = [], None
    for op in _fp_ops(ttgir):
        dot = "warp_group_dot " in op or " tt.dot " in op
        if dot and cur is None:
            cur = []
        if cur is not None:
            cur.append(op)
            if dot and len(cur) > 1:
                tiles.append(cur)
                cur = None
    return tiles


def _check_silu_is_pytorchs(dump):
    """The GPU's SiLU divides as PyTorch's CUDA kernel does (an IEEE division, not Triton's div.full) and takes
    CUDA's expf (libdevice: a rounded-down range reduction, then ex2.approx), not a bare ex2.approx of
    x * log2 e: its rounding of x * log2 e alone is up to 28 float32 units at x = -24 (GPU run 5's failure)."""
    ptx = [open(p).read() for p in glob.glob(os.path.join(dump, "*-_silu_mul_kernel.ptx"))]
    assert ptx and all("div.rn.f32" in x and not re.search(r"\bdiv\.(full|approx)", x) for x in ptx)
    assert all("fma.rm" in x for x in ptx), "SiLU's exp is not libdevice's expf"


def _check_one_tile_arithmetic(dump):
    """verify_attention's rows are bitwise independent of T only if every launch -- the prefix kernel
    at T = 1 and at T > 1, the causal and the tree tail -- rounds a tile the same way
    (docs/attention.md, "Independent of T"): per dtype and head dim, one sequence of floating-point
    ops with the same layouts (so the same MMA shapes and the same reduction orders), and no
    multiply-add left for ptxas to contract (PTX f32 ops carry .rn). The same for the merge kernel."""
    import re

    groups = {}
    for path in glob.glob(os.path.join(dump, "*-_verify_attention_split_kernel.ttgir")):
        tiles = _tile_updates(open(path).read())
        # one tile update, or two where a sliding window's first tiles take the tail's masked update
        assert 1 <= len(tiles) <= 2, f"{path}: {len(tiles)} tile updates"
        alibi = "arith.sitofp" in open(path).read()  # (ALiBi's distances, converted to float: its only sitofp)
        for tile in tiles:
            # the first dot's shapes and dtypes, whether the scores are soft-capped (its tanh divides), ALiBi
            key = (" ".join(re.findall(r"<(\d+x\d+x\w+)", tile[0])), any("arith.divf" in op for op in tile), alibi)
            groups.setdefault(key, []).append((path, tile))
        ptx = open(path[:-len("ttgir")] + "ptx").read()
        assert not re.search(r"\b(mul|add|sub)\.f32\b", ptx), f"{path}: f32 arithmetic ptxas may contract"
    sizes = {k: len(g) for k, g in groups.items()}
    # bf16 and fp32, D = 128 and 64: prefix, prefix at T = 1, causal and tree tails (each also at T = 1)
    plain = [n for (_, capped, alibi), n in sizes.items() if not (capped or alibi)]
    assert len(plain) == 4 and all(n >= 6 for n in plain), sizes
    # soft-capped with a window, bf16, D = 128 and 256: the prefix's two updates, the causal and tree tails
    capped = [n for (_, cap, _), n in sizes.items() if cap]
    assert len(capped) == 2 and all(n >= 4 for n in capped), sizes
    # ALiBi, bf16, D = 128 and 256: the causal and tree prefixes and tails
    alibi = [n for (_, _, ali), n in sizes.items() if ali]
    assert len(alibi) == 2 and all(n >= 4 for n in alibi), sizes
    for group in groups.values():
        first_path, first = group[0]
        for path, tiles in group[1:]:
            assert tiles == first, f"{os.path.basename(path)} rounds a tile unlike {os.path.basename(first_path)}"
    # The merge, compiled apart for T = 1 (Triton specialises an argument equal to 1): the same ops
    merges = {}
    for path in glob.glob(os.path.join(dump, "*-_verify_attention_merge_kernel.ttgir")):
        ops = _fp_ops(open(path).read())
        key = " ".join(sorted(set(re.findall(r"tensor<(\d+(?:x\d+)*x\w+)", " ".join(ops)))))  # shapes, dtypes
        merges.setdefault(key, []).append(ops)
        ptx = open(path[:-len("ttgir")] + "ptx").read()
        assert not re.search(r"\b(mul|add|sub)\.f32\b", ptx), f"{path}: f32 arithmetic ptxas may contract"
    assert any(len(g) >= 2 for g in merges.values()), {k: len(g) for k, g in merges.items()}
    assert all(ops == g[0] for g in merges.values() for ops in g), "a merge variant rounds differently"


def test_compile_check_limits():
    """The launch checks themselves: CUDA's grid limits, the shared-memory limit, occupancy."""
    from triforce_kernels.triton import aot

    gpu = aot.GPUS["h100"]
    ok = aot.Launch(case="c", kernel="k", grid=(2**31 - 1, 65535, 65535), num_warps=4, num_stages=3,
                    shared=gpu.max_shared, regs=32, local=0, hgmma=0, hmma=0, utcmma=0, signature="")
    assert aot._problems(gpu, ok) == []
    assert ok.occupancy(gpu) == pytest.approx(4 / 64)  # one 227 KB block per SM
    bad = dataclasses.replace(ok, grid=(1, 65536, 1), shared=gpu.max_shared + 1)
    assert len(aot._problems(gpu, bad)) == 2
    small = dataclasses.replace(ok, shared=0, regs=32)
    assert small.occupancy(gpu) == 1.0  # 32 registers: 64 warps fit
    assert dataclasses.replace(small, regs=255).occupancy(gpu) == pytest.approx(8 / 64)  # 255 regs: 2 blocks


def _compile_check_dump(workdir):
    return [([sys.executable, "-m", "triforce_kernels", "compile-check", "--match", "^chain_speculative_sample B=16 ",
              "--json", os.path.join(workdir, "aot.json"), "--dump", os.path.join(workdir, "dump")], _no_interpreter())]


@pytest.mark.skipif(_triton_nvidia_tools() is None, reason="triton without its NVIDIA backend (ptxas)")
@pytest.mark.background(commands=_compile_check_dump)
def test_compile_check_dump_holds_exactly_this_runs_kernels(background):
    """--dump: the PTX, cubin and TTGIR of each kernel the selected cases compiled, nothing else."""
    import json

    background.completed()
    dump = os.path.join(background.workdir, "dump")
    launches = json.loads(open(os.path.join(background.workdir, "aot.json")).read())["launches"]
    assert len(launches) == 2 and {x["kernel"] for x in launches} == {"_tree_sample_kernel"}  # with and without q
    files = sorted(os.listdir(dump))
    assert len(files) == 6, files
    assert {f.rsplit(".", 1)[1] for f in files} == {"ptx", "cubin", "ttgir"}
    assert all(f.split("-", 1)[1].startswith("_tree_sample_kernel.") for f in files)


def test_missing_requirements_lists_only_absent_packages(tmp_path):
    """scripts/_env.sh with TRIFORCE_VENV=- installs only what scripts/missing_requirements.py lists:
    packages that are not installed at all (an installed one at another version is left alone), with
    `-r` includes followed and comments skipped."""
    (tmp_path / "base.txt").write_text("numpy>=999  # installed, at another version: kept\n"
                                       "triforce-no-such-package==1.0\n")
    (tmp_path / "req.txt").write_text("# comment\n-r base.txt\n\ntorch==0.0.1\n"
                                      "another-absent-package[extra]>=2 ; python_version > '3'\n")
    r = _run([sys.executable, os.path.join(ROOT, "scripts", "missing_requirements.py"), str(tmp_path / "req.txt")])
    assert r.stdout.split("\n")[:2] == ["triforce-no-such-package==1.0",
                                        "another-absent-package[extra]>=2 ; python_version > '3'"]
    assert r.stdout.strip().count("\n") == 1


_STATIC_LIBSTDCXX_PROBE = r'''
import sys, torch
from torch.utils.cpp_extension import load_inline
sys.path.insert(0, sys.argv[2])
from triforce_kernels._link_flags import libstdcxx_link_flags
src = """
#include <torch/extension.h>
torch::Tensor check(const torch::Tensor& x) { TORCH_CHECK(x.dim() == 7, "want 7 dims, got ", x.dim()); return x; }
TORCH_LIBRARY(triforce_static_libstdcxx_probe, m) { m.def("check(Tensor x) -> Tensor"); m.impl("check", torch::kCPU, &check); }
"""
# the compiler of the GPU image links libstdc++ statically; -static-libstdc++ does the same here
load_inline(name="triforce_static_libstdcxx_probe", cpp_sources=[src], is_python_module=False,
            extra_ldflags=["-static-libstdc++", *libstdcxx_link_flags()], build_directory=sys.argv[1])
try:
    torch.ops.triforce_static_libstdcxx_probe.check(torch.zeros(2))
except RuntimeError as e:
    print("raised:", str(e).splitlines()[0])
'''


def _static_libstdcxx_probe(workdir):
    return [([sys.executable, "-c", _STATIC_LIBSTDCXX_PROBE, workdir, ROOT], {})]


@pytest.mark.skipif(not sys.platform.startswith("linux") or shutil.which("c++") is None,
                    reason="the libstdc++ link flags are for Linux builds")
@pytest.mark.background(commands=_static_libstdcxx_probe)
def test_static_libstdcxx_compiler_still_formats_error_numbers(background):
    """A compiler that links libstdc++ statically (the GPU image's did) gave the extension its own,
    exported copy, whose iostreams used torch's locale facets with their own ids: an argument check's
    message lost its number here and crashed the process there. With the extension's link flags
    (triforce_kernels/_link_flags.py) a one-op extension built with -static-libstdc++ raises the whole
    message. The probe runs in a subprocess, so a crash fails this test rather than the run."""
    r = background.completed()[0]
    assert r.stdout.strip().splitlines()[-1] == "raised: want 7 dims, got 1", r.stdout


@pytest.mark.skipif(shutil.which("nm") is None or not sys.platform.startswith("linux"), reason="needs nm")
def test_extension_exports_no_libstdcxx_code():
    """The built extension exports none of libstdc++'s stream code: it uses the process's libstdc++.so,
    or (a compiler that links it statically, as the GPU image's does) a private copy. An exported copy
    is the configuration in which error messages lost their numbers or crashed."""
    from triforce_kernels import _C  # noqa: F401  (loads the extension)
    so = sys.modules["triforce_kernels._C"].__file__
    exported = _run(["nm", "-D", "--defined-only", so]).stdout
    assert "_ZNSo9_M_insert" not in exported, "the extension exports its own std::ostream code"


def test_unfinished_tests_lists_what_a_cut_off_run_did_not_finish(tmp_path):
    """scripts/unfinished_tests.py (gpu_check.sh's `rest` stage): the collected ids minus those a -v log
    reports an outcome for, in both pytest-xdist's form and the plain one, ids with spaces included."""
    ids = _run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                "tests/test_tree_mask.py"], cwd=ROOT).stdout
    ids = [x for x in ids.splitlines() if "::" in x]
    spaced = next(x for x in ids if " " in x)  # a parameter id with spaces
    log = tmp_path / "tests.log"
    log.write_text(f"[gw3] [ 12%] PASSED {ids[0]} \n{ids[1]} FAILED [ 50%]\n[gw0] [ 99%] ERROR {spaced} \n"
                   f"FAILED {ids[2]} - AssertionError: the summary line, not an outcome\n")
    r = _run([sys.executable, os.path.join(ROOT, "scripts", "unfinished_tests.py"), str(log),
              str(tmp_path / "absent.log"), "--", "tests/test_tree_mask.py"], cwd=ROOT)
    assert r.stdout.splitlines() == [x for x in ids if x not in (ids[0], ids[1], spaced)]
