"""The low-precision read copy of an fp32 checkpoint: its formats, writing it, reading it back.

A read copy holds, per pool slot, the checkpoint ``S`` ``[HV, V, K]`` (K contiguous, SGLang's
``MambaPool.temporal`` layout) in one of two formats:

* ``"bf16"``: ``copy = S.to(bfloat16)``, no scales (``scales is None``).
* ``"fp8"``: ``copy = (S / scale).to(float8_e4m3fn)`` with fp32 scales ``amax / 448`` (448 is
  e4m3's largest finite value), so every element is within range and the largest one of each
  group is represented at full relative precision (3 mantissa bits: relative error <= 2**-4).
  Groups are V rows, for GDN and KDA alike (``scales`` ``[slots, HV, V]``, the amax over K).
  Chosen by measurement (notes/read-copy.md): for KDA, whose per-channel decays make K columns
  differ by orders of magnitude, per-K-column scales gave no better state or read-out error
  (e4m3 keeps ~2**17 of range inside a group, so the axis only decides which tiny elements go
  subnormal), and per-row scales stay local to a kernel's row chunk, so a flush can write its
  rows' copy without first reducing over all ``V`` rows. An all-zero group gets scale 1.

Invariant: the copy is a pure function of the fp32 checkpoint it was written from (written at
every flush and whenever a slot enters use); nothing ever writes the checkpoint from the copy.
"""

from __future__ import annotations

from typing import Literal

import torch

__all__ = ["COPY_DTYPES", "FP8_MAX", "CopyFormat", "alloc_read_copy", "dequantize", "quantize", "refresh_slots"]

CopyFormat = Literal["bf16", "fp8"]
#: Storage dtype of each format.
COPY_DTYPES: dict[str, torch.dtype] = {"bf16": torch.bfloat16, "fp8": torch.float8_e4m3fn}
#: Largest finite float8_e4m3fn value.
FP8_MAX = 448.0


def _scale_dim(is_kda: bool) -> int:
    """The axis an fp8 scale reduces over in ``[..., HV, V, K]``: K (-1), one scale per V row (both models)."""
    del is_kda
    return -1


def quantize(state: torch.Tensor, fmt: CopyFormat, is_kda: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``state`` ``[..., HV, V, K]`` (fp32) -> ``(copy, scales)``: see the module docstring.

    ``scales``: None for bf16; fp32 ``[..., HV, V]`` for fp8.
    """
    s = state.to(torch.float32)
    if fmt == "bf16":
        return s.to(torch.bfloat16), None
    if fmt != "fp8":
        raise ValueError(f"unknown read-copy format {fmt!r} (bf16 or fp8)")
    dim = _scale_dim(is_kda)
    amax = s.abs().amax(dim=dim)
    scales = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
    q = (s / scales.unsqueeze(dim)).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return q, scales


def dequantize(copy: torch.Tensor, scales: torch.Tensor | None, is_kda: bool) -> torch.Tensor:
    """The fp32 state a copy represents (``copy * scales`` broadcast over the scaled axis)."""
    x = copy.to(torch.float32)
    if scales is None:
        return x
    return x * scales.to(torch.float32).unsqueeze(_scale_dim(is_kda))


def alloc_read_copy(
    num_slots: int, HV: int, V: int, K: int, fmt: CopyFormat, is_kda: bool, device: torch.device | str | None = None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Zeroed ``(copy [num_slots, HV, V, K], scales)`` buffers of a format (scales of 1 for fp8), on
    ``device`` (None: torch's default device)."""
    copy = torch.zeros(num_slots, HV, V, K, dtype=COPY_DTYPES[fmt], device=device)
    if fmt == "bf16":
        return copy, None
    return copy, torch.ones(num_slots, HV, V, dtype=torch.float32, device=device)


def refresh_slots(
    state: torch.Tensor, copy: torch.Tensor, scales: torch.Tensor | None, slots: torch.Tensor, is_kda: bool
) -> None:
    """Rewrite the copy of ``slots`` (int, any shape) from the fp32 checkpoints ``state[slots]``, in place."""
    fmt: CopyFormat = "bf16" if scales is None else "fp8"
    idx = slots.to(torch.long).flatten()
    q, sc = quantize(state[idx], fmt, is_kda)
    copy[idx] = q
    if scales is not None:
        assert sc is not None
        scales[idx] = sc
