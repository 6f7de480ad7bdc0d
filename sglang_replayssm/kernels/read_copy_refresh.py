"""Refresh the read copy of stale slots from their fp32 checkpoints, before a decode step reads it.

Contract, for a batch of ``B`` decode rows with pool slots ``slots`` (``-1`` = padding), one layer:

* ``state`` ``[num_slots, HV, V, K]`` fp32 (the checkpoint), ``copy`` ``[num_slots, HV, V, K]``
  (bf16, or e4m3 with ``scales`` ``[num_slots, HV, V]`` fp32; :mod:`.read_copy_format`),
  ``stale`` ``[num_slots]`` bool;
* for every row with ``slots[n] >= 0`` and ``stale[slots[n]]``: ``copy[slot]`` (and ``scales[slot]``)
  become :func:`.read_copy_format.quantize` of ``state[slot]`` and ``stale[slot]`` becomes False;
  every other slot, flag and padding row is untouched. Valid rows have distinct slots.

Twins of this contract:

* :func:`refresh_stale_torch`: tensor ops with one host read of the stale rows (the CPU runtime,
  and the reference);
* :func:`refresh_stale_triton`: one launch, one program per row (a program refreshes its row's
  ``HV x V`` rows tile by tile, then clears the flag itself, so no other program reads a flag it
  cleared), no host sync, so a decode step stays capturable in a CUDA graph. Needs a device Triton
  runs on (or ``TRITON_INTERPRET=1``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .read_copy_format import refresh_slots

__all__ = ["check_refresh_args", "refresh_stale", "refresh_stale_torch", "refresh_stale_triton"]


def check_refresh_args(state: torch.Tensor, copy: torch.Tensor, scales: torch.Tensor | None, stale: torch.Tensor,
                       slots: torch.Tensor) -> None:  # fmt: skip
    """Shapes and dtypes of the contract (one-line errors)."""
    if state.dtype != torch.float32 or state.dim() != 4:
        raise ValueError(f"state must be fp32 [slots, HV, V, K] (got {state.dtype} {tuple(state.shape)})")
    if tuple(copy.shape) != tuple(state.shape):
        raise ValueError(f"copy must be {tuple(state.shape)} (got {tuple(copy.shape)})")
    want = torch.bfloat16 if scales is None else torch.float8_e4m3fn
    if copy.dtype != want:
        raise ValueError(f"copy must be {want} {'without' if scales is None else 'with'} scales (got {copy.dtype})")
    if scales is not None and (scales.dtype != torch.float32 or tuple(scales.shape) != tuple(state.shape[:3])):
        raise ValueError(f"scales must be fp32 {tuple(state.shape[:3])} (got {scales.dtype} {tuple(scales.shape)})")
    if stale.dtype != torch.bool or tuple(stale.shape) != (state.shape[0],):
        raise ValueError(f"stale must be bool [{state.shape[0]}] (got {stale.dtype} {tuple(stale.shape)})")
    if slots.dim() != 1 or slots.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"slots must be a 1-D int32/int64 tensor (got {slots.dtype} {tuple(slots.shape)})")


def refresh_stale_torch(state: torch.Tensor, copy: torch.Tensor, scales: torch.Tensor | None, stale: torch.Tensor,
                        slots: torch.Tensor) -> None:  # fmt: skip
    """The contract with torch ops (one host read: which rows are stale)."""
    check_refresh_args(state, copy, scales, stale, slots)
    idx = slots.to(torch.long)
    idx = idx[idx >= 0]
    idx = idx[stale[idx]]
    if idx.numel():
        refresh_slots(state, copy, scales, idx, False)
        stale[idx] = False


@triton.jit
def _e4m3_rne(x):
    """fp32 ``x`` in [-448, 448] -> its float8_e4m3fn byte, round to nearest even, by integer ops
    (the interpreter's fp8 cast is not IEEE rounding): normal codes ``(e + 7) << 3 | m`` (a mantissa
    carry rolls into the exponent), subnormals ``rint(|x| * 2**9)``."""
    bits = x.to(tl.uint32, bitcast=True)
    sign = (bits >> 24) & 0x80
    a = tl.abs(x)
    ab = a.to(tl.uint32, bitcast=True)
    e = (ab >> 23).to(tl.int32) - 127
    mant = ab & 0x7FFFFF
    m = mant >> 20
    rem = mant & 0xFFFFF
    up = (rem > 0x80000) | ((rem == 0x80000) & ((m & 1) == 1))
    normal = ((e + 7) << 3).to(tl.uint32) + m + up.to(tl.uint32)
    sub = ((a * 512.0 + 8388608.0) - 8388608.0).to(tl.uint32)  # exact RNE to an integer below 2**23
    code = tl.where(e < -6, sub, normal)
    return (code | sign).to(tl.uint8)


@triton.jit
def _refresh_kernel(state, copy, scales, stale, slots, s_state, s_copy, s_scales,
                    HV: tl.constexpr, V: tl.constexpr, K: tl.constexpr, BV: tl.constexpr, FP8: tl.constexpr):  # fmt: skip
    n = tl.program_id(0)
    slot = tl.load(slots + n).to(tl.int64)
    if slot >= 0:
        if tl.load(stale + slot) != 0:
            rows = tl.arange(0, BV)
            cols = tl.arange(0, K)
            for hv in range(HV):
                for v0 in range(0, V, BV):
                    r = v0 + rows
                    off = hv * V * K + r[:, None] * K + cols[None, :]
                    x = tl.load(state + slot * s_state + off)
                    if FP8:
                        amax = tl.max(tl.abs(x), axis=1)
                        sc = tl.where(amax > 0, amax / 448.0, 1.0)
                        q = tl.minimum(tl.maximum(tl.div_rn(x, sc[:, None]), -448.0), 448.0)
                        tl.store(copy + slot * s_copy + off, _e4m3_rne(q))
                        tl.store(scales + slot * s_scales + hv * V + r, sc)
                    else:
                        # round to nearest even by hand (the interpreter's casts truncate); copy viewed as int16
                        u = x.to(tl.uint32, bitcast=True)
                        u = u + 0x7FFF + ((u >> 16) & 1)
                        tl.store(copy + slot * s_copy + off, (u >> 16).to(tl.uint16).to(tl.int16, bitcast=True))
            tl.store(stale + slot, 0)


def refresh_stale_triton(state: torch.Tensor, copy: torch.Tensor, scales: torch.Tensor | None, stale: torch.Tensor,
                         slots: torch.Tensor) -> None:  # fmt: skip
    """The contract in one Triton launch (module docstring); contiguous slots, ``V`` a multiple of 16."""
    check_refresh_args(state, copy, scales, stale, slots)
    _, HV, V, K = state.shape
    if not (state[0].is_contiguous() and copy[0].is_contiguous()) or V % 16 or K & (K - 1):
        raise ValueError("state and copy must be contiguous within a slot, V a multiple of 16, K a power of two")
    if slots.numel() == 0:
        return
    fp8 = scales is not None
    sc = scales if scales is not None else state
    _refresh_kernel[(slots.numel(),)](
        state, copy.view(torch.uint8) if fp8 else copy.view(torch.int16), sc, stale.view(torch.uint8), slots, state.stride(0), copy.stride(0), sc.stride(0),
        HV=HV, V=V, K=K, BV=16, FP8=fp8,
    )  # fmt: skip


def refresh_stale(state: torch.Tensor, copy: torch.Tensor, scales: torch.Tensor | None, stale: torch.Tensor,
                  slots: torch.Tensor) -> None:  # fmt: skip
    """Triton on CUDA tensors (capturable), torch elsewhere."""
    if state.is_cuda:
        refresh_stale_triton(state, copy, scales, stale, slots)
    else:
        refresh_stale_torch(state, copy, scales, stale, slots)
