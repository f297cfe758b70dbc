"""Build checks: the torch-free C++ kernels build and pass their unit tests with CMake (ctest), and
when nvcc is present, the CUDA sources compile for sm_90 -- no GPU needed."""
import glob
import os
import shutil
import subprocess
import sys
import sysconfig

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(cmd, **kw):
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    assert r.returncode == 0, f"{' '.join(cmd)} failed:\n{r.stdout[-4000:]}\n{r.stderr[-4000:]}"
    return r


@pytest.mark.skipif(shutil.which("cmake") is None, reason="cmake not installed")
def test_cmake_build_and_ctest(tmp_path):
    _run(["cmake", "-S", ROOT, "-B", str(tmp_path), "-DCMAKE_BUILD_TYPE=Release"])
    _run(["cmake", "--build", str(tmp_path), "-j", "2"])
    r = _run(["ctest", "--test-dir", str(tmp_path), "--output-on-failure"])
    assert "tests passed" in r.stdout


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not found")
@pytest.mark.parametrize("src", sorted(glob.glob(os.path.join(ROOT, "csrc", "cuda", "*.cu"))) or [None])
def test_cuda_launchers_compile_for_sm90(src, tmp_path):
    """The torch launchers in csrc/cuda compile for sm_90 against this torch's headers (the CPU
    wheel ships the CUDA headers too). Compile only: nothing runs."""
    if src is None:
        pytest.skip("no CUDA launchers yet")
    tinc = os.path.join(os.path.dirname(torch.__file__), "include")
    cmd = ["nvcc", "-std=c++17", "-c", src, "-o", str(tmp_path / "x.o"), "-arch=sm_90",
           "-DTRIFORCE_WITH_CUDA", f"-I{ROOT}/csrc/include", f"-I{ROOT}/csrc", f"-I{tinc}",
           f"-I{tinc}/torch/csrc/api/include", f"-I{sysconfig.get_paths()['include']}",
           "-D_GLIBCXX_USE_CXX11_ABI=1", "--expt-relaxed-constexpr"]
    _run(cmd)
