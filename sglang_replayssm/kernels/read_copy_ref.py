"""Pure-torch ring decode with a low-precision read copy (CPU and CUDA; GDN and KDA).

SGLang 0.5.23's packed-decode / ReplaySSM argument conventions (:mod:`.ring_decode_ref`), plus the
read copy (``read_copy`` ``[slots, HV, V, K]`` bf16 or fp8 e4m3, ``read_copy_scales`` None or fp32,
see :mod:`.read_copy_format`) and two more ring records per step, the raw inputs the exact flush
replays: ``v_cache`` ``[slots, HV, L, V]`` (the token's ``v``, any dtype that holds it exactly, e.g.
``mixed_qkv.dtype``) and ``beta_cache`` ``[slots, HV, L]`` (``sigmoid(b)`` rounded to ``b.dtype``,
stored fp32 or ``b.dtype``: both exact).

Per decode row ``i`` with slot ``s >= 0`` and cursor ``m = write_pos[i]`` (records ``0..m-1`` valid):

* Non-flush (``m < L-1`` and not forced): the state before the token is rebuilt from the **copy**:
  ``S~ = deq(copy[s]) . Diag(prod alpha) + sum_j replay_j d~_j k_j^T`` (the fold SGLang's kernel does
  from its checkpoint), the output is read from ``S~``, and record ``m`` is written:
  ``d~ = beta (v - S~ alpha k)`` (copy-based, used only by later non-flush folds of this window),
  ``k`` (normalised, in ``k_cache.dtype``), ``g`` (fp32), ``v``, ``beta``. Checkpoint and copy untouched.
* Flush: the fp32 recurrence runs from the **checkpoint** ``initial_state[s]`` over the ``m``
  records' raw inputs, in order (``S <- S . Diag(alpha_j)``, ``d_j = beta_j (v_j - S k_j)``,
  ``S <- S + d_j k_j^T``: an ``m``-step sequential recurrence, not a fold, because every ``d_j``
  depends on the exact ``S_{j-1}``); the output of this token is read from the exact state, the
  new checkpoint ``S . Diag(alpha) + d k^T`` is written to ``initial_state[s]`` and the copy of
  ``s`` is rewritten from it. The ring is not written; ``d_cache`` is never read here.

Exactness: with ``k_cache`` in fp32 the flushed checkpoints are those of fp32 sequential decode
(SGLang's packed decode with an fp32 state) on the same inputs, whatever the copy's format: the
copy's rounding reaches only the non-flush outputs of its own window. (With ``k_cache`` in bf16,
the flush recurrence runs on bf16-rounded normalised keys; storing the raw bf16 key and
re-normalising at the flush would be exact at 2 bytes per element.)
"""

from __future__ import annotations

import torch

from .read_copy_format import dequantize, refresh_slots
from .ring_decode_args import check_ring_decode_args
from .ring_decode_ref import current_token, valid_rows

__all__ = ["check_read_copy_args", "read_copy_decode_torch", "replay_exact"]


def check_read_copy_args(
    read_copy: torch.Tensor, read_copy_scales: torch.Tensor | None, v_cache: torch.Tensor, beta_cache: torch.Tensor,
    initial_state: torch.Tensor, L: int, is_kda: bool,
) -> None:  # fmt: skip
    """The read copy's and the two new records' shapes and dtypes, and an fp32 checkpoint (``ValueError``)."""
    n, HV, V, K = initial_state.shape
    if tuple(read_copy.shape) != (n, HV, V, K):
        raise ValueError(f"read_copy must be {(n, HV, V, K)} (got {tuple(read_copy.shape)})")
    if read_copy.dtype not in (torch.bfloat16, torch.float8_e4m3fn):
        raise ValueError(f"read_copy must be bfloat16 or float8_e4m3fn (got {read_copy.dtype})")
    fp8 = read_copy.dtype == torch.float8_e4m3fn
    if fp8 != (read_copy_scales is not None):
        raise ValueError("read_copy_scales must be given exactly for an fp8 read copy")
    if read_copy_scales is not None:
        want = (n, HV, V)
        if tuple(read_copy_scales.shape) != want or read_copy_scales.dtype != torch.float32:
            raise ValueError(f"read_copy_scales must be float32 {want} (got {tuple(read_copy_scales.shape)})")
    if tuple(v_cache.shape) != (n, HV, L, V):
        raise ValueError(f"v_cache must be {(n, HV, L, V)} (got {tuple(v_cache.shape)})")
    if tuple(beta_cache.shape) != (n, HV, L):
        raise ValueError(f"beta_cache must be {(n, HV, L)} (got {tuple(beta_cache.shape)})")
    if initial_state.dtype != torch.float32:
        raise ValueError(f"the checkpoint must be float32 for an exact flush (got {initial_state.dtype})")


