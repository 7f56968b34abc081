"""Where VarioPath's C++ scheduler lives: the submodule ``varipath`` of the core extension
``hoccl_backend._C``.

The scheduler is compiled once, into the core, so that :func:`varipath.schedule` and the
backend's ``all_to_all`` run the same code (the backend plans with the very ``Scheduler`` that
:func:`varipath.scheduler_for` returns).  Build it with ``pip install --no-build-isolation -e .``.
"""
from __future__ import annotations

from types import ModuleType


def load_scheduler() -> ModuleType:
    """The compiled scheduler module, ``hoccl_backend._C.varipath``."""
    import torch  # noqa: F401  (loads libc10/libtorch the extension links against)

    try:
        from hoccl_backend import _C
    except ImportError as e:
        raise ImportError("VarioPath's scheduler is part of hoccl_backend._C, which is not built; "
                          "run: pip install --no-build-isolation -e .") from e
    return _C.varipath
