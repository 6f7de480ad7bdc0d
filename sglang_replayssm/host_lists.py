"""Host lists (index and length lists the scheduler computes in Python) as device tensors without a
stream sync.

``torch.tensor(values, device="cuda")`` copies from pageable memory and blocks the host until the
current stream has run everything queued before it: inside an eager prefill that stalls the launch
pipeline once per call. :func:`on_device` stages the values in pinned memory and copies them
asynchronously on the current stream (the caching host allocator keeps the staging buffer alive until
the copy ran); off CUDA it is a plain tensor.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["on_device"]


def on_device(values: Sequence[int] | Sequence[bool], dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
    """``values`` as a 1-D ``dtype`` tensor on ``device``, queued on the current stream (no host sync)."""
    device = torch.device(device)
    if device.type != "cuda":
        return torch.tensor(values, dtype=dtype, device=device)
    return torch.tensor(values, dtype=dtype, pin_memory=True).to(device, non_blocking=True)
