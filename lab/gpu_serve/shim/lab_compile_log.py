"""Lab GPU machine only: a log of Triton JIT compiles. With LAB_COMPILE_LOG=<path>, every variant a Triton JIT
function builds in this process (compiled, or loaded from the disk cache into memory) appends one line to
``<path>.<pid>.txt``: seconds since the process started, milliseconds it took, the kernel's name, the wall clock (Unix
seconds). In a server, a line after its startup is a step the scheduler waited on (a variant no warm-up built):
:func:`serving_compiles` reads them for a time window (``serve_check.py``, per arm from health to its last stage)."""

from __future__ import annotations

import glob
import os
import time
from typing import Any

_T0 = time.monotonic()
_STARTED: dict[Any, float] = {}


def _name(kwargs: dict[str, Any]) -> str:
    """The kernel's name: the hook's ``fn`` (module and name), else its ``repr`` up to the launch options."""
    fn = kwargs.get("fn")
    name = getattr(fn, "name", None)
    return f"{getattr(fn, 'module', '')}.{name}" if name else str(kwargs.get("repr", "?")).split("[")[0]


def install() -> None:
    path = os.environ.get("LAB_COMPILE_LOG", "")
    if not path:
        return
    from triton import knobs

    out = f"{path}.{os.getpid()}.txt"

    def before(*args: Any, **kwargs: Any) -> bool:
        _STARTED[id(kwargs.get("key"))] = time.monotonic()
        return False  # never skips the compile

    def after(*args: Any, **kwargs: Any) -> None:
        now = time.monotonic()
        took = now - _STARTED.pop(id(kwargs.get("key")), now)
        with open(out, "a") as f:
            f.write(f"{now - _T0:.2f}\t{1e3 * took:.1f}\t{_name(kwargs)}\t{time.time():.3f}\n")

    knobs.runtime.jit_cache_hook = before
    knobs.runtime.jit_post_compile_hook = after


def serving_compiles(path: str, t0: float, t1: float, min_ms: float = 20.0) -> dict[str, list[list[Any]]]:
    """The variants built between wall times ``t0`` and ``t1`` that took at least ``min_ms`` (a disk-cache load takes
    1-10 ms), from every process's ``<path>.<pid>.txt``: ``{"ours": [[ms, kernel], ...], "sglang": [...]}``, ours
    being the plugin's kernels (``sglang_replayssm.``), the rest SGLang's and its libraries'."""
    out: dict[str, list[list[Any]]] = {"ours": [], "sglang": []}
    for name in sorted(glob.glob(f"{path}.*.txt")):
        with open(name) as f:
            for line in f:
                cols = line.rstrip("\n").split("\t")
                if len(cols) < 4 or not t0 <= float(cols[3]) <= t1 or float(cols[1]) < min_ms:
                    continue
                out["ours" if cols[2].startswith("sglang_replayssm.") else "sglang"].append([float(cols[1]), cols[2]])
    return out
