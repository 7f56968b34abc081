"""Build the C++ scheduler module ``varipath._scheduler`` in place, without the core backend.

``pip install --no-build-isolation -e .`` builds it together with ``hoccl_backend._C``; this
helper (``python -m varipath._build``) compiles only VarioPath's files, which is handy while
the core is being edited.  :func:`load_scheduler` imports the built module, or JIT-compiles the
same sources with ``torch.utils.cpp_extension.load`` when no built module is present.
"""
from __future__ import annotations

import glob
import os
import sys
from types import ModuleType

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SOURCES = sorted(glob.glob(os.path.join(ROOT, "cuda", "varipath", "**", "*.cpp"), recursive=True)) + [
    os.path.join(ROOT, "cuda", "python", "varipath_bindings.cpp")]
FLAGS = ["-O3", "-std=c++17", "-fvisibility=hidden", "-Wno-unused-parameter"]


def build_inplace() -> None:
    """Compile ``varipath/_scheduler*.so`` next to this file."""
    import torch  # noqa: F401  (torch's bundled pybind11 headers)
    from setuptools import setup
    from torch.utils.cpp_extension import BuildExtension, CppExtension

    ext = CppExtension("varipath._scheduler", [os.path.relpath(s, ROOT) for s in SOURCES],
                       include_dirs=[os.path.join(ROOT, "cuda")], extra_compile_args=FLAGS)
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        setup(name="varipath-scheduler", ext_modules=[ext], cmdclass={"build_ext": BuildExtension},
              script_args=["build_ext", "--inplace"])
    finally:
        os.chdir(cwd)


def load_scheduler() -> ModuleType:
    """The compiled scheduler module (built, else JIT-compiled once and cached by torch)."""
    import torch  # noqa: F401  (loads libc10/libtorch the module links against)

    try:
        from . import _scheduler  # type: ignore[attr-defined]
        return _scheduler
    except ImportError:
        pass
    if len(SOURCES) < 2 or not all(os.path.exists(s) for s in SOURCES):
        raise ImportError("varipath._scheduler is not built and cuda/varipath/*.cpp are not available; "
                          "run: pip install --no-build-isolation -e .")
    from torch.utils.cpp_extension import load

    return load(name="varipath_sched_jit", sources=SOURCES, extra_cflags=FLAGS[:2],
                extra_include_paths=[os.path.join(ROOT, "cuda")], verbose=False)


if __name__ == "__main__":
    build_inplace()
    sys.exit(0)