def _decay(S: torch.Tensor, alpha: torch.Tensor, is_kda: bool) -> torch.Tensor:
    """``S . Diag(alpha)``: ``S`` ``[n, HV, V, K]``, ``alpha`` ``[n, HV, K]`` (KDA) or ``[n, HV]``."""
    return S * (alpha[:, :, None, :] if is_kda else alpha[:, :, None, None])


def read_copy_decode_torch(
    mixed_qkv: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    scale: float,
    initial_state: torch.Tensor,
    read_copy: torch.Tensor,
    read_copy_scales: torch.Tensor | None,
    d_cache: torch.Tensor,
    k_cache: torch.Tensor,
    g_cache: torch.Tensor,
    v_cache: torch.Tensor,
    beta_cache: torch.Tensor,
    out: torch.Tensor,
    ssm_state_indices: torch.Tensor,
    write_pos: torch.Tensor,
    force_flush: torch.Tensor | None = None,
    use_qk_l2norm_in_kernel: bool = False,
    is_kda: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One decode step for ``B`` rows, in place (module docstring); returns ``(out, initial_state)``.

    Shapes as :func:`.ring_decode_ref.ring_decode_torch`, plus ``read_copy`` ``[slots, HV, V, K]``,
    ``read_copy_scales`` (fp8: ``[slots, HV, V]``, one scale per V row), ``v_cache``
    ``[slots, HV, L, V]``, ``beta_cache`` ``[slots, HV, L]``. ``initial_state`` must be fp32.
    """
    B, H, HV, K, V, L = check_ring_decode_args(
        mixed_qkv, a, b, A_log, dt_bias, initial_state, d_cache, k_cache, g_cache, out,
        ssm_state_indices, write_pos, force_flush, is_kda,
    )  # fmt: skip
    check_read_copy_args(read_copy, read_copy_scales, v_cache, beta_cache, initial_state, L, is_kda)
    out.zero_()
    picked = valid_rows(ssm_state_indices, write_pos, initial_state.shape[0], L)
    if picked is None:
        return out, initial_state
    rows, slots, m = picked

    f32 = torch.float32
    G = HV // H
    q, k, v, g_cur, beta = current_token(mixed_qkv, a, b, A_log, dt_bias, rows, (H, HV, K, V),
                                         use_qk_l2norm_in_kernel, is_kda)  # fmt: skip
    q_v = (q * scale).repeat_interleave(G, dim=1)  # [n, HV, K]
    k_v = k.repeat_interleave(G, dim=1)
    alpha = torch.exp(g_cur)

    flush = m == L - 1
    if force_flush is not None:
        flush = flush | (force_flush[rows] != 0)
    S = torch.empty(rows.numel(), HV, V, K, dtype=f32, device=initial_state.device)
    nf = torch.nonzero(~flush).flatten()
    fl = torch.nonzero(flush).flatten()
    if nf.numel():
        S[nf] = _fold_from_copy(read_copy, read_copy_scales, d_cache, k_cache, g_cache, slots[nf], m[nf], G, is_kda)
    if fl.numel():
        S[fl] = _replay_exact(initial_state, k_cache, g_cache, v_cache, beta_cache, slots[fl], m[fl], G, is_kda)

    S_dec = _decay(S, alpha, is_kda)
    d_cur = beta[..., None] * (v - torch.einsum("nhvk,nhk->nhv", S_dec, k_v))
    o = torch.einsum("nhvk,nhk->nhv", S_dec, q_v) + d_cur * (k_v * q_v).sum(-1)[..., None]
    out[rows, 0] = o.to(out.dtype)

    if fl.numel():
        s_fl = slots[fl]
        initial_state[s_fl] = S_dec[fl] + d_cur[fl][..., :, None] * k_v[fl][..., None, :]
        refresh_slots(initial_state, read_copy, read_copy_scales, s_fl, is_kda)
    if nf.numel():
        s_nf, m_nf = slots[nf], m[nf]
        d_cache[s_nf, :, m_nf] = d_cur[nf].to(d_cache.dtype)
        k_cache[s_nf, :, m_nf] = k[nf].to(k_cache.dtype)
        g_cache[s_nf, :, m_nf] = g_cur[nf]
        v_cache[s_nf, :, m_nf] = v[nf].to(v_cache.dtype)
        beta_cache[s_nf, :, m_nf] = beta[nf].to(beta_cache.dtype)
    return out, initial_state


def _fold_from_copy(
    read_copy: torch.Tensor, read_copy_scales: torch.Tensor | None, d_cache: torch.Tensor, k_cache: torch.Tensor,
    g_cache: torch.Tensor, slots: torch.Tensor, m: torch.Tensor, G: int, is_kda: bool,
) -> torch.Tensor:  # fmt: skip
    """State before the token of non-flush rows: the dequantised copy folded with the ``m`` copy-based records."""
    L = d_cache.shape[2]
    S0 = dequantize(read_copy[slots], None if read_copy_scales is None else read_copy_scales[slots], is_kda)
    valid = torch.arange(L, device=S0.device)[None, :] < m[:, None]  # [n, L]
    d_all = torch.where(valid[:, None, :, None], d_cache[slots].to(torch.float32), 0.0)  # [n, HV, L, V]
    k_all = torch.where(valid[:, None, :, None], k_cache[slots].to(torch.float32), 0.0)
    k_all = k_all.repeat_interleave(G, dim=1)  # [n, HV, L, K]
    if is_kda:
        g_all = torch.where(valid[:, None, :, None], g_cache[slots], 0.0)  # [n, HV, L, K]
        g_tot = g_all.sum(2)
        replay = torch.where(valid[:, None, :, None], torch.exp(g_tot[:, :, None, :] - g_all.cumsum(2)), 0.0)
        return S0 * torch.exp(g_tot)[:, :, None, :] + torch.einsum("nhlv,nhlk->nhvk", d_all, k_all * replay)
    g_all = torch.where(valid[:, None, :], g_cache[slots], 0.0)  # [n, HV, L]
    g_tot = g_all.sum(2)
    replay = torch.where(valid[:, None, :], torch.exp(g_tot[:, :, None] - g_all.cumsum(2)), 0.0)
    return S0 * torch.exp(g_tot)[:, :, None, None] + torch.einsum("nhlv,nhlk->nhvk", d_all * replay[..., None], k_all)


def _replay_exact(
    initial_state: torch.Tensor, k_cache: torch.Tensor, g_cache: torch.Tensor, v_cache: torch.Tensor,
    beta_cache: torch.Tensor, slots: torch.Tensor, m: torch.Tensor, G: int, is_kda: bool,
) -> torch.Tensor:  # fmt: skip
    """State before the token of flush rows: the fp32 recurrence from the checkpoint over the ``m``
    records' raw inputs (``k``, ``g``, ``v``, ``beta``), one step at a time; rows with ``j >= m`` idle."""
    S = initial_state[slots].to(torch.float32)
    for j in range(int(m.max())):
        live = m > j  # [n]
        kj = k_cache[slots, :, j].to(torch.float32).repeat_interleave(G, dim=1)  # [n, HV, K]
        alpha = torch.exp(g_cache[slots, :, j])  # [n, HV] or [n, HV, K]
        vj = v_cache[slots, :, j].to(torch.float32)  # [n, HV, V]
        bj = beta_cache[slots, :, j].to(torch.float32)  # [n, HV]
        S_dec = _decay(S, alpha, is_kda)
        dj = bj[..., None] * (vj - torch.einsum("nhvk,nhk->nhv", S_dec, kj))
        S_next = S_dec + dj[..., :, None] * kj[..., None, :]
        S = torch.where(live[:, None, None, None], S_next, S)
    return S


#: The exact replay of ``m`` raw records from the fp32 checkpoint (what a flush runs), for movers:
#: ``replay_exact(initial_state, k_cache, g_cache, v_cache, beta_cache, slots, m, G, is_kda)`` ->
#: the folded states ``[n, HV, V, K]`` (rows with ``m = 0`` are the checkpoint itself).
replay_exact = _replay_exact
