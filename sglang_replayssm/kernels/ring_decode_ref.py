"""Pure-torch ReplaySSM ring decode: a drop-in for SGLang 0.5.23's
``fused_recurrent_linear_replayssm_decode`` (decode mode, GDN and KDA).

Same signature, same return value and same in-place effects as SGLang's wrapper, so the CPU
runtime can bind :func:`ring_decode_torch` where ``TritonGDNKernel.packed_decode`` /
``TritonKDAKernel.packed_decode`` call the kernel. Arithmetic is fp32 and mirrors the kernel's
casts (the reconstruction operands are rounded to ``out.dtype``; the ring key is stored as
``out.dtype``; ``beta`` is rounded to ``b.dtype``), so with fp32 I/O it agrees with the Triton
kernel to fp32 rounding (on CUDA tensors the einsums follow torch's TF32 switch,
``torch.backends.cuda.matmul.allow_tf32``, off by default; SGLang's kernel itself uses TF32 there).

Per decode row ``i`` with slot ``s = ssm_state_indices[i]`` and cursor ``m = write_pos[i]``:

* ``s < 0`` (padding): ``out[i] = 0``; nothing else is read or written for the row.
* The state before the token is rebuilt from the checkpoint ``initial_state[s]`` and the ``m``
  valid ring records ``0..m-1`` of slot ``s`` (records ``m..L-1`` are never read, so garbage or NaN
  there is harmless).
* ``flush = (m == L-1) or (force_flush is not None and force_flush[i] != 0)``.
  Flush: ``initial_state[s] <- S . Diag(alpha) + d k^T`` (the ``m`` records + this token); the ring
  is not written. Non-flush: record ``m`` of slot ``s`` is written (``d`` ``[HV, V]``, normalised
  ``k`` ``[H_k, K]``, fp32 ``g`` ``[HV]`` or ``[HV, K]``); the checkpoint is not written.
* ``write_pos`` is never modified (the host advances it).

Invariants checked (``ValueError``): SGLang's shape/dtype checks
(:func:`.ring_decode_args.check_ring_decode_args`, shared with the fused kernels), plus
``0 <= m <= L-1`` and ``s < num_slots`` for valid rows and no slot appearing in two valid rows
(the fused kernels would race on it). SGLang's launch-tuning arguments (``block_v``,
``num_warps``, ``num_stages``, ``nk``) are accepted and ignored; the fused kernels' layout
requirements (:func:`.ring_decode_args.check_fused_layout`: powers of two, contiguity) do not
apply here.
"""

from __future__ import annotations

import torch

from .constants import L2NORM_EPS, SOFTPLUS_THRESHOLD
from .ring_decode_args import check_ring_decode_args

__all__ = ["current_token", "ring_decode_torch", "ring_rows_of", "valid_rows"]


