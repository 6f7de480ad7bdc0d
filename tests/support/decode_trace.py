"""Reading the CPU decode trace (``sglang_replayssm.cpu.decode_probe``, switched on by its ``TRACE_ENV``)."""

from __future__ import annotations

import os
from pathlib import Path


def trace_files(prefix: str | os.PathLike[str]) -> list[Path]:
    """The per-process trace files a run with ``TRACE_ENV=prefix`` wrote, sorted by name."""
    p = Path(prefix)
    return sorted(p.parent.glob(f"{p.name}.*.jsonl"))
