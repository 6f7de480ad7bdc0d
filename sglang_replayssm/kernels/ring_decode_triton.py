"""Triton ring decode kernel: row chunks prefetched into registers (``engine="regs"``), and the
flush pass that the ``"slices"`` engine (and the CUDA read pass in the sweeps) pair with.

Math, ring layout and cursor rule: :mod:`.ring_decode`. A program owns one (row, value head) and
``V / v_split`` rows of it, streamed in chunks of ``block_v`` rows with 1-2 chunks requested
ahead; the first chunks are requested before the per-program setup so that its latency overlaps
the stream. With ``split`` the flush path lives in a second launch, so the every-step kernel is
small. Exact fp32: the flush's rank-``m`` fold runs as IEEE fp32 FMAs (``FLUSH_MODE`` 0, the
product's); the ``tl.dot`` folds (3xTF32, IEEE) are research variants selected only by
``lab/kernels/ring_decode_research.py`` (not packaged).
"""

from __future__ import annotations

import triton
import triton.language as tl

from .ring_decode_args import RingStep
from .ring_decode_common import append_key_record, flush_chunk, head_setup, program_row
from .ring_decode_config import RingDecodeConfig

__all__ = ["ALL_ROWS", "FLUSH_MODES", "FLUSH_ROWS", "NON_FLUSH_ROWS", "launch_rows", "ring_decode_kernel"]

#: How the flush step folds the live records into each checkpoint chunk.
#: ``fma``: an unrolled loop over the ring positions with IEEE fp32 FMAs (no ``tl.dot``);
#: ``tf32x3``: ``tl.dot`` with 3xTF32 (tensor cores, near fp32); ``ieee``: ``tl.dot`` in IEEE fp32.
FLUSH_MODES: dict[str, int] = {"fma": 0, "tf32x3": 1, "ieee": 2}
#: The rows one launch serves (the kernel's ``PASS``).
ALL_ROWS, NON_FLUSH_ROWS, FLUSH_ROWS = 0, 1, 2


@triton.jit
def ring_decode_kernel(
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
    BVC: tl.constexpr,
    VPER: tl.constexpr,
    IS_KDA: tl.constexpr,
    HAS_FF: tl.constexpr,
    USE_L2NORM: tl.constexpr,
    FLUSH_MODE: tl.constexpr,
    PF: tl.constexpr,
    PASS: tl.constexpr,
    EVICT: tl.constexpr,
    ROW_MAJOR: tl.constexpr,
    HAS_MAP: tl.constexpr,
):
    """One program: decode row ``pid(1)``, value head ``pid(2)``, V rows ``[pid(0)*VPER, +VPER)``
    streamed in chunks of ``BVC`` rows with ``PF`` (1 or 2) chunks in flight ahead of the one being
    computed; the first chunks are requested before the per-program setup so that the setup's
    latency overlaps the state stream.

    ``PASS``: 0 = every row; 1 = non-flush rows only (flush code compiled out); 2 = flush rows
    only. Padded rows (slot < 0) get a zero output in passes 0 and 1.
    """
    i_s = tl.program_id(0)
    i_n, hv, i_h, slot, ring, m, is_flush = program_row(slots, ring_map, write_pos, force_flush, H, HV, L, HAS_FF,
                                                        ROW_MAJOR, HAS_MAP)
    NCH: tl.constexpr = VPER // BVC
    v_base = i_s * VPER

    o_r = tl.arange(0, BVC)
    o_k = tl.arange(0, K)
    o_c = tl.arange(0, BC)

    if slot < 0:
        if PASS != 2:
            for c in range(NCH):
                tl.store(
                    out + (i_n * HV + hv) * V + v_base + c * BVC + o_r,
                    tl.zeros([BVC], dtype=tl.float32).to(out.dtype.element_ty),
                )
        return
    if PASS == 1:
        skip = is_flush
    elif PASS == 2:
        skip = not is_flush
    else:
        skip = False
    if skip:
        return

    # Live records j < m (and never past the ring, whatever the cursor holds).
    valid = (o_c < m) & (o_c < L)
    in_ring = m < L
    row_ok = o_r[:, None] < BVC

    # Request the first chunk(s) of S0 and of the delta ring now.
    p_s = state + slot * stride_state + (hv * V + v_base + o_r[:, None]) * K + o_k[None, :]
    p_d = d_ring + ring * stride_d + (hv * L + o_c[None, :]) * V + v_base + o_r[:, None]
    s_cur = tl.load(p_s, eviction_policy=EVICT).to(tl.float32)  # [BVC, K]
    d_cur_t = tl.load(p_d, mask=valid[None, :], other=0.0).to(tl.float32)  # [BVC, BC]
    if PF == 2:
        s_nxt = tl.load(p_s + BVC * K, mask=row_ok & (NCH > 1), other=0.0, eviction_policy=EVICT).to(tl.float32)
        d_nxt = tl.load(p_d + BVC, mask=valid[None, :] & (NCH > 1), other=0.0).to(tl.float32)

    k, kq, beta, qv, kv, cqv, ckv, sa, fw, fk, alpha, g_tot, g_cur, _, _ = head_setup(
        qkv, a, b, A_log, dt_bias, k_ring, g_ring, ring, i_n, hv, i_h, valid, scale,
        stride_qkv, stride_a, stride_b, stride_k, stride_g, H, K, L, BC, IS_KDA, USE_L2NORM,
    )  # fmt: skip
    p_row = qkv + i_n * stride_qkv

    p_v = p_row + 2 * H * K + hv * V + v_base + o_r
    p_o = out + (i_n * HV + hv) * V + v_base + o_r
    for c in range(NCH):
        ahead = c + PF
        s_new = tl.load(p_s + ahead * BVC * K, mask=row_ok & (ahead < NCH), other=0.0, eviction_policy=EVICT).to(
            tl.float32
        )
        d_new = tl.load(p_d + ahead * BVC, mask=valid[None, :] & (ahead < NCH), other=0.0).to(tl.float32)
        v = tl.load(p_v + c * BVC).to(tl.float32)
        sq = tl.sum(s_cur * qv[None, :], axis=1) + tl.sum(d_cur_t * cqv[None, :], axis=1)
        sk = tl.sum(s_cur * kv[None, :], axis=1) + tl.sum(d_cur_t * ckv[None, :], axis=1)
        d_cur = beta * (v - sk)
        tl.store(p_o + c * BVC, (sq + d_cur * kq).to(out.dtype.element_ty))
        v0 = v_base + c * BVC
        p_dw = d_ring + ring * stride_d + (hv * L + m) * V + v0 + o_r
        if PASS == 1:
            tl.store(p_dw, d_cur.to(d_ring.dtype.element_ty), mask=(o_r < BVC) & in_ring)
        elif PASS == 2:
            acc = flush_chunk(s_cur, d_cur_t, fk, sa, fw, alpha, g_tot, d_cur, k, d_ring, k_ring, g_ring, ring,
                               stride_d, stride_k, stride_g, hv, i_h, v0, m, o_r, o_k, o_c,
                               K, V, L, BC, BVC, IS_KDA, FLUSH_MODE)  # fmt: skip
            tl.store(p_s + c * BVC * K, acc.to(state.dtype.element_ty))
        else:
            if is_flush:
                acc = flush_chunk(s_cur, d_cur_t, fk, sa, fw, alpha, g_tot, d_cur, k, d_ring, k_ring, g_ring,
                                   ring, stride_d, stride_k, stride_g, hv, i_h, v0, m, o_r, o_k, o_c,
                                   K, V, L, BC, BVC, IS_KDA, FLUSH_MODE)  # fmt: skip
                tl.store(p_s + c * BVC * K, acc.to(state.dtype.element_ty))
            else:
                tl.store(p_dw, d_cur.to(d_ring.dtype.element_ty), mask=(o_r < BVC) & in_ring)
        if PF == 2:
            s_cur = s_nxt
            d_cur_t = d_nxt
            s_nxt = s_new
            d_nxt = d_new
        else:
            s_cur = s_new
            d_cur_t = d_new

    if PASS != 2:
        if (not is_flush) and (i_s == 0):
            append_key_record(g_ring, k_ring, ring, stride_g, stride_k, hv, i_h, m, g_cur, k, in_ring,
                               H, HV, K, L, IS_KDA)  # fmt: skip



