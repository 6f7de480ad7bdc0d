"""Host lists (index and length lists the scheduler computes in Python) as device tensors without a
stream sync.

``torch.tensor(values, device="cuda")`` copies from pageable memory and blocks the host until the
current stream has run everything queued before it: inside an eager prefill that stalls the launch
pipeline once per call. :func:`on_device` stages the values in pinned memory and copies them
asynchronously on the current stream (the caching host allocator keeps the staging buffer alive until
the copy ran); off CUDA it is a plain tensor. :func:`on_device_many` moves several lists in one copy.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["on_device", "on_device_many"]


def on_device(values: Sequence[int] | Sequence[bool], dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
    """``values`` as a 1-D ``dtype`` tensor on ``device``, queued on the current stream (no host sync)."""
    device = torch.device(device)
    if device.type != "cuda":
        return torch.tensor(values, dtype=dtype, device=device)
    return torch.tensor(values, dtype=dtype, pin_memory=True).to(device, non_blocking=True)


#: One host list and the dtype it takes on the device.
HostList = tuple[Sequence[int] | Sequence[bool], torch.dtype]
#: Each list's bytes start at a multiple of this in :func:`on_device_many`'s buffer: any dtype's view is aligned, and
#: Triton specializes a pointer argument on 16-byte divisibility (another alignment would compile another variant).
ALIGN = 16


def packed(lists: Sequence[HostList]) -> tuple[torch.Tensor, list[tuple[int, int, torch.dtype]]]:
    """``lists`` (``(values, dtype)`` each) as one host byte buffer, every list's bytes at an :data:`ALIGN`-aligned
    offset, and each list's ``(offset, length, dtype)``."""
    parts: list[torch.Tensor] = []
    where: list[tuple[int, int, torch.dtype]] = []
    at = 0
    for values, dtype in lists:
        raw = torch.tensor(values, dtype=dtype).view(torch.uint8)
        where.append((at, len(values), dtype))
        parts.append(raw)
        pad = -raw.numel() % ALIGN
        if pad:
            parts.append(torch.zeros(pad, dtype=torch.uint8))
        at += raw.numel() + pad
    return (torch.cat(parts) if parts else torch.zeros(0, dtype=torch.uint8)), where


def unpacked(buffer: torch.Tensor, where: list[tuple[int, int, torch.dtype]]) -> list[torch.Tensor]:
    """The lists of :func:`packed`'s ``buffer`` (wherever it now is) as views of it, in their dtypes."""
    return [buffer[at:at + n * dtype.itemsize].view(dtype) for at, n, dtype in where]


def on_device_many(lists: Sequence[HostList], device: torch.device | str) -> list[torch.Tensor]:
    """Each ``(values, dtype)`` of ``lists`` as :func:`on_device` would give it; on CUDA all of them in one pinned
    buffer and one copy (views of it, no conversion)."""
    device = torch.device(device)
    if device.type != "cuda":
        return [torch.tensor(values, dtype=dtype, device=device) for values, dtype in lists]
    buffer, where = packed(lists)
    return unpacked(buffer.pin_memory().to(device, non_blocking=True), where)
