"""Triton ring decode with a low-precision read copy: the math of :mod:`sglang_replayssm.kernels.read_copy_ref`, fused.

One program owns one (decode row, value head) and ``BV`` of its ``V`` state rows (grid
``(V // BV, B, HV)``). Every state row is independent (``d_j[v]`` needs only row ``v`` of
``S_{j-1}``), so both paths stay inside the tile:

* non-flush: the tile of the copy (``[BV, K]`` bf16, or e4m3 times its fp32 scales) is read once;
  the ``m`` live records enter through their coefficients (``sum_j replay_j d~_j (k_j . x)``, the
  fold of SGLang's kernel, never forming the state); the record ``(d~, k, g, v, beta)`` is appended.
* flush: the fp32 checkpoint tile is read, the ``m`` records' raw inputs are replayed one step at a
  time in fp32 FMAs (decay, ``d_j = beta_j (v_j - S k_j)``, rank-1 update), then this token; the
  checkpoint tile and its copy are written (448.0 in the kernel is e4m3 max,
  :data:`sglang_replayssm.kernels.read_copy_format.FP8_MAX`; fp8 scales are per V row for both models, local to the tile).

Padded rows (slot < 0) get a zero output and nothing else. Layout: every tensor contiguous
(:func:`read_copy_decode_triton` checks), K and V powers of two.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from sglang_replayssm.kernels.read_copy_ref import check_read_copy_args
from sglang_replayssm.kernels.ring_decode_args import check_ring_decode_args

__all__ = ["read_copy_decode_kernel", "read_copy_decode_triton"]


@triton.jit
def _round_bf16(x):
    """fp32 ``x`` rounded to the nearest bf16 (ties to even), as fp32: by bits, because the Triton
    interpreter's fp32->bf16 cast truncates while the compiled one rounds (finite inputs)."""
    bits = x.to(tl.uint32, bitcast=True)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000).to(tl.float32, bitcast=True)


