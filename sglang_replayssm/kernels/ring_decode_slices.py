"""Non-flush ReplaySSM read-out over row chunks held as column slices (Triton).

The every-step half of the ring decode: for each decode row whose step is *not* a flush, the
output and the new ring record, from the checkpoint ``S0`` and the live records (function,
layout and cursor rule as in :mod:`.ring_decode`). Flush rows are skipped; the caller
launches the flush pass of :mod:`.ring_decode_triton` for them.

Why a second form: the read-out ``S0 (A o alpha o q)`` reduces every checkpoint row over K, the
contiguous axis. Loaded as a plain ``[rows, K]`` tile, each row is spread over all 32 lanes and
its reduction costs 5 shuffle rounds per row per chunk; at decode sizes those instructions, not
the bytes, bound the kernel (the H200 sweeps in notes/kernels.md: time tracks instruction count).
Here a chunk is loaded as ``[rows, K/KS, KS]`` so lanes spread over rows and ``KS/4`` columns.
Which of the two non-contiguous axes the compiler spreads lanes over is its choice (Triton 3.6
takes ``slices_first=False``, 3.8 the other); both orders are exact, only the speed differs.
The product launches the default order with one chunk prefetched into registers; the tile orders
(``slices_first``, ``perm_rows``) and the shared-memory pipeline (``num_stages`` > 1) are research
parameters of :func:`launch_read`, selected only by ``lab/kernels/ring_decode_research.py``.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .ring_decode_args import RingStep
from .ring_decode_common import append_key_record, head_setup, program_row
from .ring_decode_config import RingDecodeConfig

__all__ = ["launch_read", "ring_read_rows_kernel"]


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
    ring_map,
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
    HAS_MAP: tl.constexpr,
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
    i_n, hv, i_h, slot, ring, m, is_flush = program_row(slots, ring_map, write_pos, force_flush, H, HV, L, HAS_FF,
                                                        ROW_MAJOR, HAS_MAP)
    NCH: tl.constexpr = VPER // BV
    NKS: tl.constexpr = K // KS
    v_base = i_s * VPER
    o_r = tl.arange(0, BV)
    if PERM:
        o_r = (o_r * 5) % BV  # a bijection (5 is odd, BV a power of two)
    o_c = tl.arange(0, BC)
    o_q = tl.arange(0, NKS)
    o_w = tl.arange(0, KS)

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
    p_d = d_ring + ring * stride_d + (hv * L + o_c[:, None]) * V + v_base + o_r[None, :]  # [BC, BV]
    if NS == 1:  # first chunk requested before the setup
        s_cur = tl.load(p_s).to(tl.float32)
        d_cur_t = tl.load(p_d, mask=valid[:, None], other=0.0).to(tl.float32)
    k, kq, beta, qv, kv, cqv, ckv, sa, fw, fk, alpha, g_tot, g_cur, q_fac, k_fac = head_setup(
        qkv, a, b, A_log, dt_bias, k_ring, g_ring, ring, i_n, hv, i_h, valid, scale,
        stride_qkv, stride_a, stride_b, stride_k, stride_g, H, K, L, BC, IS_KDA, USE_L2NORM,
    )  # fmt: skip
    if QF:
        qv3 = tl.reshape(qv, [NKS, KS])[:, None, :]
        kv3 = tl.reshape(kv, [NKS, KS])[:, None, :]
    else:
        qv3 = tl.reshape(qv, [NKS, KS])[None, :, :]
        kv3 = tl.reshape(kv, [NKS, KS])[None, :, :]
    p_v = qkv + i_n * stride_qkv + 2 * H * K + hv * V + v_base + o_r
    p_dw = d_ring + ring * stride_d + (hv * L + m) * V + v_base + o_r
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
        append_key_record(g_ring, k_ring, ring, stride_g, stride_k, hv, i_h, m, g_cur, k, in_ring,
                           H, HV, K, L, IS_KDA)  # fmt: skip


def launch_read(
    step: RingStep, cfg: RingDecodeConfig, *, slices_first: bool = False, perm_rows: bool = False,
    num_stages: int = 1,
) -> None:  # fmt: skip
    """Launch :func:`ring_read_rows_kernel` for the step's non-flush rows with ``cfg``'s
    ``block_v`` / ``v_split`` / ``num_warps`` / ``slice_k`` / ``row_major``; the keywords are the
    kernel's research parameters (the product launches with their defaults)."""
    s = step.shape
    bv, _ = cfg.fit(s.V)
    ks = cfg.slice_k
    if ks < 4 or ks & (ks - 1) or s.K % ks != 0:
        raise ValueError(f"slice_k={ks} must be a power of two >= 4 dividing K={s.K}")
    grid = (cfg.v_split, s.HV, s.B) if cfg.row_major else (cfg.v_split, s.B, s.HV)
    ring_read_rows_kernel[grid](
        step.qkv, step.a, step.b, step.A_log, step.dt_bias, step.out, step.state, step.d, step.k, step.g,
        step.slots, step.ring_map_arg, step.write_pos, step.force_flush_arg, step.scale, *step.strides,
        H=s.H, HV=s.HV, K=s.K, V=s.V, L=s.L, BC=triton.next_power_of_2(s.L), BV=bv, KS=ks,
        VPER=s.V // cfg.v_split, QF=slices_first, PERM=perm_rows, IS_KDA=step.is_kda, NS=num_stages,
        HAS_FF=step.force_flush is not None, USE_L2NORM=step.use_l2norm, ROW_MAJOR=cfg.row_major,
        HAS_MAP=step.ring_map is not None, num_warps=cfg.num_warps, num_stages=1,
    )  # fmt: skip
