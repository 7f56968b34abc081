"""Access to hoccl's CUDA pieces (driver loader, copy-path choice, reduction kernel, test hooks).

They are bound into the compiled core `hoccl_backend._C` (cuda/python/cuda_bindings.cpp), on
CPU-only builds too: there they report that CUDA is not compiled in.
"""
from __future__ import annotations

from types import ModuleType

_cached: ModuleType | None = None


def cuda_module() -> ModuleType:
    """Returns the module that has `cuda_driver_status`, `ce_choose_path`, `reduce_kernel_info`..."""
    global _cached
    if _cached is not None:
        return _cached
    import torch  # noqa: F401  (the extension needs libtorch loaded first)

    from hoccl_backend import _C

    if not hasattr(_C, "cuda_driver_status"):
        raise ImportError(f"{_C.__file__} has no CUDA bindings: rebuild hoccl (bash scripts/install.sh)")
    _cached = _C
    return _C


def built_with_cuda() -> bool:
    """True when cuda.h was found at build time (the CUDA pieces are compiled in)."""
    from hoccl_backend import _C

    return bool(getattr(_C, "built_with_cuda", False))
