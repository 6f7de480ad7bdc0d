"""Pipelined ReplaySSM ring decode (Triton): the checkpoint streamed through shared memory.

Same function, ring layout, cursor and flush rule as :mod:`.ring_decode_triton` (whose module
docstring states them); only the way the checkpoint is streamed differs. A program owns one
(row, value head) and ``V / v_split`` checkpoint rows, walked in chunks of ``block_v`` rows by a
loop that Triton software-pipelines ``num_stages`` deep (``tl.range``): the chunks ahead travel
by asynchronous copies into shared memory (``cp.async``, or the tensor-memory accelerator with
``tma``), so the bytes in flight are not bounded by registers.

Read-out of a chunk (``read_mode``):

* ``"fma"``: ``S0 rows . qv`` and ``S0 rows . kv`` as IEEE fp32 multiply-adds and row sums;
* ``"tf32x3"``: one ``[block_v, K] x [K, 16]`` tensor-core product (3xTF32, near fp32) whose
  columns 0 and 1 hold ``qv`` and ``kv``, plus ``[block_v, 16] x [16, 16]`` for the delta ring.

Invariants (checked by the wrapper in :mod:`.ring_decode_triton`): as there, plus ``block_v >= 16``
and ``L <= 16`` for ``tf32x3``, and, for ``tma``, checkpoint rows 16-byte aligned.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .ring_decode_triton import _append_key_record, _flush_chunk, _head_setup

__all__ = ["READ_MODES", "launch_pipe"]

#: How a streamed chunk is reduced against the read-out vectors.
READ_MODES: dict[str, int] = {"fma": 0, "tf32x3": 1}


@triton.jit
def _ring_decode_pipe_kernel(
    qkv,
    a,
    b,
    A_log,
    dt_bias,
    out,
    state,
    state_desc,
    d_ring,
    k_ring,
    g_ring,
    slots,
    write_pos,
    force_flush,
    scale,
    stride_qkv,
    stride_a,
    stride_b,
    stride_state,
    stride_d,
    stride_k,
    stride_g,
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    L: tl.constexpr,
    BC: tl.constexpr,
    BV: tl.constexpr,
    VPER: tl.constexpr,
    IS_KDA: tl.constexpr,
    HAS_FF: tl.constexpr,
    USE_L2NORM: tl.constexpr,
    FLUSH_MODE: tl.constexpr,
    READ_MODE: tl.constexpr,
    PASS: tl.constexpr,
    NS: tl.constexpr,
    USE_TMA: tl.constexpr,
    ROW_MAJOR: tl.constexpr,
):
    """One program: row ``n``, value head ``hv``, checkpoint rows ``[pid(0)*VPER, +VPER)`` in
    ``VPER / BV`` chunks through an ``NS``-deep software pipeline.

    ``PASS``: 0 = every row; 1 = non-flush rows only; 2 = flush rows only. Padded rows (slot < 0)
    get a zero output in passes 0 and 1 and touch nothing else.
    """
    i_s = tl.program_id(0)
    if ROW_MAJOR:
        hv = tl.program_id(1)
        i_n = tl.program_id(2)
    else:
        i_n = tl.program_id(1)
        hv = tl.program_id(2)
    i_h = hv // (HV // H)
    NCH: tl.constexpr = VPER // BV
    v_base = i_s * VPER
    o_r = tl.arange(0, BV)
    o_k = tl.arange(0, K)
    o_c = tl.arange(0, BC)

    slot = tl.load(slots + i_n).to(tl.int64)
    m = tl.load(write_pos + i_n).to(tl.int32)
    is_flush = m == L - 1
    if HAS_FF:
        is_flush = is_flush | (tl.load(force_flush + i_n) != 0)
    p_o = out + (i_n * HV + hv) * V + v_base + o_r
    if slot < 0:
        if PASS != 2:
            for c in range(NCH):
                tl.store(p_o + c * BV, tl.zeros([BV], dtype=tl.float32).to(out.dtype.element_ty))
        return
    if PASS == 1:
        skip = is_flush
    elif PASS == 2:
        skip = not is_flush
    else:
        skip = False
    if skip:
        return

    valid = (o_c < m) & (o_c < L)
    in_ring = m < L
    k, kq, beta, qv, kv, cqv, ckv, sa, fw, fk, alpha, g_tot, g_cur, _, _ = _head_setup(
        qkv, a, b, A_log, dt_bias, k_ring, g_ring, slot, i_n, hv, i_h, valid, scale,
        stride_qkv, stride_a, stride_b, stride_k, stride_g, H, K, L, BC, IS_KDA, USE_L2NORM,
    )  # fmt: skip
    if READ_MODE == 1:
        col = tl.arange(0, 16)
        rhs = tl.where(col[None, :] == 0, qv[:, None], tl.where(col[None, :] == 1, kv[:, None], 0.0))
        crhs = tl.where(col[None, :] == 0, cqv[:, None], tl.where(col[None, :] == 1, ckv[:, None], 0.0))

    p_s = state + slot * stride_state + (hv * V + v_base + o_r[:, None]) * K + o_k[None, :]
    p_d = d_ring + slot * stride_d + (hv * L + o_c[None, :]) * V + v_base + o_r[:, None]
    p_v = qkv + i_n * stride_qkv + 2 * H * K + hv * V + v_base + o_r
    p_dw = d_ring + slot * stride_d + (hv * L + m) * V + v_base + o_r
    row0 = hv * V + v_base
    for c in tl.range(0, NCH, num_stages=NS):
        if USE_TMA:
            s = tl.reshape(state_desc.load([slot.to(tl.int32), row0 + c * BV, 0]), [BV, K]).to(tl.float32)
        else:
            s = tl.load(p_s + c * BV * K).to(tl.float32)  # [BV, K]
        dm = tl.load(p_d + c * BV, mask=valid[None, :], other=0.0).to(tl.float32)  # [BV, BC]
        v = tl.load(p_v + c * BV).to(tl.float32)
        if READ_MODE == 1:
            acc = tl.dot(s, rhs, input_precision="tf32x3")
            acc = tl.dot(dm, crhs, acc, input_precision="tf32x3")
            sq = tl.sum(tl.where(col[None, :] == 0, acc, 0.0), axis=1)
            sk = tl.sum(tl.where(col[None, :] == 1, acc, 0.0), axis=1)
        else:
            sq = tl.sum(s * qv[None, :], axis=1) + tl.sum(dm * cqv[None, :], axis=1)
            sk = tl.sum(s * kv[None, :], axis=1) + tl.sum(dm * ckv[None, :], axis=1)
        d_cur = beta * (v - sk)
        tl.store(p_o + c * BV, (sq + d_cur * kq).to(out.dtype.element_ty))
        if PASS == 2:
            write_state = True
        elif PASS == 1:
            write_state = False
        else:
            write_state = is_flush
        if write_state:
            new = _flush_chunk(s, dm, fk, sa, fw, alpha, g_tot, d_cur, k, d_ring, k_ring, g_ring, slot,
                               stride_d, stride_k, stride_g, hv, i_h, v_base + c * BV, m, o_r, o_k, o_c,
                               K, V, L, BC, BV, IS_KDA, FLUSH_MODE)  # fmt: skip
            tl.store(p_s + c * BV * K, new.to(state.dtype.element_ty))
        else:
            tl.store(p_dw + c * BV, d_cur.to(d_ring.dtype.element_ty), mask=(o_r < BV) & in_ring)

    if PASS != 2:
        if (not is_flush) and (i_s == 0):
            _append_key_record(g_ring, k_ring, slot, stride_g, stride_k, hv, i_h, m, g_cur, k, in_ring,
                               H, HV, K, L, IS_KDA)  # fmt: skip


def _state_descriptor(state: torch.Tensor, block_v: int) -> object:
    """A TMA descriptor over ``state`` viewed as ``[slots, HV*V, K]``, one block = ``block_v`` rows."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    slots, HV, V, K = state.shape
    view = state.as_strided((slots, HV * V, K), (state.stride(0), K, 1))
    return TensorDescriptor(view, list(view.shape), list(view.stride()), [1, block_v, K])


