"""Whether this process can load the CUDA driver library (the one fact the CPU runtime's switches read)."""

from __future__ import annotations

import ctypes


def libcuda_loadable() -> bool:
    """True when the CUDA driver library can be loaded (a GPU machine): the real sgl_kernel is used."""
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    return True
