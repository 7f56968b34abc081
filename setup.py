"""Build hoccl: the C++ core `hoccl_backend._C` and VarioPath's online scheduler.

Built against the torch already installed:  pip install --no-build-isolation -e .
Only torch's bundled pybind11 headers are used (a newer pip pybind11 breaks the
c10d::Backend base-class binding).
"""
import glob
import os
import subprocess
import sys
import sysconfig

from setuptools import find_packages, setup

# Building must not load backends that torch autoloads at import: a stale editable install of
# hoccl itself (its directory since removed) would make `import torch` fail here, and reinstalling
# is how a user repairs exactly that.
os.environ["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
from torch.utils.cpp_extension import BuildExtension, CppExtension

HERE = os.path.dirname(os.path.abspath(__file__))
CXX_FLAGS = ["-O3", "-std=c++17", "-fvisibility=hidden", "-Wno-unused-parameter"]


def core_sources():
    """Every C++ file of the core, VarioPath's scheduler and its bindings included (compiled once)."""
    return sorted(glob.glob(os.path.join("cuda", "**", "*.cpp"), recursive=True))


def cuda_defines():
    """Compile the CUDA pieces in when cuda.h exists; they dlopen the driver at run time."""
    for root in (os.environ.get("CUDA_HOME"), "/usr/local/cuda", "/usr"):
        if root and os.path.exists(os.path.join(root, "include", "cuda.h")):
            return [("HOCCL_WITH_CUDA", "1")], [os.path.join(root, "include")]
    return [], []


def reduce_kernel_sources(with_cuda):
    """nvcc-compiles cuda/transport/ce/kernels/reduce.cu into an embedded-fatbin C++ source (none without nvcc:
    then the GPU reduction kernel is unavailable and HOCCL_REDUCE_ON=host is the only option)."""
    if not with_cuda or os.environ.get("HOCCL_NO_NVCC"):
        return []
    out = os.path.join("build", "generated", "reduce_fatbin.cpp")
    rc = subprocess.call([sys.executable, os.path.join(HERE, "scripts", "embed_kernel.py"), "--out", out])
    return [out] if rc == 0 and os.path.exists(out) else []


macros, cuda_includes = cuda_defines()
kernel_sources = reduce_kernel_sources(bool(macros))

ext_modules = [
    CppExtension(
        "hoccl_backend._C",
        core_sources() + kernel_sources,
        include_dirs=[os.path.join(HERE, "cuda")] + cuda_includes,
        define_macros=macros,
        extra_compile_args=CXX_FLAGS,
        extra_link_args=["-ldl", "-lrt"],
    ),
]


class BuildInKeptDirectory(BuildExtension):
    """Compiles into build/temp.* under the source tree whatever the front end asks for.

    pip's editable install (setuptools' editable_wheel) points build_temp at a directory it
    deletes afterwards, so every `pip install -e .` recompiled all of the core (about 7 minutes
    on 2 cores); kept here, ninja rebuilds only what changed, as `setup.py build_ext --inplace`
    does with the same directory.
    """

    def finalize_options(self):
        super().finalize_options()
        tag = f"{sysconfig.get_platform()}-{sys.implementation.cache_tag}"
        self.build_temp = os.path.join(HERE, "build", f"temp.{tag}")


# Name, version, packages, dependencies and the torch.backends entry point are in pyproject.toml.
setup(
    ext_modules=ext_modules,
    cmdclass={"build_ext": BuildInKeptDirectory.with_options(use_ninja=True)},
)
