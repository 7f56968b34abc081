"""Access to hoccl's CUDA pieces (driver loader, copy-path choice, reduction kernel, test hooks).

They live in the compiled core `hoccl_backend._C`. Until the core's bindings call `bindCuda(m)`,
the same shared object exports them as a second module init (`_C_cuda`), loaded here from _C's
file; afterwards `_C` itself has them and is returned.
"""
from __future__ import annotations

import importlib.machinery
import importlib.util
from types import ModuleType

_cached: ModuleType | None = None


def cuda_module() -> ModuleType:
    """Returns the module that has `cuda_driver_status`, `ce_choose_path`, `reduce_kernel_info`..."""
    global _cached
    if _cached is not None:
        return _cached
    import torch  # noqa: F401  (the extension needs libtorch loaded first)

    from hoccl_backend import _C

    if hasattr(_C, "cuda_driver_status"):
        _cached = _C
        return _C
    name = "hoccl_backend._C_cuda"
    loader = importlib.machinery.ExtensionFileLoader(name, _C.__file__)
    spec = importlib.util.spec_from_file_location(name, _C.__file__, loader=loader)
    if spec is None:
        raise ImportError(f"cannot load {name} from {_C.__file__}")
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    _cached = mod
    return mod


def built_with_cuda() -> bool:
    """True when cuda.h was found at build time (the CUDA pieces are compiled in)."""
    from hoccl_backend import _C

    return bool(getattr(_C, "built_with_cuda", False))
