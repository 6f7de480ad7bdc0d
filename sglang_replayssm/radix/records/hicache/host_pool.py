"""The host record pool: a node's records in host memory, keyed by host KV index (HiCache).

:class:`HostRecords` is the device record pool's first-in-first-out design in host memory (pinned on
CUDA): ``slot_of[host_kv]`` -> row or ``-1``, ``owner[row]`` -> host KV index, ``seq[row]`` the
sequence number of the copy that wrote the row, ``valid[row]`` whether that copy completed with a
record; per linear layer the same three record tensors as the device pool. Capacity
``SGLANG_REPLAYSSM_HOST_RECORD_TOKENS`` (default the device pool's). The transfers that fill and read
it: :mod:`host_records`.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

import torch

from sglang_replayssm import settings

__all__ = ["HOST_CAPACITY_ENV", "HostRecords", "host_capacity_from_env", "host_runs"]

#: Host record-pool capacity in tokens (``0``: records are not backed up); default the device pool's.
HOST_CAPACITY_ENV = settings.HOST_RECORD_TOKENS.name


def host_capacity_from_env(default: int, host_kv: int) -> int:
    """``SGLANG_REPLAYSSM_HOST_RECORD_TOKENS`` if set, else ``default``; at most ``host_kv``."""
    value = settings.HOST_RECORD_TOKENS.value()
    return min(default if value is None else value, host_kv)


def host_runs(start: int, n: int, capacity: int) -> list[tuple[int, int, int]]:
    """``(offset, lo, hi)``: the first-in-first-out slots ``start .. start + n`` (mod ``capacity``)
    as contiguous host row ranges, ``offset`` the first token of each."""
    first = min(n, capacity - start)
    runs = [(0, start, start + first)]
    if first < n:
        runs.append((first, 0, n - first))
    return runs


@dataclass
class HostRecords:
    """Records keyed by host KV index, in host memory (see the module docstring).

    ``slot_of [host KV + 1]``, ``owner [R + 1]`` as :class:`records.RecordPool`; ``seq [R + 1]``: the
    backup copy that wrote the row; ``valid [R + 1]``: the device token had a record (written by that
    copy). Rows are usable once ``seq <= done`` (the copy's event completed, :meth:`poll`).
    """

    kv_size: int
    capacity: int
    pin: bool
    slot_of: torch.Tensor = field(init=False, repr=False)
    owner: torch.Tensor = field(init=False, repr=False)
    seq: torch.Tensor = field(init=False, repr=False)
    valid: torch.Tensor = field(init=False, repr=False)
    head: int = 0
    layers: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = field(default_factory=dict, repr=False)
    next_seq: int = 1
    done: int = 0
    events: deque[tuple[int, Any]] = field(default_factory=deque, repr=False)
    backed_up: int = 0  # tokens copied to host (with or without a record)
    restored: int = 0  # tokens whose records came back to the device
    missed: int = 0  # loaded tokens without a usable host record

    def __post_init__(self) -> None:
        if self.capacity < 1:
            raise ValueError(f"host record capacity must be >= 1 token, got {self.capacity}")
        self.slot_of = torch.full((self.kv_size + 1,), -1, dtype=torch.int64)
        self.owner = torch.full((self.capacity + 1,), -1, dtype=torch.int64)
        self.seq = torch.full((self.capacity + 1,), 1 << 62, dtype=torch.int64)
        self.valid = torch.zeros(self.capacity + 1, dtype=torch.bool, pin_memory=self.pin)

    def invalidate(self, host_kv: torch.Tensor) -> None:
        """Host KV indices SGLang hands out again carry no host record."""
        if host_kv.numel():
            self.slot_of[host_kv.reshape(-1).to("cpu", torch.int64)] = -1

    def assign(self, host_kv: torch.Tensor) -> int:
        """Host rows for ``host_kv`` (its last ``capacity`` entries), oldest first; returns the first
        row (the rows are ``first .. first + n`` mod the capacity, :func:`_runs`)."""
        n = host_kv.numel()
        start = self.head
        rows = (start + torch.arange(n)) % self.capacity
        old = self.owner[rows]
        held = (old >= 0) & (self.slot_of[old.clamp(min=0)] == rows)
        self.slot_of[torch.where(held, old, self.kv_size)] = -1
        self.slot_of[host_kv] = rows
        self.owner[rows] = host_kv
        self.seq[rows] = self.next_seq
        self.head = (start + n) % self.capacity
        return start

    def poll(self) -> None:
        """Retire the backup copies whose events completed (never waits)."""
        while self.events and (self.events[0][1] is None or self.events[0][1].query()):
            self.done = self.events.popleft()[0]

    def layer(self, layer_id: int, like: tuple[torch.Tensor, torch.Tensor, torch.Tensor]
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        rows = self.layers.get(layer_id)
        if rows is None:
            rows = self.layers[layer_id] = tuple(  # type: ignore[assignment]
                torch.empty((self.capacity + 1, t.shape[1]), dtype=t.dtype, pin_memory=self.pin) for t in like)
        return rows  # type: ignore[return-value]

    @property
    def nbytes(self) -> int:
        maps = (self.slot_of.numel() + self.owner.numel() + self.seq.numel()) * 8 + self.valid.numel()
        return maps + sum(t.numel() * t.element_size() for rows in self.layers.values() for t in rows)