@triton.jit
def read_copy_decode_kernel(
    qkv, a, b, A_log, dt_bias, out, state, copy, scales, d_ring, k_ring, g_ring, v_ring, beta_ring,
    slots, write_pos, force_flush, scale,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, L: tl.constexpr, BC: tl.constexpr,
    BV: tl.constexpr, IS_KDA: tl.constexpr, FP8: tl.constexpr, HAS_FF: tl.constexpr, USE_L2NORM: tl.constexpr,
):  # fmt: skip
    """See the module docstring. ``scales``: fp32 ``[slots, HV, V]`` when ``FP8``."""
    i_v = tl.program_id(0)
    i_n = tl.program_id(1)
    hv = tl.program_id(2)
    i_h = hv // (HV // H)
    o_k = tl.arange(0, K)
    o_v = i_v * BV + tl.arange(0, BV)
    o_c = tl.arange(0, BC)
    slot = tl.load(slots + i_n).to(tl.int64)
    p_out = out + (i_n * HV + hv) * V + o_v
    if slot < 0:
        tl.store(p_out, tl.zeros([BV], dtype=tl.float32).to(out.dtype.element_ty))
        return
    m = tl.load(write_pos + i_n).to(tl.int32)
    is_flush = m == L - 1
    if HAS_FF:
        is_flush = is_flush | (tl.load(force_flush + i_n) != 0)

    # This token: normalised q (scaled) and k, v tile, gate, beta.
    row = qkv + i_n * (2 * H * K + HV * V)
    q = tl.load(row + i_h * K + o_k).to(tl.float32)
    k = tl.load(row + H * K + i_h * K + o_k).to(tl.float32)
    v = tl.load(row + 2 * H * K + hv * V + o_v).to(tl.float32)
    if USE_L2NORM:
        q = q / tl.sqrt(tl.sum(q * q) + 1e-6)
        k = k / tl.sqrt(tl.sum(k * k) + 1e-6)
    q = q * scale
    kq = tl.sum(k * q)
    A = tl.exp(tl.load(A_log + hv).to(tl.float32))
    if IS_KDA:
        xg = tl.load(a + (i_n * HV + hv) * K + o_k).to(tl.float32) + tl.load(dt_bias + hv * K + o_k).to(tl.float32)
    else:
        xg = tl.load(a + i_n * HV + hv).to(tl.float32) + tl.load(dt_bias + hv).to(tl.float32)
    g_cur = -A * tl.where(xg <= 20.0, tl.log(1.0 + tl.exp(xg)), xg)
    alpha = tl.exp(g_cur)
    beta = tl.sigmoid(tl.load(b + i_n * HV + hv).to(tl.float32))
    if b.dtype.element_ty == tl.bfloat16:
        beta = _round_bf16(beta)
    else:
        beta = beta.to(b.dtype.element_ty).to(tl.float32)

    p_tile = (slot * HV + hv) * V * K + o_v[:, None] * K + o_k[None, :]
    if is_flush:
        S = tl.load(state + p_tile)
        for j in range(0, m):
            kj = tl.load(k_ring + ((slot * H + i_h) * L + j) * K + o_k).to(tl.float32)
            if IS_KDA:
                S = S * tl.exp(tl.load(g_ring + ((slot * HV + hv) * L + j) * K + o_k))[None, :]
            else:
                S = S * tl.exp(tl.load(g_ring + (slot * HV + hv) * L + j))
            vj = tl.load(v_ring + ((slot * HV + hv) * L + j) * V + o_v).to(tl.float32)
            bj = tl.load(beta_ring + (slot * HV + hv) * L + j).to(tl.float32)
            dj = bj * (vj - tl.sum(S * kj[None, :], axis=1))
            S = S + dj[:, None] * kj[None, :]
        if IS_KDA:
            S = S * alpha[None, :]
        else:
            S = S * alpha
        d_cur = beta * (v - tl.sum(S * k[None, :], axis=1))
        tl.store(p_out, (tl.sum(S * q[None, :], axis=1) + d_cur * kq).to(out.dtype.element_ty))
        S = S + d_cur[:, None] * k[None, :]
        tl.store(state + p_tile, S)
        if FP8:  # one scale per V row
            amax = tl.max(tl.abs(S), axis=1)
            sc = tl.where(amax > 0, amax / 448.0, 1.0)
            tl.store(scales + (slot * HV + hv) * V + o_v, sc)
            cq = S / sc[:, None]
            tl.store(copy + p_tile, tl.clamp(cq, -448.0, 448.0).to(copy.dtype.element_ty))
        else:
            tl.store(copy + p_tile, _round_bf16(S).to(copy.dtype.element_ty))
    else:
        C = tl.load(copy + p_tile).to(tl.float32)
        if FP8:
            C = C * tl.load(scales + (slot * HV + hv) * V + o_v)[:, None]
        valid = o_c < m
        kr = tl.load(
            k_ring + ((slot * H + i_h) * L + o_c[:, None]) * K + o_k[None, :], mask=valid[:, None], other=0.0
        ).to(tl.float32)  # [BC, K]
        dr = tl.load(
            d_ring + ((slot * HV + hv) * L + o_c[None, :]) * V + o_v[:, None], mask=valid[None, :], other=0.0
        ).to(tl.float32)  # [BV, BC]
        if IS_KDA:
            gr = tl.load(
                g_ring + ((slot * HV + hv) * L + o_c[:, None]) * K + o_k[None, :], mask=valid[:, None], other=0.0
            )  # [BC, K]
            g_tot = tl.sum(gr, axis=0)  # [K]
            w = tl.where(valid[:, None], tl.exp(g_tot[None, :] - tl.cumsum(gr, axis=0)), 0.0) * kr
            xq = tl.exp(g_tot) * alpha * q
            xk = tl.exp(g_tot) * alpha * k
            sq = tl.sum(C * xq[None, :], axis=1) + tl.sum(dr * tl.sum(w * (alpha * q)[None, :], axis=1)[None, :], axis=1)
            sk = tl.sum(C * xk[None, :], axis=1) + tl.sum(dr * tl.sum(w * (alpha * k)[None, :], axis=1)[None, :], axis=1)
        else:
            gr = tl.load(g_ring + (slot * HV + hv) * L + o_c, mask=valid, other=0.0)  # [BC]
            g_tot = tl.sum(gr, axis=0)
            rep = tl.where(valid, tl.exp(g_tot - tl.cumsum(gr, axis=0)), 0.0) * alpha
            f = tl.exp(g_tot) * alpha
            sq = f * tl.sum(C * q[None, :], axis=1) + tl.sum(dr * (rep * tl.sum(kr * q[None, :], axis=1))[None, :], axis=1)
            sk = f * tl.sum(C * k[None, :], axis=1) + tl.sum(dr * (rep * tl.sum(kr * k[None, :], axis=1))[None, :], axis=1)
        d_cur = beta * (v - sk)
        tl.store(p_out, (sq + d_cur * kq).to(out.dtype.element_ty))
        rec = (slot * HV + hv) * L + m
        tl.store(d_ring + rec * V + o_v, d_cur.to(d_ring.dtype.element_ty))
        tl.store(v_ring + rec * V + o_v, v.to(v_ring.dtype.element_ty))
        if i_v == 0:
            tl.store(beta_ring + rec, beta.to(beta_ring.dtype.element_ty))
            if IS_KDA:
                tl.store(g_ring + rec * K + o_k, g_cur)
            else:
                tl.store(g_ring + rec, g_cur)
            if hv == i_h * (HV // H):
                tl.store(k_ring + ((slot * H + i_h) * L + m) * K + o_k, k.to(k_ring.dtype.element_ty))


def read_copy_decode_triton(
    mixed_qkv: torch.Tensor, a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor,
    scale: float, initial_state: torch.Tensor, read_copy: torch.Tensor, read_copy_scales: torch.Tensor | None,
    d_cache: torch.Tensor, k_cache: torch.Tensor, g_cache: torch.Tensor, v_cache: torch.Tensor,
    beta_cache: torch.Tensor, out: torch.Tensor, ssm_state_indices: torch.Tensor, write_pos: torch.Tensor,
    force_flush: torch.Tensor | None = None, use_qk_l2norm_in_kernel: bool = False, is_kda: bool = False,
    block_v: int = 32, num_warps: int = 4,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """Arguments and effects of :func:`sglang_replayssm.kernels.read_copy_ref.read_copy_decode_torch` (no per-call range or
    uniqueness checks on cursors and slots: the caller guarantees them, as for SGLang's kernel).
    ``block_v``: state rows per program."""
    B, H, HV, K, V, L = check_ring_decode_args(
        mixed_qkv, a, b, A_log, dt_bias, initial_state, d_cache, k_cache, g_cache, out,
        ssm_state_indices, write_pos, force_flush, is_kda,
    )  # fmt: skip
    check_read_copy_args(read_copy, read_copy_scales, v_cache, beta_cache, initial_state, L, is_kda)
    tensors = (mixed_qkv, a, b, dt_bias, initial_state, read_copy, d_cache, k_cache, g_cache, v_cache, beta_cache, out)
    if not all(t.is_contiguous() for t in tensors) or (K & (K - 1)) or (V & (V - 1)):
        raise ValueError("read_copy_decode_triton needs contiguous tensors and power-of-two K, V")
    fp8 = read_copy_scales is not None
    bv = min(block_v, V)
    grid = (V // bv, B, HV)
    read_copy_decode_kernel[grid](
        mixed_qkv, a, b, A_log, dt_bias, out, initial_state, read_copy,
        read_copy_scales if fp8 else initial_state, d_cache, k_cache, g_cache, v_cache, beta_cache,
        ssm_state_indices, write_pos, force_flush if force_flush is not None else write_pos, float(scale),
        H=H, HV=HV, K=K, V=V, L=L, BC=triton.next_power_of_2(L), BV=bv, IS_KDA=is_kda, FP8=fp8,
        HAS_FF=force_flush is not None, USE_L2NORM=use_qk_l2norm_in_kernel, num_warps=num_warps,
    )  # fmt: skip
    return out, initial_state
