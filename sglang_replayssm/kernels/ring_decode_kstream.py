"""K-streamed ReplaySSM read-out for non-flush rows (Triton).

The every-step half of the ring decode: for each decode row whose step is *not* a flush, the
output and the new ring record, from the checkpoint ``S0`` and the live records (function,
layout and cursor rule as in :mod:`.ring_decode_triton`). Flush rows are skipped; the caller
launches the flush pass of :mod:`.ring_decode_triton` for them.

Why a second form: the read-out ``S0 (A o alpha o q)`` reduces every checkpoint row over K, the
contiguous axis. Streaming chunks of rows (the row-chunk kernels) pays one cross-lane reduction
per row per chunk, and at decode sizes those shuffles, not the bytes, bound the kernel. Here a
program owns all ``V / v_split`` rows of one (row, value head) and walks **K** in slices of
``block_k`` columns: each slice is multiplied into two ``[rows, block_k]`` accumulators (plain
fp32 FMAs, no reduction), and the K reduction runs once per program at the end. The slices
travel through a ``num_stages``-deep software pipeline (``tl.range``). The per-K read-out
factors (normalised ``q``/``k``, and for KDA the per-channel decay ``A o alpha``) are recomputed
per slice from the inputs, so no full-K vector has to be sliced.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .ring_decode_triton import _append_key_record, _head_setup

__all__ = ["ring_read_kstream_kernel", "ring_read_rows_kernel"]


@triton.jit
def ring_read_kstream_kernel(
    qkv,
    a,
    b,
    A_log,
    dt_bias,
    out,
    state,
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
    BK: tl.constexpr,
    VPER: tl.constexpr,
    IS_KDA: tl.constexpr,
    HAS_FF: tl.constexpr,
    USE_L2NORM: tl.constexpr,
    NS: tl.constexpr,
    ROW_MAJOR: tl.constexpr,
):
    """One program: row ``n``, value head ``hv``, checkpoint rows ``[pid(0)*VPER, +VPER)``, K in
    ``K / BK`` slices through an ``NS``-deep pipeline. Flush rows return at once; padded rows
    (slot < 0) get a zero output."""
    i_s = tl.program_id(0)
    if ROW_MAJOR:
        hv = tl.program_id(1)
        i_n = tl.program_id(2)
    else:
        i_n = tl.program_id(1)
        hv = tl.program_id(2)
    i_h = hv // (HV // H)
    v_base = i_s * VPER
    o_v = tl.arange(0, VPER)
    o_c = tl.arange(0, BC)
    o_b = tl.arange(0, BK)

    slot = tl.load(slots + i_n).to(tl.int64)
    m = tl.load(write_pos + i_n).to(tl.int32)
    is_flush = m == L - 1
    if HAS_FF:
        is_flush = is_flush | (tl.load(force_flush + i_n) != 0)
    p_o = out + (i_n * HV + hv) * V + v_base + o_v
    if slot < 0:
        tl.store(p_o, tl.zeros([VPER], dtype=tl.float32).to(out.dtype.element_ty))
        return
    if is_flush:
        return

    valid = (o_c < m) & (o_c < L)
    in_ring = m < L
    # Delta ring of this head, [BC, VPER] (V contiguous): requested before the setup and the stream.
    p_dr = d_ring + slot * stride_d + (hv * L + o_c[:, None]) * V + v_base + o_v[None, :]
    dr = tl.load(p_dr, mask=valid[:, None], other=0.0).to(tl.float32)
    v_in = tl.load(qkv + i_n * stride_qkv + 2 * H * K + hv * V + v_base + o_v).to(tl.float32)
    k, kq, beta, qv, kv, cqv, ckv, sa, fw, fk, alpha, g_tot, g_cur, q_fac, k_fac = _head_setup(
        qkv, a, b, A_log, dt_bias, k_ring, g_ring, slot, i_n, hv, i_h, valid, scale,
        stride_qkv, stride_a, stride_b, stride_k, stride_g, H, K, L, BC, IS_KDA, USE_L2NORM,
    )  # fmt: skip
    if IS_KDA:
        a_decay = tl.exp(tl.load(A_log + hv).to(tl.float32))
    else:
        sa_s = tl.max(sa, axis=0)  # GDN: one decay for every channel
        q_fac = q_fac * sa_s
        k_fac = k_fac * sa_s

    p_row = qkv + i_n * stride_qkv
    p_s = state + slot * stride_state + (hv * V + v_base + o_v[:, None]) * K + o_b[None, :]
    acc_q = tl.zeros([VPER, BK], dtype=tl.float32)
    acc_k = tl.zeros([VPER, BK], dtype=tl.float32)
    for c in tl.range(0, K // BK, num_stages=NS):
        k0 = c * BK
        s = tl.load(p_s + k0).to(tl.float32)  # [VPER, BK]
        q_c = tl.load(p_row + i_h * K + k0 + o_b).to(tl.float32) * q_fac
        k_c = tl.load(p_row + H * K + i_h * K + k0 + o_b).to(tl.float32) * k_fac
        if IS_KDA:
            g_c = tl.load(
                g_ring + slot * stride_g + (hv * L + o_c[:, None]) * K + k0 + o_b[None, :],
                mask=valid[:, None],
                other=0.0,
            )
            x = tl.load(a + i_n * stride_a + hv * K + k0 + o_b).to(tl.float32) + tl.load(
                dt_bias + hv * K + k0 + o_b
            ).to(tl.float32)
            sp = tl.where(x <= 20.0, tl.log(1.0 + tl.exp(tl.minimum(x, 20.0))), x)
            decay = tl.exp(tl.sum(g_c, axis=0) - a_decay * sp)  # A o alpha on this slice
            q_c = q_c * decay
            k_c = k_c * decay
        acc_q += s * q_c[None, :]
        acc_k += s * k_c[None, :]
    sq = tl.sum(acc_q, axis=1) + tl.sum(dr * cqv[:, None], axis=0)
    sk = tl.sum(acc_k, axis=1) + tl.sum(dr * ckv[:, None], axis=0)
    d_cur = beta * (v_in - sk)
    tl.store(p_o, (sq + d_cur * kq).to(out.dtype.element_ty))
    p_dw = d_ring + slot * stride_d + (hv * L + m) * V + v_base + o_v
    tl.store(p_dw, d_cur.to(d_ring.dtype.element_ty), mask=(o_v < VPER) & in_ring)
    if i_s == 0:
        _append_key_record(g_ring, k_ring, slot, stride_g, stride_k, hv, i_h, m, g_cur, k, in_ring,
                           H, HV, K, L, IS_KDA)  # fmt: skip


@triton.jit
def _rows_chunk(s, dm, qv3, kv3, cqv, ckv, beta, kq, p_v, p_o, p_dw, c, o_r, in_ring, BV: tl.constexpr,
                QF: tl.constexpr):  # fmt: skip
    """Output and ring record of chunk ``c``: ``s`` its checkpoint tile (3D), ``dm`` its ``[BC, BV]``
    delta-ring tile."""
    v = tl.load(p_v + c * BV).to(tl.float32)
    if QF:
        sq = tl.sum(tl.sum(s * qv3, axis=2), axis=0)
        sk = tl.sum(tl.sum(s * kv3, axis=2), axis=0)
    else:
        sq = tl.sum(tl.sum(s * qv3, axis=2), axis=1)
        sk = tl.sum(tl.sum(s * kv3, axis=2), axis=1)
    sq = sq + tl.sum(dm * cqv[:, None], axis=0)
    sk = sk + tl.sum(dm * ckv[:, None], axis=0)
    d_cur = beta * (v - sk)
    tl.store(p_o + c * BV, (sq + d_cur * kq).to(p_o.dtype.element_ty))
    tl.store(p_dw + c * BV, d_cur.to(p_dw.dtype.element_ty), mask=(o_r < BV) & in_ring)


@triton.jit
def ring_read_rows_kernel(
    qkv,
    a,
    b,
    A_log,
    dt_bias,
    out,
    state,
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
    KS: tl.constexpr,
    VPER: tl.constexpr,
    QF: tl.constexpr,
    PERM: tl.constexpr,
    NS: tl.constexpr,
    IS_KDA: tl.constexpr,
    HAS_FF: tl.constexpr,
    USE_L2NORM: tl.constexpr,
    ROW_MAJOR: tl.constexpr,
):
    """Non-flush read-out over row chunks, each chunk held as ``K / KS`` column slices.

    A chunk of ``BV`` checkpoint rows is loaded as a 3D tile of ``[BV, K/KS, KS]`` (``QF``:
    ``[K/KS, BV, KS]``) so that lanes spread over rows and over ``KS / 4`` columns only: the row
    reduction is mostly in-thread and costs ``log2(KS / 4)`` shuffles instead of 5. With ``PERM``
    the rows of a chunk are visited in a fixed permutation that hides their contiguity from the
    compiler, so the delta-ring tile ``[BC, BV]`` is laid out with records in registers (its
    reduction over records is in-thread too). ``NS == 1``: one chunk prefetched into registers;
    ``NS > 1``: chunks through an ``NS``-deep software pipeline. Flush rows return at once;
    padded rows (slot < 0) get a zero output.
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
    NKS: tl.constexpr = K // KS
    v_base = i_s * VPER
    o_r = tl.arange(0, BV)
    if PERM:
        o_r = (o_r * 5) % BV  # a bijection (5 is odd, BV a power of two)
    o_c = tl.arange(0, BC)
    o_q = tl.arange(0, NKS)
    o_w = tl.arange(0, KS)

    slot = tl.load(slots + i_n).to(tl.int64)
    m = tl.load(write_pos + i_n).to(tl.int32)
    is_flush = m == L - 1
    if HAS_FF:
        is_flush = is_flush | (tl.load(force_flush + i_n) != 0)
    p_o = out + (i_n * HV + hv) * V + v_base + o_r
    if slot < 0:
        for c in range(NCH):
            tl.store(p_o + c * BV, tl.zeros([BV], dtype=tl.float32).to(out.dtype.element_ty))
        return
    if is_flush:
        return

    valid = (o_c < m) & (o_c < L)
    in_ring = m < L
    rows = hv * V + v_base + o_r
    base = state + slot * stride_state
    if QF:
        p_s = base + rows[None, :, None] * K + (o_q * KS)[:, None, None] + o_w[None, None, :]
    else:
        p_s = base + rows[:, None, None] * K + (o_q * KS)[None, :, None] + o_w[None, None, :]
    p_d = d_ring + slot * stride_d + (hv * L + o_c[:, None]) * V + v_base + o_r[None, :]  # [BC, BV]
    if NS == 1:  # first chunk requested before the setup
        s_cur = tl.load(p_s).to(tl.float32)
        d_cur_t = tl.load(p_d, mask=valid[:, None], other=0.0).to(tl.float32)
    k, kq, beta, qv, kv, cqv, ckv, sa, fw, fk, alpha, g_tot, g_cur, q_fac, k_fac = _head_setup(
        qkv, a, b, A_log, dt_bias, k_ring, g_ring, slot, i_n, hv, i_h, valid, scale,
        stride_qkv, stride_a, stride_b, stride_k, stride_g, H, K, L, BC, IS_KDA, USE_L2NORM,
    )  # fmt: skip
    if QF:
        qv3 = tl.reshape(qv, [NKS, KS])[:, None, :]
        kv3 = tl.reshape(kv, [NKS, KS])[:, None, :]
    else:
        qv3 = tl.reshape(qv, [NKS, KS])[None, :, :]
        kv3 = tl.reshape(kv, [NKS, KS])[None, :, :]
    p_v = qkv + i_n * stride_qkv + 2 * H * K + hv * V + v_base + o_r
    p_dw = d_ring + slot * stride_d + (hv * L + m) * V + v_base + o_r
    if NS > 1:  # chunks through a software pipeline in shared memory
        for c in tl.range(0, NCH, num_stages=NS):
            s_c = tl.load(p_s + c * BV * K).to(tl.float32)
            d_c = tl.load(p_d + c * BV, mask=valid[:, None], other=0.0).to(tl.float32)
            _rows_chunk(s_c, d_c, qv3, kv3, cqv, ckv, beta, kq, p_v, p_o, p_dw, c, o_r, in_ring, BV, QF)
    else:  # one chunk prefetched into registers
        for c in range(NCH):
            ahead = (c + 1) < NCH
            s_new = tl.load(p_s + (c + 1) * BV * K, mask=ahead, other=0.0).to(tl.float32)
            d_new = tl.load(p_d + (c + 1) * BV, mask=valid[:, None] & ahead, other=0.0).to(tl.float32)
            _rows_chunk(s_cur, d_cur_t, qv3, kv3, cqv, ckv, beta, kq, p_v, p_o, p_dw, c, o_r, in_ring, BV, QF)
            s_cur = s_new
            d_cur_t = d_new
    if i_s == 0:
        _append_key_record(g_ring, k_ring, slot, stride_g, stride_k, hv, i_h, m, g_cur, k, in_ring,
                           H, HV, K, L, IS_KDA)  # fmt: skip
