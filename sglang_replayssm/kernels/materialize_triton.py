"""Triton kernel for ReplaySSM *materialize* (fold ring records into a checkpoint), all layers at once.

Math, shapes and invariants are those of :mod:`sglang_replayssm.kernels.materialize_ref`; this
kernel performs the same sequential fp32 fold, so both agree to fp32 rounding of exp().

Launch: one program per ``(block of rows, layer, value head, V tile)``; grid
``(cdiv(R, RB) * n_layers, HV, cdiv(V, BV))`` (the unbounded grid axis carries the row blocks). A
program walks its ``RB`` rows in order and skips a row whose source or destination is ``-1`` after
two scalar loads (with ``ring_src`` a live row's records are read at its ring row, one more load): the
decode track snapshot launches all B rows of a batch with only the tracked
ones live, and one program per row spent ~90 us per step at B=256 on empty programs (H200 profile).
``RB`` grows with ``R`` (:func:`rows_per_program`) so a few live rows still spread over the GPU.
For each live row a program loads its ``[BV, K]`` tile of the source checkpoint once, walks the row's ``count`` records with a runtime-bounded loop (each
``d_j[BV]``, ``k_j[K]`` and ``g_j`` read exactly once, nothing past ``count`` read at all), applies
``S <- S * exp(g_j) + d_j k_j^T`` in registers, and stores the tile to the destination slot.
Different programs touch disjoint state tiles, so ``dst == src`` (in place) is safe; the
cross-row rule (no row writes what another row reads) is checked by the wrapper.

The fold is memory bound (one read and one write of the state, plus ``count`` small records), so
it uses plain FMA arithmetic rather than ``tl.dot``: exact IEEE fp32 on every GPU (no TF32) and no
``tl.dot`` minimum-size constraint, which also lets it run under ``TRITON_INTERPRET=1``.
Sizing for the H200 shapes (K = V = 128): ``BV = 32`` gives a 32x128 fp32 tile (16 KiB) per
program and 4 * HV programs per (row, layer), enough to fill the GPU for a single row.
"""

from __future__ import annotations

import triton
import triton.language as tl

from sglang_replayssm.kernels.materialize_ref import MaterializeCall

__all__ = ["ROW_COUNT_ARGS", "materialize_kernel", "materialize_triton", "rows_per_program", "vk_tile"]

#: The kernel's per-call row counts, left unspecialized: Triton would compile apart a count of 1, one divisible by
#: 16 and any other (0.2 s each, the scheduler waiting, at a call's first new kind).
ROW_COUNT_ARGS = ("R", "rows_per_program")


@triton.jit
def vk_tile(i_hv, i_v, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr):
    """The ``[BV, BK]`` tile ``i_v`` of value head ``i_hv``'s ``[V, K]`` state: value / key offsets,
    their masks, the tile mask and the element offsets within one slot's ``[HV, V, K]``."""
    o_v = i_v * BV + tl.arange(0, BV)
    o_k = tl.arange(0, BK)
    mask_v = o_v < V
    mask_k = o_k < K
    mask_vk = mask_v[:, None] & mask_k[None, :]
    tile = (i_hv * V + o_v[:, None]) * K + o_k[None, :]
    return o_v, o_k, mask_v, mask_k, mask_vk, tile


