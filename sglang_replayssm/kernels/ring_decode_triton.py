"""Output-only ReplaySSM ring decode for GDN and KDA (Triton), a drop-in for SGLang 0.5.23's kernel.

:func:`ring_decode_triton` has the signature and the semantics of SGLang 0.5.23's
``fused_recurrent_linear_replayssm_decode`` (``sglang/kernels/ops/attention/linear/
fused_recurrent_linear_replayssm.py``): same ring layout, same per-row cursor, same flush rule,
same in-place checkpoint update. It is written from the math, not from SGLang's source.

Ring layout (one persistent slot, one layer; ``L`` = ring length)::

    initial_state [slots, HV, V, K]   checkpoint S0 (K contiguous); rewritten only on a flush
    d_cache       [slots, HV, L, V]   corrected deltas d_j
    k_cache       [slots, H,  L, K]   L2-normalised keys k_j (one per key head)
    g_cache       [slots, HV, L] fp32 (GDN, one log-decay per head) or [slots, HV, L, K] (KDA)

Cursor and flush (per decode row ``n`` with ``slot = ssm_state_indices[n]``, ``m = write_pos[n]``):

* records ``0..m-1`` are live; the state before this token is
  ``S = S0 . Diag(A) + sum_{j<m} d_j (W_j o k_j)^T`` with ``A = exp(sum_j g_j)`` and
  ``W_j = exp(sum_{i>j} g_i)`` (scalars for GDN, K vectors for KDA);
* the step is a *flush* when ``m == L-1`` or ``force_flush[n] != 0``. A flush writes
  ``S . Diag(alpha) + d_cur k^T`` into ``initial_state[slot]`` and leaves the ring alone; the
  caller then sets the cursor to 0 (see :mod:`sglang_replayssm.kernels.cursor`);
* otherwise the step appends its record ``(d_cur, k, g)`` at ring position ``m`` (``m < L``) and
  the caller sets the cursor to ``m + 1``;
* rows with ``slot < 0`` are padding: their output is zero and nothing else is touched.

What differs from SGLang's kernel (the function computed is the same):

* *Output-only form.* On a non-flush step the state is never rebuilt. With ``alpha = exp(g_cur)``
  the read-out is ``S (alpha o q) = S0 (A o alpha o q) + sum_j d_j ((W_j o k_j) . (alpha o q))``:
  one streamed pass over ``S0`` (two fused mat-vecs, for ``q`` and ``k``), ``L`` dot products of
  length K per program and one ``[V, L]`` mat-vec over the delta ring. SGLang rebuilds
  ``S0 + D K^T`` tile by tile with a rank-``L`` tensor-core product every step.
* *Streaming.* A program owns one (row, value head) and ``V / v_split`` rows of it, streamed in
  chunks of ``block_v`` rows with 1-2 chunks requested ahead; the first chunks are requested
  before the per-program setup (norms, gates, key ring) so that its latency overlaps the stream.
  With ``split`` the flush path lives in a second launch, so the every-step kernel is small.
* *Exact fp32.* No bf16/TF32 rounding anywhere: the ring stores ``k`` in the ring's dtype (SGLang
  first rounds it to the output dtype) and the flush's rank-``m`` fold runs in IEEE fp32
  (``flush_mode`` ``"fma"`` or ``"ieee"``); ``"tf32x3"`` (3xTF32 tensor cores) is an option.

Invariants the kernel relies on (checked by the wrapper): ``K`` and ``V`` are powers of two,
``block_v * v_split`` divides ``V``, ``HV % H == 0``; ``write_pos``/``force_flush`` are int32
``[B]``; ``g_cache`` is fp32; the last dim of every tensor is contiguous and the ring tensors
are contiguous within a slot.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

__all__ = [
    "FLUSH_MODES",
    "RingDecodeConfig",
    "pick_config",
    "ring_decode_triton",
    "gdn_ring_decode_triton",
    "kda_ring_decode_triton",
]

#: How the flush step folds the live records into each checkpoint chunk.
#: ``fma``: an unrolled loop over the ring positions with IEEE fp32 FMAs (no ``tl.dot``);
#: ``tf32x3``: ``tl.dot`` with 3xTF32 (tensor cores, near fp32); ``ieee``: ``tl.dot`` in IEEE fp32.
FLUSH_MODES: dict[str, int] = {"fma": 0, "tf32x3": 1, "ieee": 2}

_SOFTPLUS_THRESHOLD = 20.0
_L2NORM_EPS = 1e-6


@triton.jit
def _flush_chunk(
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
    slot,
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
            d_j = tl.load(d_ring + slot * stride_d + (hv * L + j) * V + v0 + o_r, mask=(o_r < BVC) & ok, other=0.0)
            k_j = tl.load(k_ring + slot * stride_k + (i_h * L + j) * K + o_k, mask=(o_k < K) & ok, other=0.0)
            if IS_KDA:
                g_j = tl.load(g_ring + slot * stride_g + (hv * L + j) * K + o_k, mask=(o_k < K) & ok, other=0.0)
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
def _head_setup(
    qkv,
    a,
    b,
    A_log,
    dt_bias,
    k_ring,
    g_ring,
    slot,
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
        q_fac = scale / tl.sqrt(tl.sum(q * q, axis=0) + 1e-6)
        k_fac = 1.0 / tl.sqrt(tl.sum(k * k, axis=0) + 1e-6)
    else:
        q_fac = scale + tl.zeros([], dtype=tl.float32)
        k_fac = 1.0 + tl.zeros([], dtype=tl.float32)
    q = q * q_fac
    k = k * k_fac
    kq = tl.sum(k * q, axis=0)

    # Key ring of this key head: [BC, K], rows j >= m masked to zero.
    p_kr = k_ring + slot * stride_k + (i_h * L + o_c[:, None]) * K + o_k[None, :]
    kr = tl.load(p_kr, mask=valid[:, None], other=0.0).to(tl.float32)
    a_decay = tl.exp(tl.load(A_log + hv).to(tl.float32))
    b_raw = tl.load(b + i_n * stride_b + hv).to(tl.float32)
    beta = tl.sigmoid(b_raw).to(b.dtype.element_ty).to(tl.float32)
    # Per head: read-out vectors qv/kv (applied to S0 rows), record coefficients cqv/ckv
    # (applied to the delta ring), flush scale sa (on S0) and flush factors fw/fk (on the ring).
    if not IS_KDA:
        gr = tl.load(g_ring + slot * stride_g + hv * L + o_c, mask=valid, other=0.0)
        g_tot = tl.sum(gr, axis=0)
        suffix = tl.cumsum(gr, axis=0, reverse=True) - gr  # sum_{i>j} g_i
        x = tl.load(a + i_n * stride_a + hv).to(tl.float32) + tl.load(dt_bias + hv).to(tl.float32)
        sp = tl.where(x <= 20.0, tl.log(1.0 + tl.exp(tl.minimum(x, 20.0))), x)
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
        p_gr = g_ring + slot * stride_g + (hv * L + o_c[:, None]) * K + o_k[None, :]
        gr = tl.load(p_gr, mask=valid[:, None], other=0.0)  # [BC, K]
        g_tot = tl.sum(gr, axis=0)  # [K]
        suffix = tl.cumsum(gr, axis=0, reverse=True) - gr
        x = tl.load(a + i_n * stride_a + hv * K + o_k).to(tl.float32) + tl.load(dt_bias + hv * K + o_k).to(
            tl.float32
        )
        sp = tl.where(x <= 20.0, tl.log(1.0 + tl.exp(tl.minimum(x, 20.0))), x)
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
def _program_row(
    slots,
    write_pos,
    force_flush,
    H: tl.constexpr,
    HV: tl.constexpr,
    L: tl.constexpr,
    HAS_FF: tl.constexpr,
    ROW_MAJOR: tl.constexpr,
):
    """``(row, value head, key head, slot, cursor, is_flush)`` of this program (grid axes 1 and 2;
    with ``ROW_MAJOR`` consecutive programs walk the heads of one row, one contiguous slot)."""
    if ROW_MAJOR:
        hv = tl.program_id(1)
        i_n = tl.program_id(2)
    else:
        i_n = tl.program_id(1)
        hv = tl.program_id(2)
    slot = tl.load(slots + i_n).to(tl.int64)
    m = tl.load(write_pos + i_n).to(tl.int32)
    is_flush = m == L - 1
    if HAS_FF:
        is_flush = is_flush | (tl.load(force_flush + i_n) != 0)
    return i_n, hv, hv // (HV // H), slot, m, is_flush


@triton.jit
def _append_key_record(
    g_ring,
    k_ring,
    slot,
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
        tl.store(g_ring + slot * stride_g + (hv * L + m) * K + o_k, g_cur, mask=(o_k < K) & in_ring)
    else:
        tl.store(g_ring + slot * stride_g + hv * L + m, g_cur, mask=in_ring)
    if hv % (HV // H) == 0:
        tl.store(
            k_ring + slot * stride_k + (i_h * L + m) * K + o_k,
            k.to(k_ring.dtype.element_ty),
            mask=(o_k < K) & in_ring,
        )


@triton.jit
def _ring_decode_kernel(
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
):
    """One program: decode row ``pid(1)``, value head ``pid(2)``, V rows ``[pid(0)*VPER, +VPER)``
    streamed in chunks of ``BVC`` rows with ``PF`` (1 or 2) chunks in flight ahead of the one being
    computed; the first chunks are requested before the per-program setup so that the setup's
    latency overlaps the state stream.

    ``PASS``: 0 = every row; 1 = non-flush rows only (flush code compiled out); 2 = flush rows
    only. Padded rows (slot < 0) get a zero output in passes 0 and 1.
    """
    i_s = tl.program_id(0)
    i_n, hv, i_h, slot, m, is_flush = _program_row(slots, write_pos, force_flush, H, HV, L, HAS_FF, ROW_MAJOR)
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
    p_d = d_ring + slot * stride_d + (hv * L + o_c[None, :]) * V + v_base + o_r[:, None]
    s_cur = tl.load(p_s, eviction_policy=EVICT).to(tl.float32)  # [BVC, K]
    d_cur_t = tl.load(p_d, mask=valid[None, :], other=0.0).to(tl.float32)  # [BVC, BC]
    if PF == 2:
        s_nxt = tl.load(p_s + BVC * K, mask=row_ok & (NCH > 1), other=0.0, eviction_policy=EVICT).to(tl.float32)
        d_nxt = tl.load(p_d + BVC, mask=valid[None, :] & (NCH > 1), other=0.0).to(tl.float32)

    k, kq, beta, qv, kv, cqv, ckv, sa, fw, fk, alpha, g_tot, g_cur, _, _ = _head_setup(
        qkv, a, b, A_log, dt_bias, k_ring, g_ring, slot, i_n, hv, i_h, valid, scale,
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
        p_dw = d_ring + slot * stride_d + (hv * L + m) * V + v0 + o_r
        if PASS == 1:
            tl.store(p_dw, d_cur.to(d_ring.dtype.element_ty), mask=(o_r < BVC) & in_ring)
        elif PASS == 2:
            acc = _flush_chunk(s_cur, d_cur_t, fk, sa, fw, alpha, g_tot, d_cur, k, d_ring, k_ring, g_ring, slot,
                               stride_d, stride_k, stride_g, hv, i_h, v0, m, o_r, o_k, o_c,
                               K, V, L, BC, BVC, IS_KDA, FLUSH_MODE)  # fmt: skip
            tl.store(p_s + c * BVC * K, acc.to(state.dtype.element_ty))
        else:
            if is_flush:
                acc = _flush_chunk(s_cur, d_cur_t, fk, sa, fw, alpha, g_tot, d_cur, k, d_ring, k_ring, g_ring,
                                   slot, stride_d, stride_k, stride_g, hv, i_h, v0, m, o_r, o_k, o_c,
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
            _append_key_record(g_ring, k_ring, slot, stride_g, stride_k, hv, i_h, m, g_cur, k, in_ring,
                               H, HV, K, L, IS_KDA)  # fmt: skip


class RingDecodeConfig(NamedTuple):
    """Launch choice; see :func:`pick_config`.

    ``block_v``: V rows per streamed chunk; ``v_split``: programs per (row, value head), each
    streaming ``V / v_split`` rows; ``flush_mode``: see :data:`FLUSH_MODES`; ``prefetch``: chunks
    in flight ahead of the one being computed (1 or 2, ``engine="regs"`` only); ``split``: two
    launches per step, one for non-flush rows (compiled without the flush path) and one for flush
    rows; ``engine``: ``"regs"`` (chunks prefetched into registers, this module's kernel) or
    ``"slices"`` (non-flush rows by :func:`.ring_decode_slices.ring_read_rows_kernel`: row chunks
    of ``block_v`` held as column slices of ``slice_k``, ``slices_first`` / ``perm_rows`` pick its
    tile order, ``num_stages`` > 1 streams through shared memory; flush rows by this module's
    kernel with ``flush_block_v`` / ``flush_num_warps``; always split) or ``"cuda"`` (non-flush
    rows by ``csrc/ring_read.cu`` through :mod:`.ring_decode_cuda`, ``cuda_warps`` (row, head) pairs
    per block, register budget for ``cuda_min_blocks`` blocks per SM; flush rows by the same file's
    flush pass with ``cuda_flush`` (budget ``cuda_flush_min_blocks``), else as for ``"slices"``;
    ``cuda_stages`` / ``cuda_flush_stages``: checkpoint chunks staged per warp through ``cp.async``
    in the two passes (0: two register buffers); ``cuda_bulk`` / ``cuda_flush_bulk``: a staged
    chunk's checkpoint rows by one sm_90 bulk copy instead of ``cp.async`` per lane;
    ``cuda_vsplit``: warps per (row, head); ``cuda_waves`` / ``cuda_flush_waves``: grid cap of each
    pass in resident sets of blocks (0: one warp per (row, head) item); ``cuda_tail``: the
    non-flush pass's last items served in halves (quarters of the resident warps; 0: none);
    ``cuda_overlap``: the flush pass on a side stream, concurrent with the non-flush pass);
    ``row_major``: program order (the heads of one row consecutive).
    """

    block_v: int
    v_split: int
    num_warps: int
    flush_mode: str
    prefetch: int
    split: bool
    engine: str = "regs"
    num_stages: int = 1
    slice_k: int = 32
    slices_first: bool = False
    perm_rows: bool = False
    flush_block_v: int | None = None
    flush_num_warps: int | None = None
    row_major: bool = False
    cuda_warps: int = 4
    cuda_min_blocks: int = 4
    cuda_flush: bool = True
    cuda_flush_min_blocks: int = 1
    cuda_stages: int = 0
    cuda_flush_stages: int = 0
    cuda_bulk: bool = False
    cuda_flush_bulk: bool = False
    cuda_vsplit: int = 1
    cuda_waves: int = 0
    cuda_flush_waves: int = 0
    cuda_tail: int = 0
    cuda_overlap: bool = False


def pick_config(
    B: int, H: int, HV: int, K: int, V: int, L: int, *, is_kda: bool, cuda: bool = False
) -> RingDecodeConfig:
    """Default launch configuration, from the H200 sweeps recorded in notes/kernels.md.

    ``cuda``: the CUDA passes of ``csrc/ring_read.cu`` can run for these inputs; they won at
    B >= 64 for both gate kinds (fewer instructions per byte than any Triton form) and are used
    from B >= 16. Otherwise Triton: one-warp programs streaming 8-row chunks (more resident
    programs per SM beat wider tiles), the heads of one row walked consecutively, and for KDA the
    column-slice read pass (its heavier per-program setup leaves fewer instructions for the
    stream). Below 4096 (row, head) pairs V is split across programs so the GPU fills. Small
    batches keep one Triton launch.
    """
    v_split = 1
    while B * HV * v_split < 4096 and V // (v_split * 2) >= min(V, 16):
        v_split *= 2
    if B >= 16:
        if cuda and K == 128 and V == 128 and L <= 16:
            from .ring_decode_cuda import DEFAULT_BUILD

            mb, fmb, st, fst, bulk, fbulk = DEFAULT_BUILD
            return RingDecodeConfig(min(V, 8), v_split, 1, "fma", 1, True, engine="cuda", cuda_warps=2,
                                    cuda_min_blocks=mb, cuda_flush_min_blocks=fmb, cuda_stages=st,
                                    cuda_flush_stages=fst, cuda_bulk=bulk, cuda_flush_bulk=fbulk,
                                    cuda_flush_waves=1, cuda_tail=4, cuda_overlap=True,
                                    row_major=True)  # fmt: skip
        if is_kda and K % 32 == 0:
            return RingDecodeConfig(min(V, 8), v_split, 1, "fma", 1, True, engine="slices", slice_k=32,
                                    flush_block_v=min(V, 8), flush_num_warps=1, row_major=True)  # fmt: skip
        return RingDecodeConfig(min(V, 8), v_split, 1, "fma", 1, True, row_major=True)
    if is_kda:
        return RingDecodeConfig(min(V, 16), v_split, 4, "fma", 1, False)
    return RingDecodeConfig(min(V, 8), v_split, 1, "fma", 2, False)


_SIDE: dict[int, tuple[torch.cuda.Stream, torch.cuda.Event, torch.cuda.Event]] = {}


def _side_stream(device: torch.device) -> tuple[torch.cuda.Stream, torch.cuda.Event, torch.cuda.Event]:
    """The CUDA flush pass's side stream of this device with its fork and join events, created on
    first use and reused (a wait binds to the event's latest record, so reuse is safe and a step
    allocates nothing)."""
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _SIDE:
        _SIDE[idx] = (torch.cuda.Stream(device=idx), torch.cuda.Event(), torch.cuda.Event())
    return _SIDE[idx]


def _cuda_unfit(
    mixed_qkv: torch.Tensor, a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor,
    out: torch.Tensor, state: torch.Tensor, d: torch.Tensor, k: torch.Tensor, g: torch.Tensor,
    slots: torch.Tensor, K: int, V: int, L: int, *, forced: bool,
) -> str | None:  # fmt: skip
    """Why the CUDA passes cannot take this step (``None``: they can). Unless ``forced``, a build
    that cannot happen here is a reason too (the default then runs Triton, same results); a forced
    ``engine="cuda"`` lets the build report its own error."""
    if not mixed_qkv.is_cuda:
        return "tensors are not on a CUDA device"
    from .ring_decode_cuda import available, supports

    why = supports(mixed_qkv, a, b, A_log, dt_bias, out, state, d, k, g, slots, K, V, L)
    if why is None and not forced and not available():
        why = "the CUDA passes cannot be built or loaded here"
    return why


def _record_block(L: int, flush_mode: str) -> int:
    """Ring positions a program tiles: ``L`` rounded up to a power of two, at least 16 for ``tl.dot``."""
    bc = triton.next_power_of_2(L)
    return bc if flush_mode == "fma" else max(bc, 16)


def _check_inputs(
    mixed_qkv: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    initial_state: torch.Tensor,
    d_cache: torch.Tensor,
    k_cache: torch.Tensor,
    g_cache: torch.Tensor,
    out: torch.Tensor,
    ssm_state_indices: torch.Tensor,
    write_pos: torch.Tensor,
    force_flush: torch.Tensor | None,
    is_kda: bool,
) -> tuple[int, int, int, int, int, int]:
    """Validate shapes/dtypes/strides; return ``(B, H, HV, K, V, L)``."""
    if mixed_qkv.ndim != 2 or mixed_qkv.stride(-1) != 1:
        raise ValueError("mixed_qkv must be 2D [B, 2*H*K + HV*V] with a contiguous last dim")
    if initial_state.ndim != 4 or initial_state.stride(-1) != 1:
        raise ValueError("initial_state must be [slots, HV, V, K] with a contiguous last dim")
    _, HV, V, K = initial_state.shape
    if initial_state.stride(-2) != K or initial_state.stride(-3) != V * K:
        raise ValueError("initial_state must be contiguous within a slot")
    B = mixed_qkv.shape[0]
    q_dim2 = mixed_qkv.shape[1] - HV * V
    if q_dim2 <= 0 or q_dim2 % (2 * K) != 0:
        raise ValueError(f"mixed_qkv last dim {mixed_qkv.shape[1]} does not fit HV={HV}, V={V}, K={K}")
    H = q_dim2 // (2 * K)
    if HV % H != 0:
        raise ValueError(f"HV={HV} is not a multiple of H={H}")
    if K & (K - 1) or V & (V - 1):
        raise ValueError(f"K={K} and V={V} must be powers of two")
    L = d_cache.shape[2]
    if tuple(d_cache.shape[1:]) != (HV, L, V) or tuple(k_cache.shape[1:]) != (H, L, K):
        raise ValueError(
            f"ring shapes d {tuple(d_cache.shape)} k {tuple(k_cache.shape)} do not match HV={HV}, H={H}, L={L}"
        )
    g_expect = (HV, L, K) if is_kda else (HV, L)
    if tuple(g_cache.shape[1:]) != g_expect or g_cache.dtype != torch.float32:
        raise ValueError(f"g_cache must be fp32 [slots, {g_expect}] (got {tuple(g_cache.shape)} {g_cache.dtype})")
    for name, t in (("d_cache", d_cache), ("k_cache", k_cache), ("g_cache", g_cache)):
        if not t[0].is_contiguous():
            raise ValueError(f"{name} must be contiguous within a slot")
    if is_kda:
        if a.shape[0] != B or a.numel() != B * HV * K or a.stride(-1) != 1:
            raise ValueError(f"KDA a must be [B, HV, K] (got {tuple(a.shape)})")
        if dt_bias.numel() != HV * K or not dt_bias.is_contiguous():
            raise ValueError("KDA dt_bias must be a contiguous [HV, K]")
    else:
        if tuple(a.shape) != (B, HV) or a.stride(-1) != 1:
            raise ValueError(f"GDN a must be [B, HV] (got {tuple(a.shape)})")
        if dt_bias.numel() != HV:
            raise ValueError("GDN dt_bias must have HV elements")
    if b.shape[0] != B or b.numel() != B * HV or b.stride(-1) != 1:
        raise ValueError(f"b must be [B, HV] (got {tuple(b.shape)})")
    if A_log.numel() != HV:
        raise ValueError("A_log must have HV elements")
    if tuple(out.shape) != (B, 1, HV, V) or not out.is_contiguous():
        raise ValueError(f"out must be a contiguous [B, 1, HV, V] (got {tuple(out.shape)})")
    if write_pos.ndim != 1 or write_pos.dtype != torch.int32 or write_pos.shape[0] < B:
        raise ValueError("write_pos must be a 1D int32 tensor with at least B entries")
    if ssm_state_indices.ndim != 1 or ssm_state_indices.shape[0] < B:
        raise ValueError("ssm_state_indices must be 1D with at least B entries")
    if force_flush is not None and (force_flush.ndim != 1 or force_flush.dtype != torch.int32):
        raise ValueError("force_flush must be a 1D int32 tensor or None")
    return B, H, HV, K, V, L


def ring_decode_triton(
    mixed_qkv: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    scale: float,
    initial_state: torch.Tensor,
    d_cache: torch.Tensor,
    k_cache: torch.Tensor,
    g_cache: torch.Tensor,
    out: torch.Tensor,
    ssm_state_indices: torch.Tensor,
    write_pos: torch.Tensor,
    force_flush: torch.Tensor | None = None,
    use_qk_l2norm_in_kernel: bool = False,
    is_kda: bool = False,
    block_v: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
    nk: int | None = None,
    *,
    v_split: int | None = None,
    flush_mode: str | None = None,
    prefetch: int | None = None,
    split: bool | None = None,
    evict_first: bool = False,
    row_major: bool | None = None,
    maxnreg: int | None = None,
    flush_block_v: int | None = None,
    flush_num_warps: int | None = None,
    engine: str | None = None,
    slice_k: int | None = None,
    slices_first: bool | None = None,
    perm_rows: bool | None = None,
    cuda_warps: int | None = None,
    cuda_min_blocks: int | None = None,
    cuda_flush: bool | None = None,
    cuda_flush_min_blocks: int | None = None,
    cuda_stages: int | None = None,
    cuda_flush_stages: int | None = None,
    cuda_bulk: bool | None = None,
    cuda_flush_bulk: bool | None = None,
    cuda_vsplit: int | None = None,
    cuda_waves: int | None = None,
    cuda_flush_waves: int | None = None,
    cuda_tail: int | None = None,
    cuda_overlap: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One ReplaySSM decode step for a batch; drop-in for SGLang's ``fused_recurrent_linear_replayssm_decode``.

    Arguments are SGLang's (``nk`` is accepted and ignored: this kernel never tiles K; ``block_v``
    is the streamed chunk height; ``num_stages`` defaults to 1). Keyword-only extras select the
    launch (defaults from :func:`pick_config`): ``v_split`` programs per (row, head),
    ``flush_mode`` (see :data:`FLUSH_MODES`), ``prefetch`` (1 or 2 chunks ahead), ``split``
    (separate launches for non-flush and flush rows), ``evict_first`` (L2 hint on the state stream),
    ``row_major`` (program order: heads of one row consecutive), ``maxnreg`` (register cap),
    ``flush_block_v`` / ``flush_num_warps`` (chunk height / warps of the flush launch when split),
    ``engine`` / ``slice_k`` / ``slices_first`` / ``perm_rows`` (see :class:`RingDecodeConfig`;
    with ``engine="slices"``, ``num_stages`` is the read pass's software-pipeline depth).

    Writes ``out`` (``[B, 1, HV, V]``) for every row, appends one ring record for non-flush rows
    and rewrites ``initial_state[slot]`` for flush rows (module docstring). Does not advance
    ``write_pos``. Returns ``(out, initial_state)`` like SGLang's wrapper.
    """
    del nk
    B, H, HV, K, V, L = _check_inputs(
        mixed_qkv, a, b, A_log, dt_bias, initial_state, d_cache, k_cache, g_cache, out,
        ssm_state_indices, write_pos, force_flush, is_kda,
    )  # fmt: skip
    if B == 0:
        return out, initial_state
    cuda_why = "not requested"
    if engine in (None, "cuda"):
        cuda_why = _cuda_unfit(
            mixed_qkv, a, b, A_log, dt_bias, out, initial_state, d_cache, k_cache, g_cache, ssm_state_indices,
            K, V, L, forced=engine == "cuda",
        )  # fmt: skip
    cfg = pick_config(B, H, HV, K, V, L, is_kda=is_kda, cuda=cuda_why is None)
    bv = min(block_v if block_v is not None else cfg.block_v, V)
    vs = v_split if v_split is not None else cfg.v_split
    nw = num_warps if num_warps is not None else cfg.num_warps
    fm = flush_mode if flush_mode is not None else cfg.flush_mode
    pf = int(prefetch if prefetch is not None else cfg.prefetch)
    sp = split if split is not None else cfg.split
    if bv <= 0 or bv & (bv - 1) or V % (bv * vs) != 0:
        raise ValueError(f"block_v={bv} must be a power of two with block_v * v_split dividing V={V}")
    if pf not in (1, 2):
        raise ValueError(f"prefetch must be 1 or 2 (got {pf})")
    if fm not in FLUSH_MODES:
        raise ValueError(f"flush_mode must be one of {sorted(FLUSH_MODES)}")
    if fm != "fma" and bv < 16:
        fm = "fma"  # tl.dot needs every dim >= 16
    bc = _record_block(L, fm)

    eng = engine if engine is not None else cfg.engine
    if eng not in ("regs", "slices", "cuda"):
        raise ValueError(f"engine must be 'regs', 'slices' or 'cuda' (got {eng!r})")
    if eng in ("slices", "cuda"):
        sp = True
    a_arg = a.reshape(B, -1) if is_kda else a
    b_arg = b.reshape(B, -1)
    row_major = cfg.row_major if row_major is None else row_major
    grid = (vs, HV, B) if row_major else (vs, B, HV)
    launches = [(0, bv, nw, fm, bc)]
    if sp:
        flush_block_v = flush_block_v if flush_block_v is not None else cfg.flush_block_v
        flush_num_warps = flush_num_warps if flush_num_warps is not None else cfg.flush_num_warps
        fbv = min(flush_block_v if flush_block_v is not None else bv, V // vs)
        if fbv <= 0 or fbv & (fbv - 1) or (V // vs) % fbv != 0:
            raise ValueError(f"flush_block_v={fbv} must be a power of two dividing V/v_split={V // vs}")
        ffm = fm if (fm == "fma" or fbv >= 16) else "fma"
        fbc = _record_block(L, ffm)
        fnw = flush_num_warps if flush_num_warps is not None else nw
        launches = [(1, bv, nw, fm, bc), (2, fbv, fnw, ffm, fbc)]
    ff_arg = force_flush if force_flush is not None else write_pos
    strides = (
        mixed_qkv.stride(0), a_arg.stride(0), b_arg.stride(0), initial_state.stride(0),
        d_cache.stride(0), k_cache.stride(0), g_cache.stride(0),
    )  # fmt: skip
    extra = {"maxnreg": maxnreg} if maxnreg else {}
    if eng == "cuda":
        from .ring_decode_cuda import CudaReadUnsupported, launch_step

        if cuda_why is not None:
            raise CudaReadUnsupported(f"engine='cuda': {cuda_why}")

        # the launch's CUDA knobs: the defaults with the caller's overrides
        knobs = {
            "cuda_warps": cuda_warps, "cuda_min_blocks": cuda_min_blocks, "cuda_flush": cuda_flush,
            "cuda_flush_min_blocks": cuda_flush_min_blocks, "cuda_stages": cuda_stages,
            "cuda_flush_stages": cuda_flush_stages, "cuda_bulk": cuda_bulk, "cuda_flush_bulk": cuda_flush_bulk,
            "cuda_vsplit": cuda_vsplit, "cuda_waves": cuda_waves, "cuda_flush_waves": cuda_flush_waves,
            "cuda_tail": cuda_tail, "cuda_overlap": cuda_overlap,
        }  # fmt: skip
        cc = cfg._replace(**{name: v for name, v in knobs.items() if v is not None})

        def cuda_pass(flush: bool) -> None:
            launch_step(
                mixed_qkv, a_arg, b_arg, A_log, dt_bias, out, initial_state, d_cache, k_cache, g_cache,
                ssm_state_indices, write_pos, force_flush, float(scale), strides, B=B, H=H, HV=HV, K=K, V=V,
                L=L, is_kda=is_kda, use_l2norm=use_qk_l2norm_in_kernel, flush=flush, warps=cc.cuda_warps,
                min_blocks=cc.cuda_min_blocks, flush_min_blocks=cc.cuda_flush_min_blocks, stages=cc.cuda_stages,
                flush_stages=cc.cuda_flush_stages, bulk=cc.cuda_bulk, flush_bulk=cc.cuda_flush_bulk,
                vsplit=cc.cuda_vsplit, waves=cc.cuda_flush_waves if flush else cc.cuda_waves,
                tail=0 if flush else cc.cuda_tail,
            )  # fmt: skip

        if cc.cuda_flush and cc.cuda_overlap:
            # The passes serve disjoint rows (distinct slots): the flush pass runs on a side stream
            # forked from and joined back to the current one, so the two overlap on the GPU (two
            # parallel nodes when captured in a CUDA graph) and an empty pass costs no step time.
            main = torch.cuda.current_stream(mixed_qkv.device)
            side, fork, join = _side_stream(mixed_qkv.device)
            fork.record(main)
            side.wait_event(fork)
            with torch.cuda.stream(side):
                cuda_pass(True)
            join.record(side)
            cuda_pass(False)
            main.wait_event(join)
        else:
            for flush in (False, True) if cc.cuda_flush else (False,):
                cuda_pass(flush)
        launches = [] if cc.cuda_flush else launches[1:]
    if eng == "slices":
        from .ring_decode_slices import ring_read_rows_kernel

        ks = slice_k if slice_k is not None else cfg.slice_k
        if ks < 4 or ks & (ks - 1) or K % ks != 0:
            raise ValueError(f"slice_k={ks} must be a power of two >= 4 dividing K={K}")
        ring_read_rows_kernel[grid](
            mixed_qkv, a_arg, b_arg, A_log, dt_bias, out, initial_state, d_cache, k_cache, g_cache,
            ssm_state_indices, write_pos, ff_arg, float(scale), *strides,
            H=H, HV=HV, K=K, V=V, L=L, BC=triton.next_power_of_2(L), BV=bv, KS=ks, VPER=V // vs,
            QF=slices_first if slices_first is not None else cfg.slices_first,
            PERM=perm_rows if perm_rows is not None else cfg.perm_rows, IS_KDA=is_kda,
            NS=num_stages if num_stages is not None else cfg.num_stages,
            HAS_FF=force_flush is not None, USE_L2NORM=use_qk_l2norm_in_kernel, ROW_MAJOR=row_major,
            num_warps=nw, num_stages=1,
        )  # fmt: skip
        launches = launches[1:]
    for pass_id, l_bv, l_nw, l_fm, l_bc in launches:
        _ring_decode_kernel[grid](
            mixed_qkv, a_arg, b_arg, A_log, dt_bias, out, initial_state, d_cache, k_cache, g_cache,
            ssm_state_indices, write_pos, ff_arg, float(scale), *strides,
            H=H, HV=HV, K=K, V=V, L=L, BC=l_bc, BVC=l_bv, VPER=V // vs, IS_KDA=is_kda,
            HAS_FF=force_flush is not None, USE_L2NORM=use_qk_l2norm_in_kernel,
            FLUSH_MODE=FLUSH_MODES[l_fm], PF=pf, PASS=pass_id, EVICT="evict_first" if evict_first else "",
            ROW_MAJOR=row_major, num_warps=l_nw, num_stages=1 if eng != "regs" or num_stages is None else num_stages,
            **extra,
        )  # fmt: skip
    return out, initial_state


def gdn_ring_decode_triton(*args, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`ring_decode_triton` with ``is_kda=False`` (GDN, per-head scalar gate)."""
    kwargs["is_kda"] = False
    return ring_decode_triton(*args, **kwargs)


def kda_ring_decode_triton(*args, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`ring_decode_triton` with ``is_kda=True`` (KDA, per-channel gate)."""
    kwargs["is_kda"] = True
    return ring_decode_triton(*args, **kwargs)
