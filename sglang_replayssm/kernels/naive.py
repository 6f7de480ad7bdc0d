"""Float64 oracle for the gated delta rule decode used by SGLang 0.5.23 (GDN and KDA).

Everything here is deliberately naive (python loops over time, einsum over heads) and runs in
``torch.float64`` so it can serve as ground truth for the fp32 torch references and the Triton
kernels of this package.

Conventions (those of SGLang 0.5.23's packed / ReplaySSM decode kernels):

* State layout is ``[..., HV, V, K]`` with K contiguous, exactly like ``MambaPool.temporal``
  (one slot holds ``[HV, V, K]``). The read-out of a state ``S`` with a key vector ``x`` is the
  matrix-vector product ``S @ x`` (contracting over K), giving a V vector.
* Heads: ``H`` key/query heads and ``HV`` value heads with ``HV % H == 0`` (GVA). Value head ``hv``
  reads key/query head ``hv // (HV // H)``.
* Gate: ``g = -exp(A_log) * softplus(a + dt_bias)`` with softplus beta 1 and threshold 20
  (``x`` itself above the threshold). GDN: ``a`` ``[B, HV]``, ``dt_bias`` ``[HV]``, ``g``
  ``[B, HV]`` (one log-decay per value head). KDA: ``a`` ``[B, HV, K]``, ``dt_bias`` ``[HV, K]``,
  ``g`` ``[B, HV, K]`` (one log-decay per key channel). ``A_log`` is ``[HV]`` in both cases.
  ``beta = sigmoid(b)``, ``b`` ``[B, HV]``; the kernel rounds ``beta`` to ``b.dtype``.
* q and k are L2-normalised in the kernel as ``x / sqrt(sum(x**2) + 1e-6)``; q is then scaled by
  ``scale`` (``K ** -0.5`` unless given).
* One step with decay ``a = exp(g)`` (scalar per head for GDN, per-K vector for KDA)::

      S_dec = S . Diag(a)                   (GDN: a * S)
      d     = beta * (v - S_dec @ k)        (the "corrected delta", a V vector)
      o     = S_dec @ (scale * q) + d * (k . scale * q)
      S'    = S_dec + d k^T

* A ReplaySSM ring record is ``(d_j, k_j, g_j)`` for one step; folding a record into a state is
  ``S <- S . Diag(exp(g_j)) + d_j k_j^T``, which is the last two lines above. "Materialising" a
  slot is folding its first ``count`` records, in ring order, into its checkpoint.
"""

from __future__ import annotations

import torch

from .constants import L2NORM_EPS, SOFTPLUS_THRESHOLD

__all__ = [
    "L2NORM_EPS",
    "SOFTPLUS_THRESHOLD",
    "compute_beta_fp64",
    "compute_gate_fp64",
    "delta_fp64",
    "expand_kv_heads",
    "fold_records_fp64",
    "l2norm_fp64",
    "packed_step_fp64",
    "recurrence_fp64",
    "recurrent_step_fp64",
    "softplus_fp64",
    "unpack_mixed_qkv",
]


_F64 = torch.float64


def softplus_fp64(x: torch.Tensor, threshold: float = SOFTPLUS_THRESHOLD) -> torch.Tensor:
    """``log(1 + exp(x))`` for ``x <= threshold``, ``x`` above it; computed in float64."""
    x = x.to(_F64)
    return torch.where(x <= threshold, torch.log1p(torch.exp(torch.clamp(x, max=threshold))), x)


def compute_gate_fp64(
    a: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor, *, is_kda: bool
) -> torch.Tensor:
    """Log-decay ``g = -exp(A_log) * softplus(a + dt_bias)`` in float64.

    GDN (``is_kda=False``): ``a`` ``[..., HV]``, ``A_log`` ``[HV]``, ``dt_bias`` ``[HV]`` ->
    ``g`` ``[..., HV]``. KDA (``is_kda=True``): ``a`` ``[..., HV, K]``, ``A_log`` ``[HV]`` (any
    shape with HV elements), ``dt_bias`` ``[HV, K]`` -> ``g`` ``[..., HV, K]``. Always ``g <= 0``.
    """
    A = torch.exp(A_log.to(_F64).reshape(-1))
    if is_kda:
        HV = A.shape[0]
        if a.shape[-2] != HV or tuple(dt_bias.shape) != tuple(a.shape[-2:]):
            raise ValueError(
                f"KDA gate: a {tuple(a.shape)}, dt_bias {tuple(dt_bias.shape)}, A_log {HV} heads"
            )
        return -A[:, None] * softplus_fp64(a.to(_F64) + dt_bias.to(_F64))
    if a.shape[-1] != A.shape[0] or tuple(dt_bias.shape) != (A.shape[0],):
        raise ValueError(f"GDN gate: a {tuple(a.shape)}, dt_bias {tuple(dt_bias.shape)}, A_log {A.shape[0]}")
    return -A * softplus_fp64(a.to(_F64) + dt_bias.to(_F64))


