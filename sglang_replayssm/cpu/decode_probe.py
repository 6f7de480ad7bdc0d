"""The CPU decode paths' trace switch: which kernel ran, and what a ring decode step did to its slot.

The writer is product code because it runs inside the server process (the scheduler), which imports
only the product; tests read the files (``tests/support/decode_trace.py``). Off unless
``SGLANG_REPLAYSSM_RING_TRACE=<prefix>`` is set in the process's environment; read once at import.
Off, ``PROBE`` is None and a decode step pays one ``is None`` check. On, each process (one per TP
rank: the scheduler) appends JSON lines to its own file ``<prefix>.<pid>.jsonl``:

* ``{"kernel": "gdn"|"kda", "ring": bool, "rows": n}``: one line per packed decode call (every layer);
* ``{"slot", "write_pos", "checkpoint_written", "record_written"}``: one line per live row of each ring
  decode step of the first GDN layer seen, i.e. what the step did to that slot's pool contents.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from sglang_replayssm import settings

#: The environment switch (a path prefix); tests set it for the server they start.
TRACE_ENV = settings.RING_TRACE.name


class RingProbe:
    """Writes this process's trace lines to ``<prefix>.<pid>.jsonl``."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self._layer: int | None = None  # data_ptr of the one layer whose pool contents are traced
        self._before: tuple[torch.Tensor, torch.Tensor] | None = None

    @property
    def path(self) -> Path:
        """This process's file (the pid is taken at write time, so a forked child writes its own)."""
        return Path(f"{self.prefix}.{os.getpid()}.jsonl")

    def _write(self, records: list[dict]) -> None:
        with open(self.path, "a") as f:
            f.writelines(json.dumps(r) + "\n" for r in records)

    def call(self, kernel: str, ring: bool, rows: int) -> None:
        self._write([{"kernel": kernel, "ring": ring, "rows": rows}])

    def before_ring_step(self, ssm_states: torch.Tensor, d: torch.Tensor, cache_indices: torch.Tensor,
                         wp: torch.Tensor) -> None:
        """Snapshot the live rows' checkpoint [HV,V,K] and the record slot the step may write."""
        if self._layer not in (None, ssm_states.data_ptr()):
            self._before = None
            return
        self._layer = ssm_states.data_ptr()
        live = cache_indices.long().clamp(min=0)
        self._before = (ssm_states[live].clone(), d[live, :, wp.long()].clone())

    def after_ring_step(self, ssm_states: torch.Tensor, d: torch.Tensor, cache_indices: torch.Tensor,
                        wp: torch.Tensor) -> None:
        if self._before is None:
            return
        before_state, before_d = self._before
        rows = (cache_indices.long() >= 0).nonzero().flatten().tolist()
        records = []
        for r in rows:
            slot, m = int(cache_indices[r]), int(wp[r])
            records.append({
                "slot": slot,
                "write_pos": m,
                "checkpoint_written": not torch.equal(ssm_states[slot], before_state[r]),
                "record_written": not torch.equal(d[slot, :, m], before_d[r]),
            })
        self._write(records)
        self._before = None


def _from_env() -> RingProbe | None:
    prefix = settings.RING_TRACE.value()
    return RingProbe(prefix) if prefix else None


#: This process's probe, or None (the default: no trace, no counting).
PROBE: RingProbe | None = _from_env()
