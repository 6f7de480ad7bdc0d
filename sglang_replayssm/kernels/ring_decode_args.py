"""The ring decode's arguments, checked once per step, and the prepared step the backends launch.

:func:`check_ring_decode_args` is the one validator of SGLang 0.5.23's
``fused_recurrent_linear_replayssm_decode`` arguments, shared by the torch reference
(:mod:`.ring_decode_ref`) and the fused kernels (:mod:`.ring_decode`). It applies SGLang's own
checks: in particular ``write_pos``, ``ssm_state_indices`` and ``force_flush`` have exactly ``B``
entries, as SGLang's wrapper requires and as its callers pass them (the eager decode metadata
gathers ``write_pos`` for the batch's ``bs`` rows; the CUDA-graph buffers are allocated per
``bs``). :func:`check_fused_layout` adds what the fused kernels need beyond that (powers of two,
contiguity); :func:`prepare_step` turns checked arguments into the :class:`RingStep` every backend
launches from.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

__all__ = ["RingShape", "RingStep", "check_fused_layout", "check_ring_decode_args", "prepare_step"]


class RingShape(NamedTuple):
    """Sizes of one step: ``B`` rows, ``H`` key heads, ``HV`` value heads, head dims ``K``/``V``,
    ring length ``L``."""

    B: int
    H: int
    HV: int
    K: int
    V: int
    L: int


class RingStep(NamedTuple):
    """One checked step in the form the kernels take: ``a`` ``[B, HV]`` (GDN) or ``[B, HV*K]``
    (KDA), ``b`` ``[B, HV]``, ``force_flush_arg`` = ``force_flush`` or (when it is None, never read)
    ``write_pos``; ``strides`` = the leading strides of ``(qkv, a, b, state, d, k, g)``; ``ring_map``
    (int32 ``[slots]``): the ring row of each slot, or None (one ring per slot)."""

    qkv: torch.Tensor
    a: torch.Tensor
    b: torch.Tensor
    A_log: torch.Tensor
    dt_bias: torch.Tensor
    out: torch.Tensor
    state: torch.Tensor
    d: torch.Tensor
    k: torch.Tensor
    g: torch.Tensor
    slots: torch.Tensor
    write_pos: torch.Tensor
    force_flush: torch.Tensor | None
    force_flush_arg: torch.Tensor
    scale: float
    strides: tuple[int, int, int, int, int, int, int]
    shape: RingShape
    is_kda: bool
    use_l2norm: bool
    ring_map: torch.Tensor | None = None

    @property
    def ring_map_arg(self) -> torch.Tensor:
        """The kernels' ``ring_map`` argument: the map, or (never read without one) the slots."""
        return self.slots if self.ring_map is None else self.ring_map


def _expect(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)