def launch_pipe(
    args: tuple,
    *,
    B: int,
    H: int,
    HV: int,
    K: int,
    V: int,
    L: int,
    grid: tuple[int, int, int],
    passes: list[tuple[int, int, int, int, int]],
    v_split: int,
    read_mode: str,
    num_stages: int,
    tma: bool,
    is_kda: bool,
    has_ff: bool,
    use_l2norm: bool,
    row_major: bool,
) -> None:
    """Launch :func:`_ring_decode_pipe_kernel` once per ``(pass, block_v, num_warps, flush_mode, BC)``.

    ``args`` are the tensor/stride arguments in kernel order, with ``None`` where the state
    descriptor goes (filled here when ``tma``).
    """
    if read_mode not in READ_MODES:
        raise ValueError(f"read_mode must be one of {sorted(READ_MODES)} (got {read_mode!r})")
    if num_stages < 1:
        raise ValueError(f"num_stages must be >= 1 (got {num_stages})")
    state = args[6]
    for pass_id, bv, nw, fm, bc in passes:
        if read_mode == "tf32x3":
            if bv < 16 or L > 16:
                raise ValueError(f"read_mode='tf32x3' needs block_v >= 16 and L <= 16 (got {bv}, {L})")
            bc = max(bc, 16)
        desc = _state_descriptor(state, bv) if tma else state
        call = list(args)
        call[7] = desc
        _ring_decode_pipe_kernel[grid](
            *call,
            H=H, HV=HV, K=K, V=V, L=L, BC=bc, BV=bv, VPER=V // v_split, IS_KDA=is_kda, HAS_FF=has_ff,
            USE_L2NORM=use_l2norm, FLUSH_MODE=_flush_mode_id(fm), READ_MODE=READ_MODES[read_mode], PASS=pass_id,
            NS=num_stages, USE_TMA=tma, ROW_MAJOR=row_major, num_warps=nw, num_stages=1,
        )  # fmt: skip


def _flush_mode_id(name: str) -> int:
    from .ring_decode_triton import FLUSH_MODES

    return FLUSH_MODES[name]
