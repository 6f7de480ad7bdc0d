"""Lab GPU machine only: a census of host syncs. With LAB_SYNC_DEBUG=<path>, every synchronizing CUDA call
(``torch.cuda.set_sync_debug_mode("warn")``) is counted by its call stack (the innermost frames of SGLang and
of this package) and the counts are written to ``<path>.<pid>.txt`` (every 100 syncs and at exit), most
frequent first. Timing under it means nothing; it says where a step waits for the GPU."""

from __future__ import annotations

import atexit
import collections
import os
import traceback
import warnings

_COUNTS: collections.Counter[str] = collections.Counter()
_PATH = ""


def _dump() -> None:
    if not _COUNTS:
        return
    with open(f"{_PATH}.{os.getpid()}.txt", "w") as f:
        for key, n in _COUNTS.most_common():
            f.write(f"{n}\t{key}\n")


def _show(message, category, filename, lineno, file=None, line=None):  # type: ignore[no-untyped-def]
    if "synchroniz" not in str(message):
        return _ORIG(message, category, filename, lineno, file, line)
    frames = [f for f in traceback.extract_stack()[:-1]
              if "sglang_replayssm" in f.filename or "/sglang/" in f.filename]
    key = " <- ".join(f"{f.filename.split('site-packages/')[-1].split('/work/')[-1]}:{f.lineno}:{f.name}"
                      for f in reversed(frames[-8:]))
    _COUNTS[key or f"{filename}:{lineno}"] += 1
    if sum(_COUNTS.values()) % 100 == 0:
        _dump()
    return None


_ORIG = warnings.showwarning


def install() -> None:
    global _PATH
    _PATH = os.environ.get("LAB_SYNC_DEBUG", "")
    if not _PATH:
        return
    import torch

    warnings.showwarning = _show
    warnings.filterwarnings("always", message=".*synchroniz.*")
    torch.cuda._lazy_call(lambda: torch._C._cuda_set_sync_debug_mode(1))  # "warn", once CUDA initialises
    atexit.register(_dump)