def check_ring_decode_args(
    mixed_qkv: torch.Tensor, a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor,
    initial_state: torch.Tensor, d_cache: torch.Tensor, k_cache: torch.Tensor, g_cache: torch.Tensor,
    out: torch.Tensor, ssm_state_indices: torch.Tensor, write_pos: torch.Tensor, force_flush: torch.Tensor | None,
    is_kda: bool, ring_map: torch.Tensor | None = None,
) -> RingShape:  # fmt: skip
    """SGLang's shape/dtype checks (``ValueError`` naming the argument); returns the step's sizes.

    With ``ring_map`` (int32 ``[slots]``: the ring row of each state slot) the ring tensors hold their
    own number of rows; without it, one ring per state slot.

    Shapes: ``mixed_qkv`` ``[B, 2*H*K + HV*V]`` (q | k | v); GDN ``a`` ``[B, HV]``, ``dt_bias``
    ``[HV]``, ``g_cache`` ``[slots, HV, L]``; KDA ``a`` ``[B, HV, K]``, ``dt_bias`` ``[HV, K]``,
    ``g_cache`` ``[slots, HV, L, K]`` (fp32); ``b`` ``[B, HV]``; ``A_log`` ``[HV]``;
    ``initial_state`` ``[slots, HV, V, K]``; ``d_cache`` ``[slots, HV, L, V]``; ``k_cache``
    ``[slots, H, L, K]``; ``out`` ``[B, 1, HV, V]``; ``ssm_state_indices``, ``write_pos`` (int32),
    ``force_flush`` (int32 or None) ``[B]``.
    """
    _expect(mixed_qkv.ndim == 2, f"`mixed_qkv` must be 2D (got ndim={mixed_qkv.ndim}).")
    _expect(b.ndim == 2, f"`b` must be 2D (got b.ndim={b.ndim}).")
    _expect(A_log.ndim == 1, "`A_log` must be a 1D tensor.")
    _expect(initial_state.ndim == 4, f"`initial_state` must be 4D (got ndim={initial_state.ndim}).")
    _expect(write_pos.ndim == 1 and write_pos.dtype == torch.int32, "`write_pos` must be a 1D int32 tensor.")
    _expect(force_flush is None or (force_flush.ndim == 1 and force_flush.dtype == torch.int32),
            "`force_flush` must be a 1D int32 tensor or None.")  # fmt: skip
    B = mixed_qkv.shape[0]
    _, HV, V, K = initial_state.shape
    q_dim = (mixed_qkv.shape[1] - HV * V) // 2
    _expect(q_dim > 0 and q_dim % K == 0 and 2 * q_dim + HV * V == mixed_qkv.shape[1],
            f"Invalid packed `mixed_qkv` last dim={mixed_qkv.shape[1]} for HV={HV}, V={V}, K={K}.")  # fmt: skip
    H = q_dim // K
    _expect(HV % H == 0, f"Invalid head config inferred from mixed_qkv: H={H}, HV={HV}.")
    L = d_cache.shape[2] if d_cache.ndim == 4 else 0
    if is_kda:
        _expect(tuple(a.shape) == (B, HV, K), f"KDA `a` must have shape {(B, HV, K)} (got {tuple(a.shape)}).")
        _expect(tuple(dt_bias.shape) == (HV, K),
                f"KDA `dt_bias` must have shape {(HV, K)} (got {tuple(dt_bias.shape)}).")  # fmt: skip
        g_expect: tuple[int, ...] = (HV, L, K)
    else:
        _expect(tuple(a.shape) == (B, HV), f"GDN `a` must have shape {(B, HV)} (got {tuple(a.shape)}).")
        _expect(tuple(dt_bias.shape) == (HV,),
                f"GDN `dt_bias` must have shape {(HV,)} (got {tuple(dt_bias.shape)}).")  # fmt: skip
        g_expect = (HV, L)
    _expect(A_log.shape[0] == HV and tuple(b.shape) == (B, HV),
            f"`A_log` must be ({HV},) and `b` {(B, HV)} (got {tuple(A_log.shape)}, {tuple(b.shape)}).")  # fmt: skip
    _expect(tuple(d_cache.shape[1:]) == (HV, L, V),
            f"`d_cache` per-slot shape must be {(HV, L, V)} (got {tuple(d_cache.shape[1:])}).")  # fmt: skip
    _expect(tuple(k_cache.shape[1:]) == (H, L, K),
            f"`k_cache` per-slot shape must be {(H, L, K)} (got {tuple(k_cache.shape[1:])}).")  # fmt: skip
    _expect(tuple(g_cache.shape[1:]) == g_expect,
            f"`g_cache` per-slot shape must be {g_expect} (got {tuple(g_cache.shape[1:])}).")  # fmt: skip
    _expect(g_cache.dtype == torch.float32, f"`g_cache` must be float32 (got {g_cache.dtype}).")
    _expect(tuple(out.shape) == (B, 1, HV, V), f"`out` must have shape {(B, 1, HV, V)} (got {tuple(out.shape)}).")
    _expect(write_pos.shape[0] == B and ssm_state_indices.shape[0] == B,
            f"`write_pos` and `ssm_state_indices` must both have length B={B} "
            f"(got {write_pos.shape[0]}, {ssm_state_indices.shape[0]}).")  # fmt: skip
    _expect(force_flush is None or force_flush.shape[0] == B,
            f"`force_flush` must have length B={B} (got {force_flush.shape[0] if force_flush is not None else 0}).")
    if ring_map is None:
        _expect(d_cache.shape[0] == k_cache.shape[0] == g_cache.shape[0] == initial_state.shape[0],
                "ring tensors and `initial_state` must have the same number of slots.")  # fmt: skip
    else:
        _expect(d_cache.shape[0] == k_cache.shape[0] == g_cache.shape[0],
                "ring tensors must have the same number of rows.")  # fmt: skip
        _expect(ring_map.ndim == 1 and ring_map.shape[0] == initial_state.shape[0] and ring_map.dtype == torch.int32,
                f"`ring_map` must be int32 [{initial_state.shape[0]}] (one ring row per state slot).")  # fmt: skip
    return RingShape(B, H, HV, K, V, L)


