"""Triton kernel of the read copy's exact replay: ``temporal[dst] = fold(temporal[src], raw records)``.

Math and shapes are those of :func:`sglang_replayssm.kernels.read_copy_ref.replay_exact` (its torch
reference and fp64 oracle): from the fp32 checkpoint, for each of a row's first ``count`` records
``j``: ``S <- S . Diag(alpha_j)``, ``d_j = beta_j (v_j - S k_j)``, ``S <- S + d_j k_j^T`` with
``alpha_j = exp(g_j)`` (a scalar per value head for GDN, per key channel for KDA), the recurrence a
flush runs, so a moved state equals fp32 decode up to fp32 rounding order.

Unlike the torch reference it needs no host read (no ``nonzero``, no ``max``): rows with
``src < 0``, ``dst < 0`` or ``count <= 0`` exit at once, so the launch is capturable in a CUDA graph
(SGLang tracks decode states inside its decode graph). One program per ``(row, value head, V tile)``
holds a ``[BV, K]`` fp32 tile (the full key width: ``S k_j`` needs it), reads each record once and
writes the tile to ``dst``. Programs touch disjoint tiles; a row whose ``dst`` is another row's
``src`` is the caller's to avoid (track slots are distinct from working slots).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from sglang_replayssm.kernels.materialize_triton import vk_tile

__all__ = ["replay_exact_kernel", "replay_exact_triton"]


@triton.jit
def replay_exact_kernel(
    temporal,  # [slots, HV, V, K] fp32
    ring_k,  # [slots, H, L, K]
    ring_g,  # [slots, HV, L] (GDN) or [slots, HV, L, K] (KDA), fp32
    ring_v,  # [slots, HV, L, V]
    ring_beta,  # [slots, HV, L]
    src_slots,  # [R]
    dst_slots,  # [R]
    counts,  # [R]
    stride_t_slot,
    stride_k_slot,
    stride_g_slot,
    stride_v_slot,
    stride_b_slot,
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    L: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    IS_KDA: tl.constexpr,
):
    i_row = tl.program_id(0)
    i_hv = tl.program_id(1)
    i_v = tl.program_id(2)
    i_h = i_hv // (HV // H)
    src = tl.load(src_slots + i_row).to(tl.int64)
    dst = tl.load(dst_slots + i_row).to(tl.int64)
    count = tl.minimum(tl.load(counts + i_row).to(tl.int32), L)
    if (src >= 0) & (dst >= 0) & (count > 0):
        o_v, o_k, mask_v, mask_k, mask_vk, tile = vk_tile(i_hv, i_v, K, V, BK, BV)
        S = tl.load(temporal + src * stride_t_slot + tile, mask=mask_vk, other=0.0).to(tl.float32)
        base_k = ring_k + src * stride_k_slot + i_h * (L * K)
        base_g = ring_g + src * stride_g_slot
        base_v = ring_v + src * stride_v_slot + i_hv * (L * V)
        base_b = ring_beta + src * stride_b_slot + i_hv * L
        for j in range(0, count):
            k_j = tl.load(base_k + j * K + o_k, mask=mask_k, other=0.0).to(tl.float32)
            v_j = tl.load(base_v + j * V + o_v, mask=mask_v, other=0.0).to(tl.float32)
            b_j = tl.load(base_b + j).to(tl.float32)
            if IS_KDA:
                g_j = tl.load(base_g + (i_hv * L + j) * K + o_k, mask=mask_k, other=0.0).to(tl.float32)
                S = S * tl.exp(g_j)[None, :]
            else:
                g_j = tl.load(base_g + i_hv * L + j).to(tl.float32)
                S = S * tl.exp(g_j)
            d_j = b_j * (v_j - tl.sum(S * k_j[None, :], axis=1))
            S = S + d_j[:, None] * k_j[None, :]
        tl.store(temporal + dst * stride_t_slot + tile, S.to(temporal.dtype.element_ty), mask=mask_vk)


def _slot_major(t: torch.Tensor, name: str) -> None:
    if t.dim() < 2 or not t[0].is_contiguous():
        raise ValueError(f"replay_exact_triton: `{name}` must be contiguous within a slot (got strides {t.stride()})")


def replay_exact_triton(temporal: torch.Tensor, k: torch.Tensor, g: torch.Tensor, v: torch.Tensor,
                        beta: torch.Tensor, src: torch.Tensor, dst: torch.Tensor, counts: torch.Tensor, *,
                        is_kda: bool, block_v: int = 32, num_warps: int = 4) -> None:
    """``temporal[dst[i]] = replay_exact(temporal, ...)[i]`` for the rows with ``src, dst >= 0`` and
    ``counts > 0``, in place, without a host read. ``temporal`` ``[slots, HV, V, K]`` fp32; ``k``
    ``[slots, H, L, K]``; ``g`` ``[slots, HV, L]`` (GDN) or ``[slots, HV, L, K]`` (KDA); ``v``
    ``[slots, HV, L, V]``; ``beta`` ``[slots, HV, L]``; each contiguous within a slot; ``src``, ``dst``,
    ``counts`` ``[R]`` integer tensors on the same device."""
    slots, HV, V, K = temporal.shape
    H, L = k.shape[1], k.shape[2]
    R = src.numel()
    if temporal.dtype != torch.float32:
        raise ValueError(f"replay_exact_triton: the checkpoint must be fp32 (got {temporal.dtype})")
    if HV % H or tuple(k.shape) != (slots, H, L, K) or tuple(v.shape) != (slots, HV, L, V) \
            or tuple(beta.shape) != (slots, HV, L) or tuple(g.shape) != ((slots, HV, L, K) if is_kda else (slots, HV, L)):
        raise ValueError(f"replay_exact_triton: shapes disagree: temporal {tuple(temporal.shape)}, k {tuple(k.shape)}, "
                         f"g {tuple(g.shape)}, v {tuple(v.shape)}, beta {tuple(beta.shape)} (is_kda={is_kda})")
    if not (src.numel() == dst.numel() == counts.numel()):
        raise ValueError("replay_exact_triton: src, dst and counts must have one entry per row")
    for t, name in ((temporal, "temporal"), (k, "k"), (g, "g"), (v, "v"), (beta, "beta")):
        _slot_major(t, name)
    if R == 0:
        return
    BV = min(block_v, triton.next_power_of_2(V))
    grid = (R, HV, triton.cdiv(V, BV))
    replay_exact_kernel[grid](
        temporal, k, g, v, beta, src.reshape(-1), dst.reshape(-1), counts.reshape(-1),
        temporal.stride(0), k.stride(0), g.stride(0), v.stride(0), beta.stride(0),
        H=H, HV=HV, K=K, V=V, L=L, BK=triton.next_power_of_2(K), BV=BV, IS_KDA=is_kda, num_warps=num_warps,
    )  # fmt: skip
