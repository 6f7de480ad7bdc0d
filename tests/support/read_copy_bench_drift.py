"""A long synthetic gated-delta recurrence run through the read-copy decode and its alternatives.

The same per-step inputs (realistic gates: per-head or per-channel decays in ``[0.9, 0.9999]``,
q/k L2-normalised in the kernel, bf16 ``mixed_qkv`` as SGLang passes) go through:

* ``oracle``: the fp64 recurrence (:func:`sglang_replayssm.kernels.naive.recurrent_step_fp64`), ground truth;
* ``fp32``: fp32 sequential decode (SGLang's packed decode with an fp32 state);
* ``copy-bf16`` / ``copy-fp8``: :func:`sglang_replayssm.kernels.read_copy_ref.read_copy_decode_torch` with a ring of
  ``L`` and rows at staggered cursors (row ``r`` forced to flush at step ``r mod L`` once, then
  every ``L`` steps, so every step has flush and non-flush rows, as in serving);
* ``shared-bf16`` / ``shared-fp8``: fp32 steps on a state stored in bf16 / fp8 (same scales as the
  copy) between steps, i.e. a low-precision checkpoint that the recurrence itself reads.

Shapes: ``B`` rows in slots ``1..B`` (slot 0 unused), ``H`` key heads, ``HV`` value heads, ``K``/``V``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from sglang_replayssm.kernels.constants import L2NORM_EPS, SOFTPLUS_THRESHOLD
from sglang_replayssm.kernels.naive import (
    compute_beta_fp64,
    compute_gate_fp64,
    recurrent_step_fp64,
    unpack_mixed_qkv,
)
from sglang_replayssm.kernels.read_copy_format import CopyFormat, alloc_read_copy, dequantize, quantize
from sglang_replayssm.kernels.read_copy_ref import read_copy_decode_torch

__all__ = ["DriftInputs", "DriftRun", "make_inputs", "run_copy", "run_oracle", "run_shared", "rel"]


@dataclass
class DriftInputs:
    """Per-step decode inputs, leading dim ``T``: ``qkv`` ``[T, B, 2HK+HV*V]`` bf16, ``a`` ``[T, B, HV]``
    (GDN) or ``[T, B, HV, K]`` (KDA) fp32, ``b`` ``[T, B, HV]`` bf16; ``A_log`` ``[HV]`` (zeros: A=1),
    ``dt_bias`` zeros; ``S0`` ``[B, HV, V, K]`` fp32."""

    qkv: torch.Tensor
    a: torch.Tensor
    b: torch.Tensor
    A_log: torch.Tensor
    dt_bias: torch.Tensor
    S0: torch.Tensor
    H: int
    HV: int
    K: int
    V: int
    is_kda: bool

    @property
    def T(self) -> int:
        return self.qkv.shape[0]

    @property
    def B(self) -> int:
        return self.qkv.shape[1]


@dataclass
class DriftRun:
    """``out`` ``[T, B, HV, V]`` fp64; ``flushed``: (step, row, checkpoint ``[HV, V, K]`` fp64) per flush."""

    out: torch.Tensor
    flushed: list[tuple[int, int, torch.Tensor]]


def make_inputs(
    T: int, B: int, H: int, HV: int, K: int, V: int, is_kda: bool, seed: int = 0, b_mean: float = -1.0
) -> DriftInputs:
    """Random inputs whose decays ``exp(g)`` lie in ``[0.9, 0.9999]`` (log-uniform in ``1 - decay``);
    ``b ~ N(b_mean, 1)``: a low ``b_mean`` (e.g. -4, ``beta`` ~0.02-0.1) writes weakly and keeps a long
    memory, the regime where a shared low-precision state accumulates error over thousands of steps
    (with ``beta`` ~0.3 and small ``K`` every key direction is overwritten within ~100 steps, and a
    shared state's error saturates that early). Drawn on the CPU (the same values on any device), then
    moved to torch's current default device."""
    device = torch.get_default_device()
    with torch.device("cpu"):
        inp = _draw_inputs(T, B, H, HV, K, V, is_kda, seed, b_mean)
    return DriftInputs(inp.qkv.to(device), inp.a.to(device), inp.b.to(device), inp.A_log.to(device),
                       inp.dt_bias.to(device), inp.S0.to(device), H, HV, K, V, is_kda)  # fmt: skip


def _draw_inputs(
    T: int, B: int, H: int, HV: int, K: int, V: int, is_kda: bool, seed: int, b_mean: float
) -> DriftInputs:
    gen = torch.Generator().manual_seed(seed)
    qkv = torch.randn(T, B, 2 * H * K + HV * V, generator=gen).to(torch.bfloat16)
    gshape = (T, B, HV, K) if is_kda else (T, B, HV)
    # per head (GDN) / channel (KDA) a fixed base decay, jittered per step
    base = torch.rand(gshape[2:], generator=gen) * (math.log(0.1) - math.log(1e-4)) + math.log(1e-4)
    one_minus = torch.exp(base + 0.1 * torch.randn(gshape, generator=gen)).clamp(1e-4, 0.1)
    y = -torch.log1p(-one_minus)  # softplus(a) = -log(decay), A = 1
    a = torch.log(torch.expm1(y))
    b = (torch.randn(T, B, HV, generator=gen) + b_mean).to(torch.bfloat16)
    S0 = torch.randn(B, HV, V, K, generator=gen) * 0.05
    return DriftInputs(
        qkv, a, b, torch.zeros(HV), torch.zeros((HV, K) if is_kda else (HV,)), S0, H, HV, K, V, is_kda
    )


def _step64(inp: DriftInputs, t: int, S: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """One recurrence step of every row in ``dtype`` (fp64 oracle or fp32 decode)."""
    q, k, v = unpack_mixed_qkv(inp.qkv[t], inp.H, inp.K, inp.HV, inp.V)
    if dtype == torch.float64:
        g = compute_gate_fp64(inp.a[t], inp.A_log, inp.dt_bias, is_kda=inp.is_kda)
        beta = compute_beta_fp64(inp.b[t])
        return recurrent_step_fp64(S, q, k, v, g, beta, scale=inp.K**-0.5)
    # fp32 gate and beta exactly as the kernels compute them
    xg = inp.a[t].float() + inp.dt_bias.float()
    sp = torch.where(xg <= SOFTPLUS_THRESHOLD, torch.log(1.0 + torch.exp(xg)), xg)
    A = torch.exp(inp.A_log.float())
    g32 = -(A[:, None] if inp.is_kda else A) * sp
    beta32 = torch.sigmoid(inp.b[t].float()).to(inp.b.dtype).float()
    return _step_fp32(S, q.float(), k.float(), v.float(), g32, beta32, inp)


def _step_fp32(
    S: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
    inp: DriftInputs,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """fp32 sequential decode, the ops of :mod:`sglang_replayssm.kernels.read_copy_ref`'s exact flush."""
    G = inp.HV // inp.H
    q = q * (1.0 / torch.sqrt((q * q).sum(-1, keepdim=True) + L2NORM_EPS)) * inp.K**-0.5
    k = k * (1.0 / torch.sqrt((k * k).sum(-1, keepdim=True) + L2NORM_EPS))
    qv, kv = q.repeat_interleave(G, dim=1), k.repeat_interleave(G, dim=1)
    alpha = torch.exp(g)
    S_dec = S * (alpha[:, :, None, :] if inp.is_kda else alpha[:, :, None, None])
    d = beta[..., None] * (v - torch.einsum("nhvk,nhk->nhv", S_dec, kv))
    o = torch.einsum("nhvk,nhk->nhv", S_dec, qv) + d * (kv * qv).sum(-1)[..., None]
    return o, S_dec + d[..., :, None] * kv[..., None, :]


def run_oracle(inp: DriftInputs, dtype: torch.dtype = torch.float64, states_at: set[int] | None = None) -> tuple[
    torch.Tensor, dict[int, torch.Tensor]
]:  # fmt: skip
    """Sequential decode in ``dtype``: outputs ``[T, B, HV, V]`` fp64 and the states after the steps in ``states_at``."""
    S = inp.S0.to(dtype)
    outs = torch.empty(inp.T, inp.B, inp.HV, inp.V, dtype=torch.float64)
    kept: dict[int, torch.Tensor] = {}
    for t in range(inp.T):
        o, S = _step64(inp, t, S, dtype)
        outs[t] = o.double()
        if states_at is not None and t in states_at:
            kept[t] = S.double().clone()
    return outs, kept


def run_shared(inp: DriftInputs, fmt: CopyFormat) -> torch.Tensor:
    """fp32 steps on a state rounded to ``fmt`` after every step; outputs ``[T, B, HV, V]`` fp64."""
    S = inp.S0.clone()
    outs = torch.empty(inp.T, inp.B, inp.HV, inp.V, dtype=torch.float64)
    for t in range(inp.T):
        S = dequantize(*quantize(S, fmt, inp.is_kda), inp.is_kda)
        o, S = _step64(inp, t, S, torch.float32)
        outs[t] = o.double()
    return outs


def run_copy(
    inp: DriftInputs, fmt: CopyFormat, L: int, keep_flushed: bool = True, decode: Callable = read_copy_decode_torch,
    d_dtype: torch.dtype = torch.float32, records_in_ring: bool = False, v_dtype: torch.dtype = torch.bfloat16,
) -> DriftRun:
    """The read-copy decode over all steps, rows at staggered cursors (module docstring); ``decode``:
    the torch reference or a fused kernel with its signature (run on ``inp``'s device); ``d_dtype`` /
    ``v_dtype``: the ``d~`` / ``v`` rings' dtypes; ``records_in_ring``: ``d~`` and ``v`` (both bf16) are
    the two halves of each slot of one fp32 ``[slots, HV, L, V]`` ring, as ``radix/read_copy.attach``
    carves them out of SGLang's ``replayssm_d`` (slot stride ``2 * HV * L * V``)."""
    B, H, HV, K, V, kda = inp.B, inp.H, inp.HV, inp.K, inp.V, inp.is_kda
    n = B + 1
    state = torch.zeros(n, HV, V, K)
    state[1:] = inp.S0
    copy, scales = alloc_read_copy(n, HV, V, K, fmt, kda)
    q, sc = quantize(state, fmt, kda)
    copy.copy_(q)
    if scales is not None and sc is not None:
        scales.copy_(sc)
    nan = float("nan")
    if records_in_ring:
        if d_dtype != torch.bfloat16:
            raise ValueError("records_in_ring needs a bf16 d~ ring")
        pair = torch.empty(n, HV, L, V).view(torch.bfloat16).view(n, 2, HV, L, V).fill_(nan)
        d_c, v_c = pair[:, 0], pair[:, 1]
    else:
        d_c = torch.full((n, HV, L, V), nan, dtype=d_dtype)
        v_c = torch.full((n, HV, L, V), nan, dtype=v_dtype)
    k_c = torch.full((n, H, L, K), nan)
    g_c = torch.full((n, HV, L, K) if kda else (n, HV, L), nan)
    b_c = torch.full((n, HV, L), nan)
    slots = torch.arange(1, B + 1, dtype=torch.int32)
    wp = torch.zeros(B, dtype=torch.int32)
    out = torch.empty(B, 1, HV, V, dtype=torch.float32)
    outs = torch.empty(inp.T, B, HV, V, dtype=torch.float64)
    flushed: list[tuple[int, int, torch.Tensor]] = []
    rows = torch.arange(B)
    for t in range(inp.T):
        ff = ((rows % L) == t).to(torch.int32) if t < L else torch.zeros(B, dtype=torch.int32)
        decode(
            inp.qkv[t], inp.a[t], inp.b[t], inp.A_log, inp.dt_bias, K**-0.5, state, copy, scales,
            d_c, k_c, g_c, v_c, b_c, out, slots, wp, ff, use_qk_l2norm_in_kernel=True, is_kda=kda,
        )  # fmt: skip
        outs[t] = out[:, 0].double()
        is_flush = (wp == L - 1) | (ff != 0)
        if keep_flushed:
            for r in torch.nonzero(is_flush).flatten().tolist():
                flushed.append((t, r, state[r + 1].double().clone()))
        wp = torch.where(is_flush, torch.zeros_like(wp), wp + 1)
    return DriftRun(outs, flushed)


def rel(x: torch.Tensor, ref: torch.Tensor, dims: tuple[int, ...] | None = None) -> torch.Tensor:
    """Norm-wise relative error ``||x - ref|| / ||ref||`` over ``dims`` (all when None)."""
    if dims is None:
        return (x - ref).norm() / ref.norm().clamp_min(1e-300)
    return (x - ref).pow(2).sum(dims).sqrt() / ref.pow(2).sum(dims).sqrt().clamp_min(1e-300)