def valid_rows(
    ssm_state_indices: torch.Tensor, write_pos: torch.Tensor, n_slots: int, L: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """The rows with a state slot (``index >= 0``), their slots and cursors, checked: slots in range
    and distinct, cursors in ``[0, L-1]``. None when no row has a slot. (Host-side checks: the torch
    reference is no hot path.)"""
    idx_all = ssm_state_indices.to(torch.long)
    rows = torch.nonzero(idx_all >= 0).flatten()
    if rows.numel() == 0:
        return None
    slots = idx_all[rows]
    m = write_pos.to(torch.long)[rows]
    if int(slots.max()) >= n_slots:
        raise ValueError(f"state index {int(slots.max())} >= number of slots {n_slots}")
    if bool(((m < 0) | (m > L - 1)).any()):
        raise ValueError(f"write_pos of a valid row outside [0, {L - 1}]: {m.tolist()}")
    if torch.unique(slots).numel() != slots.numel():
        raise ValueError(f"a state slot appears in two valid rows: {slots.tolist()}")
    return rows, slots, m


def ring_rows_of(ring_map: torch.Tensor, slots: torch.Tensor, n_rows: int) -> torch.Tensor:
    """``ring_map[slots]`` as long, checked: in ``[0, n_rows)`` and distinct (two valid rows writing one
    ring row would race on it)."""
    ring = ring_map[slots].to(torch.long)
    if bool(((ring < 0) | (ring >= n_rows)).any()):
        raise ValueError(f"ring row outside [0, {n_rows}): {ring.tolist()}")
    if torch.unique(ring).numel() != ring.numel():
        raise ValueError(f"a ring row appears in two valid rows: {ring.tolist()}")
    return ring


def current_token(
    mixed_qkv: torch.Tensor, a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor,
    rows: torch.Tensor, dims: tuple[int, int, int, int], use_qk_l2norm: bool, is_kda: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The current token of ``rows`` in fp32: ``(q [n,H,K], k [n,H,K], v [n,HV,V], g [n,HV] | [n,HV,K],
    beta [n,HV])``; q and k L2-normalised when asked (q unscaled), g the log-decay
    ``-exp(A_log) * softplus(a + dt_bias)``, beta rounded to ``b``'s dtype as SGLang does."""
    H, HV, K, V = dims
    f32 = torch.float32
    x = mixed_qkv[rows].to(f32)
    q = x[:, : H * K].reshape(-1, H, K)
    k = x[:, H * K : 2 * H * K].reshape(-1, H, K)
    v = x[:, 2 * H * K :].reshape(-1, HV, V)
    if use_qk_l2norm:
        q = q * (1.0 / torch.sqrt((q * q).sum(-1, keepdim=True) + L2NORM_EPS))
        k = k * (1.0 / torch.sqrt((k * k).sum(-1, keepdim=True) + L2NORM_EPS))
    A = torch.exp(A_log.to(f32))  # [HV]
    xg = a[rows].to(f32) + dt_bias.to(f32)
    softplus = torch.where(xg <= SOFTPLUS_THRESHOLD, torch.log(1.0 + torch.exp(xg)), xg)
    g = -(A[:, None] if is_kda else A) * softplus
    beta = torch.sigmoid(b[rows].to(f32)).to(b.dtype).to(f32)
    return q, k, v, g, beta


def ring_decode_torch(
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
    num_warps: int = 1,
    num_stages: int = 3,
    nk: int = 2,
    *,
    ring_map: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One ReplaySSM decode step for ``B`` rows, in place; see the module docstring.

    Shapes: ``mixed_qkv`` ``[B, 2*H*K + HV*V]`` (q | k | v); GDN ``a`` ``[B, HV]``, ``dt_bias``
    ``[HV]``, ``g_cache`` ``[slots, HV, L]``; KDA ``a`` ``[B, HV, K]``, ``dt_bias`` ``[HV, K]``,
    ``g_cache`` ``[slots, HV, L, K]``; ``b`` ``[B, HV]``; ``A_log`` ``[HV]``; ``initial_state``
    ``[slots, HV, V, K]``; ``d_cache`` ``[slots, HV, L, V]``; ``k_cache`` ``[slots, H, L, K]``;
    ``out`` ``[B, 1, HV, V]``; ``ssm_state_indices``, ``write_pos`` (int32), ``force_flush``
    (int32 or None) ``[B]``. Returns ``(out, initial_state)``.

    With ``ring_map`` (int32 ``[slots]``) slot ``s``'s records live in ring row ``ring_map[s]`` of
    ``d_cache`` / ``k_cache`` / ``g_cache`` (``[rows, ...]``); valid rows' ring rows must be distinct.
    """
    del block_v, num_warps, num_stages, nk  # launch tuning of the Triton kernel only
    B, H, HV, K, V, L = check_ring_decode_args(
        mixed_qkv, a, b, A_log, dt_bias, initial_state, d_cache, k_cache, g_cache, out,
        ssm_state_indices, write_pos, force_flush, is_kda, ring_map,
    )  # fmt: skip
    out.zero_()
    picked = valid_rows(ssm_state_indices, write_pos, initial_state.shape[0], L)
    if picked is None:
        return out, initial_state
    rows, slots, m = picked
    ring = slots if ring_map is None else ring_rows_of(ring_map, slots, d_cache.shape[0])

    f32 = torch.float32
    io = out.dtype
    G = HV // H
    dev = initial_state.device

    # Current token: q/k/v, gate, beta.
    q, k, v, g_cur, beta = current_token(mixed_qkv, a, b, A_log, dt_bias, rows, (H, HV, K, V),
                                         use_qk_l2norm_in_kernel, is_kda)  # fmt: skip
    q_s = q * scale
    kq = (k * q_s).sum(-1)  # [n, H]
    q_v = q_s.repeat_interleave(G, dim=1)  # [n, HV, K]
    k_v = k.repeat_interleave(G, dim=1)
    kq_v = kq.repeat_interleave(G, dim=1)  # [n, HV]
    alpha = torch.exp(g_cur)

    # Reconstruct the state before this token from the checkpoint and the m valid records.
    valid = torch.arange(L, device=dev)[None, :] < m[:, None]  # [n, L]
    S0 = initial_state[slots].to(f32)  # [n, HV, V, K]
    d_all = torch.where(valid[:, None, :, None], d_cache[ring].to(f32), 0.0)  # [n, HV, L, V]
    k_all = torch.where(valid[:, None, :, None], k_cache[ring].to(io).to(f32), 0.0)  # [n, H, L, K]
    k_all = k_all.repeat_interleave(G, dim=1)  # [n, HV, L, K]
    if is_kda:
        g_all = torch.where(valid[:, None, :, None], g_cache[ring], 0.0)  # [n, HV, L, K]
        g_tot = g_all.sum(2)  # [n, HV, K]
        replay = torch.where(valid[:, None, :, None], torch.exp(g_tot[:, :, None, :] - g_all.cumsum(2)), 0.0)
        k_scaled = (k_all * replay).to(io).to(f32)
        S = S0 * torch.exp(g_tot)[:, :, None, :] + torch.einsum("nhlv,nhlk->nhvk", d_all.to(io).to(f32), k_scaled)
        state_q = torch.einsum("nhvk,nhk->nhv", S, q_v * alpha)
        state_k = torch.einsum("nhvk,nhk->nhv", S, k_v * alpha)
    else:
        g_all = torch.where(valid[:, None, :], g_cache[ring], 0.0)  # [n, HV, L]
        g_tot = g_all.sum(2)  # [n, HV]
        replay = torch.where(valid[:, None, :], torch.exp(g_tot[:, :, None] - g_all.cumsum(2)), 0.0)
        d_tc = (d_all * replay[..., None]).to(io).to(f32)
        S = S0 * torch.exp(g_tot)[:, :, None, None] + torch.einsum("nhlv,nhlk->nhvk", d_tc, k_all)
        state_q = torch.einsum("nhvk,nhk->nhv", S, q_v) * alpha[..., None]
        state_k = torch.einsum("nhvk,nhk->nhv", S, k_v) * alpha[..., None]

    d_cur = beta[..., None] * (v - state_k)  # [n, HV, V]
    o = state_q + d_cur * kq_v[..., None]
    out[rows, 0] = o.to(out.dtype)

    flush = m == L - 1
    if force_flush is not None:
        flush = flush | (force_flush[rows] != 0)
    fl = torch.nonzero(flush).flatten()
    nf = torch.nonzero(~flush).flatten()
    if fl.numel():
        decay = alpha[fl][:, :, None, :] if is_kda else alpha[fl][:, :, None, None]
        S_new = S[fl] * decay + d_cur[fl][..., :, None] * k_v[fl][..., None, :]
        initial_state[slots[fl]] = S_new.to(initial_state.dtype)
    if nf.numel():
        s_nf, m_nf = ring[nf], m[nf]
        d_cache[s_nf, :, m_nf] = d_cur[nf].to(d_cache.dtype)
        k_cache[s_nf, :, m_nf] = k[nf].to(io).to(k_cache.dtype)
        g_cache[s_nf, :, m_nf] = g_cur[nf]
    return out, initial_state