def _record_block(L: int, flush_mode: str) -> int:
    """Ring positions a program tiles: ``L`` rounded up to a power of two, at least 16 for ``tl.dot``."""
    bc = triton.next_power_of_2(L)
    return bc if flush_mode == "fma" else max(bc, 16)


def launch_rows(
    step: RingStep, cfg: RingDecodeConfig, rows: int, *, flush_mode: str = "fma", evict_first: bool = False,
    maxnreg: int | None = None, num_stages: int = 1,
) -> None:  # fmt: skip
    """Launch :func:`ring_decode_kernel` for ``rows`` (:data:`ALL_ROWS`, :data:`NON_FLUSH_ROWS`
    or :data:`FLUSH_ROWS`) with ``cfg`` (the flush launch of a split step takes ``flush_block_v``
    / ``flush_num_warps``). The keywords are the kernel's research parameters; the product
    launches with their defaults."""
    s = step.shape
    bv, fbv = cfg.fit(s.V)
    nw = cfg.num_warps
    fm = flush_mode if bv >= 16 else "fma"  # tl.dot needs every dim >= 16
    if rows == FLUSH_ROWS:
        bv, nw = fbv, cfg.flush_num_warps if cfg.flush_num_warps is not None else nw
        fm = fm if fbv >= 16 else "fma"
    grid = (cfg.v_split, s.HV, s.B) if cfg.row_major else (cfg.v_split, s.B, s.HV)
    extra = {"maxnreg": maxnreg} if maxnreg else {}
    ring_decode_kernel[grid](
        step.qkv, step.a, step.b, step.A_log, step.dt_bias, step.out, step.state, step.d, step.k, step.g,
        step.slots, step.ring_map_arg, step.write_pos, step.force_flush_arg, step.scale, *step.strides,
        H=s.H, HV=s.HV, K=s.K, V=s.V, L=s.L, BC=_record_block(s.L, fm), BVC=bv, VPER=s.V // cfg.v_split,
        IS_KDA=step.is_kda, HAS_FF=step.force_flush is not None, USE_L2NORM=step.use_l2norm,
        FLUSH_MODE=FLUSH_MODES[fm], PF=cfg.prefetch, PASS=rows, EVICT="evict_first" if evict_first else "",
        ROW_MAJOR=cfg.row_major, HAS_MAP=step.ring_map is not None, num_warps=nw, num_stages=num_stages, **extra,
    )  # fmt: skip