def compute_beta_fp64(b: torch.Tensor, *, round_to_input_dtype: bool = True) -> torch.Tensor:
    """``beta = sigmoid(b)`` in float64.

    With ``round_to_input_dtype`` (the kernel's behaviour) beta is first rounded to ``b.dtype``
    (a no-op in effect for fp32/fp64 inputs, a real rounding for bf16/fp16 inputs).
    """
    beta = torch.sigmoid(b.to(_F64))
    if round_to_input_dtype and b.dtype not in (torch.float32, torch.float64):
        beta = beta.to(b.dtype).to(_F64)
    return beta


def l2norm_fp64(x: torch.Tensor, eps: float = L2NORM_EPS) -> torch.Tensor:
    """``x / sqrt(sum(x**2, -1) + eps)`` over the last dim, in float64."""
    x = x.to(_F64)
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + eps)


def expand_kv_heads(x: torch.Tensor, num_v_heads: int, head_dim: int = -2) -> torch.Tensor:
    """Map key heads to value heads: output head ``hv`` is input head ``hv // (HV // H)``."""
    H = x.shape[head_dim]
    if num_v_heads % H != 0:
        raise ValueError(f"HV={num_v_heads} is not a multiple of H={H}")
    return x.repeat_interleave(num_v_heads // H, dim=head_dim)


def unpack_mixed_qkv(
    mixed_qkv: torch.Tensor, num_k_heads: int, head_k_dim: int, num_v_heads: int, head_v_dim: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Split the packed ``[..., 2*H*K + HV*V]`` (q | k | v) row into q, k ``[..., H, K]``, v ``[..., HV, V]``.

    Values keep their dtype (no normalisation); views where possible.
    """
    H, K, HV, V = num_k_heads, head_k_dim, num_v_heads, head_v_dim
    if mixed_qkv.shape[-1] != 2 * H * K + HV * V:
        raise ValueError(f"mixed_qkv last dim {mixed_qkv.shape[-1]} != 2*{H}*{K} + {HV}*{V}")
    lead = mixed_qkv.shape[:-1]
    q = mixed_qkv[..., : H * K].reshape(*lead, H, K)
    k = mixed_qkv[..., H * K : 2 * H * K].reshape(*lead, H, K)
    v = mixed_qkv[..., 2 * H * K :].reshape(*lead, HV, V)
    return q, k, v


def _decay_state(state: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """``S . Diag(exp(g))``: GDN ``g`` ``[..., HV]`` scales whole heads, KDA ``g`` ``[..., HV, K]`` columns."""
    if g.dim() == state.dim() - 1:  # KDA: per K channel
        return state * torch.exp(g)[..., None, :]
    return state * torch.exp(g)[..., None, None]


def _prepare_qk(
    q: torch.Tensor | None, k: torch.Tensor, num_v_heads: int, use_qk_l2norm: bool
) -> tuple[torch.Tensor | None, torch.Tensor]:
    if use_qk_l2norm:
        k = l2norm_fp64(k)
        q = None if q is None else l2norm_fp64(q)
    else:
        k = k.to(_F64)
        q = None if q is None else q.to(_F64)
    k = expand_kv_heads(k, num_v_heads)
    q = None if q is None else expand_kv_heads(q, num_v_heads)
    return q, k


def delta_fp64(
    state: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    *,
    use_qk_l2norm: bool = True,
) -> torch.Tensor:
    """The ring record ``d = beta * (v - (S . Diag(exp g)) @ k)`` for one step, ``[B, HV, V]`` float64.

    Shapes as in :func:`recurrent_step_fp64`.
    """
    _, kk = _prepare_qk(None, k, v.shape[-2], use_qk_l2norm)
    return _decayed_and_delta(state, kk, v, g, beta)[1]


def _decayed_and_delta(state: torch.Tensor, kk: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                       beta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(S . Diag(exp g), beta * (v - (S . Diag(exp g)) @ kk))`` in float64 (``kk`` prepared)."""
    s_dec = _decay_state(state.to(_F64), g.to(_F64))
    return s_dec, beta.to(_F64)[..., None] * (v.to(_F64) - torch.einsum("...vk,...k->...v", s_dec, kk))


def recurrent_step_fp64(
    state: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    *,
    scale: float | None = None,
    use_qk_l2norm: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One gated-delta-rule decode step for a batch of states, in float64.

    Args:
        state: ``[B, HV, V, K]`` state before the token (not modified).
        q, k: ``[B, H, K]`` raw query / key (normalised here when ``use_qk_l2norm``).
        v: ``[B, HV, V]``.
        g: log-decay, ``[B, HV]`` (GDN) or ``[B, HV, K]`` (KDA); the gate kind is inferred from
            ``g.dim()``. Use :func:`compute_gate_fp64` to derive it from ``a``/``A_log``/``dt_bias``.
        beta: ``[B, HV]`` (use :func:`compute_beta_fp64`).
        scale: query scale, ``K ** -0.5`` when None.

    Returns:
        ``(o, new_state)``: ``o`` ``[B, HV, V]`` and ``new_state`` ``[B, HV, V, K]``, float64.
    """
    HV, K = state.shape[-3], state.shape[-1]
    if scale is None:
        scale = K**-0.5
    qq, kk = _prepare_qk(q, k, HV, use_qk_l2norm)
    assert qq is not None
    qq = qq * scale
    s_dec, d = _decayed_and_delta(state, kk, v, g, beta)
    o = torch.einsum("...vk,...k->...v", s_dec, qq) + d * (kk * qq).sum(-1, keepdim=True)
    new_state = s_dec + d[..., :, None] * kk[..., None, :]
    return o, new_state


def recurrence_fp64(
    state: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    *,
    scale: float | None = None,
    use_qk_l2norm: bool = True,
    return_states: bool = False,
) -> tuple[torch.Tensor, torch.Tensor] | tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    """Run :func:`recurrent_step_fp64` over a leading time dimension.

    Inputs are those of :func:`recurrent_step_fp64` with a leading ``T`` dim on q, k, v, g, beta
    (``state`` has none). Returns ``(o [T, B, HV, V], final_state [B, HV, V, K])`` in float64,
    plus the list of the ``T`` states after each step when ``return_states``.
    """
    s = state.to(_F64)
    outs: list[torch.Tensor] = []
    states: list[torch.Tensor] = []
    for t in range(q.shape[0]):
        o, s = recurrent_step_fp64(s, q[t], k[t], v[t], g[t], beta[t], scale=scale, use_qk_l2norm=use_qk_l2norm)
        outs.append(o)
        if return_states:
            states.append(s)
    o_all = torch.stack(outs) if outs else torch.empty(0, *v.shape[1:], dtype=_F64, device=v.device)
    if return_states:
        return o_all, s, states
    return o_all, s


def fold_records_fp64(
    checkpoint: torch.Tensor,
    d: torch.Tensor,
    k: torch.Tensor,
    g: torch.Tensor,
    count: int,
    is_kda: bool,
) -> torch.Tensor:
    """Fold the first ``count`` ring records into a checkpoint: ``S <- S . Diag(exp g_j) + d_j k_j^T``.

    Shapes (any common leading dims ``*``, e.g. none for one slot, or ``[n_layers]``):
    ``checkpoint`` ``[*, HV, V, K]``; ``d`` ``[*, HV, L, V]``; ``k`` ``[*, H, L, K]`` (already
    normalised, as the ring stores it; value head ``hv`` uses key head ``hv // (HV // H)``);
    ``g`` ``[*, HV, L]`` (GDN) or ``[*, HV, L, K]`` (KDA). Records ``count..L-1`` are never read.
    ``count == 0`` returns the checkpoint (as float64). Inputs are not modified.
    """
    L = d.shape[-2]
    if not 0 <= count <= L:
        raise ValueError(f"count={count} outside [0, {L}]")
    if (g.dim() == d.dim()) != is_kda:
        raise ValueError(f"g shape {tuple(g.shape)} does not match is_kda={is_kda}")
    HV = checkpoint.shape[-3]
    s = checkpoint.to(_F64).clone()
    kk = expand_kv_heads(k.to(_F64), HV, head_dim=-3)
    for j in range(count):
        gj = g[..., j, :] if is_kda else g[..., j]
        s = _decay_state(s, gj.to(_F64))
        s = s + d[..., j, :].to(_F64)[..., :, None] * kk[..., j, :][..., None, :]
    return s


def packed_step_fp64(
    state: torch.Tensor,
    mixed_qkv: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    *,
    num_k_heads: int,
    is_kda: bool,
    scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """One step from the packed-decode inputs SGLang's kernels take, in float64.

    ``state`` ``[B, HV, V, K]``; ``mixed_qkv`` ``[B, 2*H*K + HV*V]``; GDN ``a`` ``[B, HV]`` /
    ``dt_bias`` ``[HV]``, KDA ``a`` ``[B, HV, K]`` / ``dt_bias`` ``[HV, K]``; ``b`` ``[B, HV]``;
    ``A_log`` ``[HV]``. q/k are L2-normalised (``use_qk_l2norm_in_kernel=True``, as SGLang passes).

    Returns ``(o [B, HV, V], new_state, d [B, HV, V], k_normed [B, H, K], g)``: the last three are
    exactly the ring record (``d``, ``k``, ``g``) a non-flush ReplaySSM step writes for this token.
    """
    HV, V, K = state.shape[-3], state.shape[-2], state.shape[-1]
    q, k, v = unpack_mixed_qkv(mixed_qkv, num_k_heads, K, HV, V)
    g = compute_gate_fp64(a, A_log, dt_bias, is_kda=is_kda)
    beta = compute_beta_fp64(b)
    o, new_state = recurrent_step_fp64(state, q, k, v, g, beta, scale=scale)
    d = delta_fp64(state, k, v, g, beta)
    return o, new_state, d, l2norm_fp64(k), g
