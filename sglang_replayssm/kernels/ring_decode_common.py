"""``@triton.jit`` helpers shared by the ring-decode kernels of :mod:`.ring_decode_triton` (row
chunks in registers, and the flush pass) and :mod:`.ring_decode_slices` (column-slice read pass).

Math, ring layout and cursor rule: :mod:`.ring_decode`. Each helper is inlined into its caller;
none launches anything. Shapes below are per program (one decode row, one value head).
"""

from __future__ import annotations

import triton
import triton.language as tl

from .constants import L2NORM_EPS, SOFTPLUS_THRESHOLD

__all__ = ["append_key_record", "flush_chunk", "head_setup", "program_row"]

_EPS = tl.constexpr(L2NORM_EPS)
_SP_MAX = tl.constexpr(SOFTPLUS_THRESHOLD)


@triton.jit
def flush_chunk(
    s0,
    dm,
    fk,
    sa,
    fw,
    alpha,
    g_tot,
    d_cur,
    k,
    d_ring,
    k_ring,
    g_ring,
    ring,
    stride_d,
    stride_k,
    stride_g,
    hv,
    i_h,
    v0,
    m,
    o_r,
    o_k,
    o_c,
    K: tl.constexpr,
    V: tl.constexpr,
    L: tl.constexpr,
    BC: tl.constexpr,
    BVC: tl.constexpr,
    IS_KDA: tl.constexpr,
    FLUSH_MODE: tl.constexpr,
):
    """New checkpoint rows ``v0 .. v0+BVC``: ``S0 . Diag(A alpha) + sum_j d_j (alpha W_j o k_j)^T + d_cur k^T``."""
    acc = s0 * sa[None, :]
    if FLUSH_MODE == 0:
        g_run = tl.zeros([K], dtype=tl.float32)
        for j in tl.static_range(BC):
            ok = (j < m) & (j < L)
            d_j = tl.load(d_ring + ring * stride_d + (hv * L + j) * V + v0 + o_r, mask=(o_r < BVC) & ok, other=0.0)
            k_j = tl.load(k_ring + ring * stride_k + (i_h * L + j) * K + o_k, mask=(o_k < K) & ok, other=0.0)
            if IS_KDA:
                g_j = tl.load(g_ring + ring * stride_g + (hv * L + j) * K + o_k, mask=(o_k < K) & ok, other=0.0)
                g_run += g_j
                f_j = tl.where(ok, alpha * tl.exp(g_tot - g_run), 0.0) * k_j.to(tl.float32)
            else:
                f_j = tl.sum(tl.where(o_c == j, fw, 0.0), axis=0) * k_j.to(tl.float32)
            acc += d_j.to(tl.float32)[:, None] * f_j[None, :]
    elif FLUSH_MODE == 1:
        acc = tl.dot(dm, fk, acc, input_precision="tf32x3")
    else:
        acc = tl.dot(dm, fk, acc, input_precision="ieee")
    return acc + d_cur[:, None] * k[None, :]