def check_fused_layout(
    shape: RingShape, mixed_qkv: torch.Tensor, a: torch.Tensor, b: torch.Tensor, dt_bias: torch.Tensor,
    initial_state: torch.Tensor, d_cache: torch.Tensor, k_cache: torch.Tensor, g_cache: torch.Tensor,
    out: torch.Tensor, is_kda: bool,
) -> None:  # fmt: skip
    """What the fused kernels need beyond :func:`check_ring_decode_args`: ``K`` and ``V`` powers of
    two, the last dim of every input contiguous, ``out`` contiguous, the checkpoint and the ring
    tensors contiguous within a slot, KDA's ``dt_bias`` contiguous."""
    K, V = shape.K, shape.V
    _expect(not (K & (K - 1) or V & (V - 1)), f"K={K} and V={V} must be powers of two")
    _expect(mixed_qkv.stride(-1) == 1 and a.stride(-1) == 1 and b.stride(-1) == 1,
            "`mixed_qkv`, `a` and `b` must have a contiguous last dim")  # fmt: skip
    _expect(initial_state.stride(-1) == 1 and initial_state.stride(-2) == K and initial_state.stride(-3) == V * K,
            "`initial_state` must be contiguous within a slot")  # fmt: skip
    for name, t in (("d_cache", d_cache), ("k_cache", k_cache), ("g_cache", g_cache)):
        _expect(t.shape[0] == 0 or t[0].is_contiguous(), f"`{name}` must be contiguous within a slot")
    _expect(out.is_contiguous(), "`out` must be contiguous")
    _expect(not is_kda or dt_bias.is_contiguous(), "KDA `dt_bias` must be contiguous")


def prepare_step(
    shape: RingShape, mixed_qkv: torch.Tensor, a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor,
    dt_bias: torch.Tensor, scale: float, initial_state: torch.Tensor, d_cache: torch.Tensor,
    k_cache: torch.Tensor, g_cache: torch.Tensor, out: torch.Tensor, ssm_state_indices: torch.Tensor,
    write_pos: torch.Tensor, force_flush: torch.Tensor | None, use_l2norm: bool, is_kda: bool,
    ring_map: torch.Tensor | None = None,
) -> RingStep:  # fmt: skip
    """The checked arguments as the kernels take them (see :class:`RingStep`). No copies, except that
    ``A_log`` / ``dt_bias`` narrower than fp32 (SGLang creates ``dt_bias`` in the served dtype) are
    widened to fp32 (exact; ``[HV]`` / ``[HV, K]`` values, what every kernel computes with)."""
    B = shape.B
    if A_log.dtype != torch.float32:
        A_log = A_log.float()
    if dt_bias.dtype != torch.float32:
        dt_bias = dt_bias.float()
    a_arg = a.reshape(B, shape.HV * shape.K) if is_kda else a
    b_arg = b.reshape(B, shape.HV)
    strides = (
        mixed_qkv.stride(0), a_arg.stride(0), b_arg.stride(0), initial_state.stride(0),
        d_cache.stride(0), k_cache.stride(0), g_cache.stride(0),
    )  # fmt: skip
    return RingStep(
        mixed_qkv, a_arg, b_arg, A_log, dt_bias, out, initial_state, d_cache, k_cache, g_cache,
        ssm_state_indices, write_pos, force_flush, force_flush if force_flush is not None else write_pos,
        float(scale), strides, shape, is_kda, use_l2norm, ring_map,
    )  # fmt: skip