@triton.jit(do_not_specialize=ROW_COUNT_ARGS)
def materialize_kernel(
    temporal,  # [n_layers, slots, HV, V, K]
    ring_d,  # [n_layers, slots, HV, L, V]
    ring_k,  # [n_layers, slots, H, L, K]
    ring_g,  # [n_layers, slots, HV, L] (GDN) or [n_layers, slots, HV, L, K] (KDA), fp32
    src_slots,  # [R]
    dst_slots,  # [R]
    counts,  # [R]
    ring_src,  # [R]: each row's ring row (read only with HAS_RING_SRC)
    R,
    rows_per_program,
    n_layers,
    stride_t_layer,
    stride_t_slot,
    stride_d_layer,
    stride_d_slot,
    stride_k_layer,
    stride_k_slot,
    stride_g_layer,
    stride_g_slot,
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    L: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    IS_KDA: tl.constexpr,
    HAS_RING_SRC: tl.constexpr,
):
    pid_rl = tl.program_id(0)
    i_hv = tl.program_id(1)
    i_v = tl.program_id(2)
    i_block = pid_rl // n_layers
    i_layer = (pid_rl % n_layers).to(tl.int64)
    i_h = i_hv // (HV // H)
    o_v, o_k, mask_v, mask_k, mask_vk, tile = vk_tile(i_hv, i_v, K, V, BK, BV)

    for r in range(0, rows_per_program):
        i_row = i_block * rows_per_program + r
        src = tl.load(src_slots + i_row, mask=i_row < R, other=-1).to(tl.int64)
        dst = tl.load(dst_slots + i_row, mask=i_row < R, other=-1).to(tl.int64)
        if (src >= 0) & (dst >= 0):
            count = tl.load(counts + i_row).to(tl.int32)
            ring = src
            if HAS_RING_SRC:
                ring = tl.load(ring_src + i_row).to(tl.int64)
            p_src = temporal + i_layer * stride_t_layer + src * stride_t_slot + tile
            S = tl.load(p_src, mask=mask_vk, other=0.0).to(tl.float32)

            base_d = ring_d + i_layer * stride_d_layer + ring * stride_d_slot + i_hv * (L * V)
            base_k = ring_k + i_layer * stride_k_layer + ring * stride_k_slot + i_h * (L * K)
            base_g = ring_g + i_layer * stride_g_layer + ring * stride_g_slot
            for j in range(0, count):
                d_j = tl.load(base_d + j * V + o_v, mask=mask_v, other=0.0).to(tl.float32)
                k_j = tl.load(base_k + j * K + o_k, mask=mask_k, other=0.0).to(tl.float32)
                if IS_KDA:
                    g_j = tl.load(base_g + (i_hv * L + j) * K + o_k, mask=mask_k, other=0.0)
                    S = S * tl.exp(g_j)[None, :] + d_j[:, None] * k_j[None, :]
                else:
                    g_j = tl.load(base_g + i_hv * L + j)
                    S = S * tl.exp(g_j) + d_j[:, None] * k_j[None, :]

            p_dst = temporal + i_layer * stride_t_layer + dst * stride_t_slot + tile
            tl.store(p_dst, S.to(p_dst.dtype.element_ty), mask=mask_vk)


def rows_per_program(R: int) -> int:
    """Rows one program walks: 1 up to 32 rows (every row its own program), then R / 32 capped at 16
    (at B=256: 8 rows, 32 row blocks per layer)."""
    return max(1, min(16, R // 32))


def materialize_triton(call: MaterializeCall, *, block_v: int = 32, num_warps: int = 4) -> None:
    """Launch :func:`materialize_kernel` for a checked call; same contract as ``materialize_torch``.

    ``block_v`` must be a power of two.
    """
    temporal, ring_d, ring_k, ring_g = call.temporal, call.ring_d, call.ring_k, call.ring_g
    n_layers, R, H, HV, K, V, L = call.dims
    if R == 0 or n_layers == 0:
        return
    if block_v <= 0 or block_v & (block_v - 1):
        raise ValueError(f"block_v must be a power of two, got {block_v}")
    BV = min(block_v, triton.next_power_of_2(V))
    RB = rows_per_program(R)
    grid = (triton.cdiv(R, RB) * n_layers, HV, triton.cdiv(V, BV))
    materialize_kernel[grid](
        temporal, ring_d, ring_k, ring_g,
        call.src_slots, call.dst_slots, call.counts, call.ring_rows,
        R, RB, n_layers,
        temporal.stride(0), temporal.stride(1),
        ring_d.stride(0), ring_d.stride(1),
        ring_k.stride(0), ring_k.stride(1),
        ring_g.stride(0), ring_g.stride(1),
        H=H, HV=HV, K=K, V=V, L=L,
        BK=triton.next_power_of_2(K), BV=BV,
        IS_KDA=call.is_kda, HAS_RING_SRC=call.ring_src is not None,
        num_warps=num_warps,
    )  # fmt: skip