@triton.jit
def head_setup(
    qkv,
    a,
    b,
    A_log,
    dt_bias,
    k_ring,
    g_ring,
    ring,
    i_n,
    hv,
    i_h,
    valid,
    scale,
    stride_qkv,
    stride_a,
    stride_b,
    stride_k,
    stride_g,
    H: tl.constexpr,
    K: tl.constexpr,
    L: tl.constexpr,
    BC: tl.constexpr,
    IS_KDA: tl.constexpr,
    USE_L2NORM: tl.constexpr,
):
    """Per (row, value head) setup shared by the decode kernels.

    Returns ``(k, kq, beta, qv, kv, cqv, ckv, sa, fw, fk, alpha, g_tot, g_cur, q_fac, k_fac)``:
    the normalised key, ``k.q``, the write strength, the read-out vectors ``qv``/``kv`` applied to
    checkpoint rows, the record coefficients ``cqv``/``ckv`` ([BC]) applied to the delta ring, the
    flush scale ``sa`` on S0 and the flush factors ``fw``/``fk`` on the ring, the gates, and the
    scalars that turn raw ``q``/``k`` into normalised (and, for ``q``, scaled) ones. Ring rows
    ``j`` with ``valid[j]`` false contribute nothing.
    """
    p_row = qkv + i_n * stride_qkv
    o_k = tl.arange(0, K)
    o_c = tl.arange(0, BC)
    q = tl.load(p_row + i_h * K + o_k).to(tl.float32)
    k = tl.load(p_row + H * K + i_h * K + o_k).to(tl.float32)
    if USE_L2NORM:
        q_fac = scale / tl.sqrt(tl.sum(q * q, axis=0) + _EPS)
        k_fac = 1.0 / tl.sqrt(tl.sum(k * k, axis=0) + _EPS)
    else:
        q_fac = scale + tl.zeros([], dtype=tl.float32)
        k_fac = 1.0 + tl.zeros([], dtype=tl.float32)
    q = q * q_fac
    k = k * k_fac
    kq = tl.sum(k * q, axis=0)

    # Key ring of this key head: [BC, K], rows j >= m masked to zero.
    p_kr = k_ring + ring * stride_k + (i_h * L + o_c[:, None]) * K + o_k[None, :]
    kr = tl.load(p_kr, mask=valid[:, None], other=0.0).to(tl.float32)
    a_decay = tl.exp(tl.load(A_log + hv).to(tl.float32))
    b_raw = tl.load(b + i_n * stride_b + hv).to(tl.float32)
    beta = tl.sigmoid(b_raw).to(b.dtype.element_ty).to(tl.float32)
    # Per head: read-out vectors qv/kv (applied to S0 rows), record coefficients cqv/ckv
    # (applied to the delta ring), flush scale sa (on S0) and flush factors fw/fk (on the ring).
    if not IS_KDA:
        gr = tl.load(g_ring + ring * stride_g + hv * L + o_c, mask=valid, other=0.0)
        g_tot = tl.sum(gr, axis=0)
        suffix = tl.cumsum(gr, axis=0, reverse=True) - gr  # sum_{i>j} g_i
        x = tl.load(a + i_n * stride_a + hv).to(tl.float32) + tl.load(dt_bias + hv).to(tl.float32)
        sp = tl.where(x <= _SP_MAX, tl.log(1.0 + tl.exp(tl.minimum(x, _SP_MAX))), x)
        g_cur = -a_decay * sp
        alpha = tl.exp(g_cur)
        fw = tl.where(valid, alpha * tl.exp(suffix), 0.0)  # alpha * W_j, [BC]
        sa_s = alpha * tl.exp(g_tot)
        sa = tl.zeros([K], dtype=tl.float32) + sa_s
        qv = q * sa_s
        kv = k * sa_s
        cqv = fw * tl.sum(kr * q[None, :], axis=1)
        ckv = fw * tl.sum(kr * k[None, :], axis=1)
        fk = kr * fw[:, None]
    else:
        p_gr = g_ring + ring * stride_g + (hv * L + o_c[:, None]) * K + o_k[None, :]
        gr = tl.load(p_gr, mask=valid[:, None], other=0.0)  # [BC, K]
        g_tot = tl.sum(gr, axis=0)  # [K]
        suffix = tl.cumsum(gr, axis=0, reverse=True) - gr
        x = tl.load(a + i_n * stride_a + hv * K + o_k).to(tl.float32) + tl.load(dt_bias + hv * K + o_k).to(
            tl.float32
        )
        sp = tl.where(x <= _SP_MAX, tl.log(1.0 + tl.exp(tl.minimum(x, _SP_MAX))), x)
        g_cur = -a_decay * sp  # [K]
        alpha = tl.exp(g_cur)
        wk = tl.where(valid[:, None], tl.exp(suffix), 0.0) * kr  # W_j o k_j, [BC, K]
        cqv = tl.sum(wk * (alpha * q)[None, :], axis=1)
        ckv = tl.sum(wk * (alpha * k)[None, :], axis=1)
        sa = alpha * tl.exp(g_tot)
        qv = sa * q
        kv = sa * k
        fw = cqv  # unused for KDA
        fk = wk * alpha[None, :]

    return k, kq, beta, qv, kv, cqv, ckv, sa, fw, fk, alpha, g_tot, g_cur, q_fac, k_fac


@triton.jit
def program_row(
    slots,
    ring_map,
    write_pos,
    force_flush,
    H: tl.constexpr,
    HV: tl.constexpr,
    L: tl.constexpr,
    HAS_FF: tl.constexpr,
    ROW_MAJOR: tl.constexpr,
    HAS_MAP: tl.constexpr,
):
    """``(row, value head, key head, slot, ring row, cursor, is_flush)`` of this program (grid axes 1
    and 2; with ``ROW_MAJOR`` consecutive programs walk the heads of one row, one contiguous slot). The
    ring row is the slot itself, or with ``HAS_MAP`` ``ring_map[slot]`` (padding rows read entry 0)."""
    if ROW_MAJOR:
        hv = tl.program_id(1)
        i_n = tl.program_id(2)
    else:
        i_n = tl.program_id(1)
        hv = tl.program_id(2)
    slot = tl.load(slots + i_n).to(tl.int64)
    ring = slot
    if HAS_MAP:
        ring = tl.load(ring_map + tl.maximum(slot, 0)).to(tl.int64)
    m = tl.load(write_pos + i_n).to(tl.int32)
    is_flush = m == L - 1
    if HAS_FF:
        is_flush = is_flush | (tl.load(force_flush + i_n) != 0)
    return i_n, hv, hv // (HV // H), slot, ring, m, is_flush


@triton.jit
def append_key_record(
    g_ring,
    k_ring,
    ring,
    stride_g,
    stride_k,
    hv,
    i_h,
    m,
    g_cur,
    k,
    in_ring,
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    L: tl.constexpr,
    IS_KDA: tl.constexpr,
):
    """Write the gate record of value head ``hv`` and, from the first value head of each key head,
    the key record, at ring position ``m`` (nothing when ``in_ring`` is false)."""
    o_k = tl.arange(0, K)
    if IS_KDA:
        tl.store(g_ring + ring * stride_g + (hv * L + m) * K + o_k, g_cur, mask=(o_k < K) & in_ring)
    else:
        tl.store(g_ring + ring * stride_g + hv * L + m, g_cur, mask=in_ring)
    if hv % (HV // H) == 0:
        tl.store(
            k_ring + ring * stride_k + (i_h * L + m) * K + o_k,
            k.to(k_ring.dtype.element_ty),
            mask=(o_k < K) & in_ring,
        )
