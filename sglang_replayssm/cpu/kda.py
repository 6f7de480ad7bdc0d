"""Torch KDA (Kimi Delta Attention) pieces for CPU tensors, bound into SGLang 0.5.23 by cpu/hooks_kda.py.

SGLang's CPU engine has no KDA path: `TritonKDAKernel` (layers/attention/linear/kernels/kda_triton.py)
imports its Triton kernels only `if not is_cpu()`, and `KDAAttnBackend._convolve_prefill`
(layers/attention/linear/kda_backend.py) always launches the Triton `causal_conv1d_fn`. These
functions are the AROUND hook bodies for those methods: torch on CPU tensors, SGLang's own code on
any other device.

Math (fp32, same conventions as cpu/standin/gdn.py, state [HV, V, K] with K contiguous):
g = -exp(A_log[h]) * softplus(a + dt_bias) per head and key channel, beta = sigmoid(b), q/k
L2-normalised (eps 1e-6), q scaled by K^-1/2; S_t = S_{t-1} Diag(exp g_t) + beta_t (v_t - (S_{t-1}
Diag(exp g_t)) k_t) k_t^T and o_t = S_t q_t. The safe gate (`lower_bound`) is not implemented and
raises.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from sglang_replayssm.cpu import norm
from sglang_replayssm.cpu.decode_probe import PROBE
from sglang_replayssm.cpu.standin import gdn, ops
from sglang_replayssm.kernels.read_copy_ref import read_copy_decode_torch
from sglang_replayssm.kernels.ring_decode_ref import ring_decode_torch
from sglang_replayssm.radix.read_copy.store import decode_step, layer_of
from sglang_replayssm.radix.ring.rows import ring_map_of

logger = logging.getLogger("sglang_replayssm")
#: The original SGLang method an AROUND hook wraps.
Hooked = Callable[..., Any]

#: Whether this process has logged that KDA decode runs the ring decode (logged once).
_ring_logged = False


def _no_safe_gate(lower_bound: float | None, where: str) -> None:
    if lower_bound is not None:
        raise NotImplementedError(
            f"{where}: the KDA safe gate (lower_bound={lower_bound}) has no CPU implementation "
            "in the sglang-replayssm CPU runtime."
        )


def kda_gate(A_log: torch.Tensor, a: torch.Tensor, dt_bias: torch.Tensor, hv: int) -> torch.Tensor:
    """g [N, HV, K] fp32 from the raw gate a [N, HV*K] or [N, HV, K]; A_log has HV elements and
    dt_bias HV*K: g = -exp(A_log) * softplus(a + dt_bias) (torch's softplus, threshold 20)."""
    x = a.float().reshape(a.shape[0], hv, -1) + dt_bias.float().reshape(hv, -1)
    return -torch.exp(A_log.float().reshape(hv, 1)) * torch.nn.functional.softplus(x)


def _chunk_counts(cu: list[int]) -> list[int]:
    return [(hi - lo + gdn.CHUNK - 1) // gdn.CHUNK for lo, hi in zip(cu[:-1], cu[1:])]


def chunk_kda(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, *,
    ssm_states: torch.Tensor, cache_indices: torch.Tensor, query_start_loc: torch.Tensor,
    A_log: torch.Tensor | None, dt_bias: torch.Tensor | None, beta_is_raw: bool,
    return_intermediate_states: bool, track_state: torch.Tensor | None,
    track_chunk_idx: torch.Tensor | None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Torch stand-in for SGLang's `chunk_kda` as `TritonKDAKernel.extend` calls it (varlen, B=1).

    q,k [1,T,H,K], v [1,T,HV,V], g [1,T,HV,K] raw (A_log given) or activated, beta [1,T,HV] raw or
    sigmoid'ed; ssm_states[cache_indices[i]] is sequence i's initial state and receives its final
    state. Returns o [1,T,HV,V] (v's dtype) and, with return_intermediate_states, h [1,NT,HV,V,K]:
    the state before each 64-token chunk of each sequence, sequences in order (fla chunk_kda's h).
    track_state[i] (fp32) receives sequence i's chunk track_chunk_idx[i] state (the kernel's
    in-kernel snapshot; rows whose index is outside the sequence's chunks are left untouched)."""
    if (track_state is None) != (track_chunk_idx is None):
        raise ValueError("track_state and track_chunk_idx must be passed together")
    if q.shape[0] != 1:
        raise NotImplementedError(f"chunk_kda on CPU: only the packed varlen layout (B=1), got B={q.shape[0]}")
    hv = v.shape[-2]
    if A_log is not None:
        if dt_bias is None:
            raise NotImplementedError("chunk_kda on CPU: A_log without dt_bias")
        gk = kda_gate(A_log, g[0], dt_bias, hv)
    else:
        gk = g[0].float().reshape(g.shape[1], hv, -1)
    b = beta[0].float()
    if beta_is_raw:
        b = torch.sigmoid(b)
    scale = q.shape[-1] ** -0.5
    o, h = gdn.recurrent_varlen(q[0], k[0], v[0], gk, b, ssm_states, cache_indices, query_start_loc,
                                scale, True)
    if track_state is not None:
        assert track_chunk_idx is not None
        if track_state.dtype != torch.float32:
            raise ValueError(f"track_state must be fp32, got {track_state.dtype}")
        counts = _chunk_counts(query_start_loc.tolist())
        starts = [sum(counts[:i]) for i in range(len(counts))]
        for i, c in enumerate(track_chunk_idx.tolist()):
            if i < len(counts) and 0 <= c < counts[i]:
                track_state[i] = h[starts[i] + c]
    o = o.unsqueeze(0)
    if return_intermediate_states:
        return o, h.to(q.dtype).unsqueeze(0)
    return o


def extend(original: Hooked, self: Any, q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, *,
           ssm_states: Tensor, cache_indices: Tensor, query_start_loc: Tensor, A_log: Tensor | None = None,
           dt_bias: Tensor | None = None, lower_bound: float | None = None, beta_is_raw: bool = False,
           return_intermediate_states: bool = False, **kwargs: Any) -> Tensor | tuple[Tensor, Tensor]:
    """AROUND hook body for TritonKDAKernel.extend (kernels/kda_triton.py)."""
    if q.device.type != "cpu":
        return original(self, q, k, v, g, beta, ssm_states=ssm_states, cache_indices=cache_indices,
                        query_start_loc=query_start_loc, A_log=A_log, dt_bias=dt_bias,
                        lower_bound=lower_bound, beta_is_raw=beta_is_raw,
                        return_intermediate_states=return_intermediate_states, **kwargs)
    _no_safe_gate(lower_bound, "TritonKDAKernel.extend")
    if kwargs.get("chunk_indices") is not None or kwargs.get("chunk_offsets") is not None:
        raise NotImplementedError("TritonKDAKernel.extend on CPU: prefill-graph chunk tables are not supported")
    return chunk_kda(q, k, v, g, beta, ssm_states=ssm_states, cache_indices=cache_indices,
                     query_start_loc=query_start_loc, A_log=A_log, dt_bias=dt_bias, beta_is_raw=beta_is_raw,
                     return_intermediate_states=return_intermediate_states,
                     track_state=kwargs.get("track_state"), track_chunk_idx=kwargs.get("track_chunk_idx"))


def packed_decode(original: Hooked, self: Any, mixed_qkv: Tensor, a: Tensor, b: Tensor, *, A_log: Tensor,
                  dt_bias: Tensor, scale: float, ssm_states: Tensor, cache_indices: Tensor, num_v_heads: int,
                  head_v_dim: int, lower_bound: float | None = None, **kwargs: Any) -> Tensor:
    """AROUND hook body for TritonKDAKernel.packed_decode (kernels/kda_triton.py).

    With the pool's ReplaySSM rings (replayssm_d/k/g + write cursor) it runs the ring decode
    (`ring_decode_torch`, the torch twin of `fused_recurrent_linear_replayssm_decode`, is_kda=True)
    with the arguments SGLang's method passes the Triton kernel; otherwise the conventional packed
    recurrent update. Returns [1, B, HV, V] like SGLang's method."""
    global _ring_logged
    if mixed_qkv.device.type != "cpu":
        return original(self, mixed_qkv, a, b, A_log=A_log, dt_bias=dt_bias, scale=scale, ssm_states=ssm_states,
                        cache_indices=cache_indices, num_v_heads=num_v_heads, head_v_dim=head_v_dim,
                        lower_bound=lower_bound, **kwargs)
    _no_safe_gate(lower_bound, "TritonKDAKernel.packed_decode")
    n = mixed_qkv.shape[0]
    out = mixed_qkv.new_empty(n, 1, num_v_heads, head_v_dim)
    ring = [kwargs.get(name) for name in ("replayssm_d", "replayssm_k", "replayssm_g", "replayssm_write_pos")]
    if all(t is not None for t in ring):
        d, kc, gc, wp = (t for t in ring if t is not None)
        k_dim = ssm_states.shape[-1]
        a_, b_ = a.reshape(n, num_v_heads, k_dim).contiguous(), b.reshape(n, num_v_heads).contiguous()
        A_log_, dt_bias_ = A_log.reshape(-1), dt_bias.reshape(num_v_heads, k_dim).contiguous()
        copy = layer_of(self, ssm_states)
        if copy is not None:  # the read copy (radix/read_copy/store.py)
            decode_step(read_copy_decode_torch, copy, mixed_qkv, a_, b_, A_log_, dt_bias_, scale, ssm_states, kc, gc,
                        out, cache_indices, wp, kwargs.get("replayssm_force_flush"), is_kda=True)  # fmt: skip
        else:
            ring_decode_torch(mixed_qkv, a_, b_, A_log_, dt_bias_, scale, ssm_states, d, kc, gc, out, cache_indices,
                              wp, kwargs.get("replayssm_force_flush"), use_qk_l2norm_in_kernel=True, is_kda=True,
                              ring_map=ring_map_of(self))  # fmt: skip
        if not _ring_logged:
            _ring_logged = True
            logger.warning("KDA decode runs the ReplaySSM ring decode on CPU (torch ring_decode_torch, is_kda=True, "
                           "ring length %d)", d.shape[2])
        if PROBE is not None:
            PROBE.call("kda", True, n)
        return out.transpose(0, 1)
    if any(t is not None for t in ring):
        raise ValueError("TritonKDAKernel.packed_decode: ReplaySSM ring arguments are only partly given")
    q, k, v = gdn.unpack_mixed_qkv(mixed_qkv, num_v_heads, head_v_dim, ssm_states.shape[-1])
    g = kda_gate(A_log, a.reshape(n, -1), dt_bias, num_v_heads)
    beta = torch.sigmoid(b.reshape(n, num_v_heads).float())
    out[:, 0] = gdn.decode_rows(q, k, v, g, beta, scale, ssm_states, cache_indices).to(out.dtype)
    if PROBE is not None:
        PROBE.call("kda", False, n)
    return out.transpose(0, 1)


def decode(original: Hooked, self: Any, q: Tensor, k: Tensor, v: Tensor, a: Tensor, b: Tensor, *, A_log: Tensor,
           dt_bias: Tensor, ssm_states: Tensor, cache_indices: Tensor, query_start_loc: Tensor | None,
           lower_bound: float | None = None, **kwargs: Any) -> Tensor:
    """AROUND hook body for TritonKDAKernel.decode (kernels/kda_triton.py): q,k [1,N,H,K],
    v [1,N,HV,V], one token per sequence; returns o [1,N,HV,V]."""
    if q.device.type != "cpu":
        return original(self, q, k, v, a, b, A_log=A_log, dt_bias=dt_bias, ssm_states=ssm_states,
                        cache_indices=cache_indices, query_start_loc=query_start_loc, lower_bound=lower_bound,
                        **kwargs)
    _no_safe_gate(lower_bound, "TritonKDAKernel.decode")
    n, hv = q.shape[1], v.shape[2]
    if query_start_loc is not None and int(query_start_loc[-1]) != query_start_loc.numel() - 1:
        raise NotImplementedError("TritonKDAKernel.decode on CPU: only one token per sequence")
    g = kda_gate(A_log, a.reshape(n, -1), dt_bias, hv)
    beta = torch.sigmoid(b.reshape(n, hv).float())
    o = gdn.decode_rows(q[0], k[0], v[0], g, beta, q.shape[-1] ** -0.5, ssm_states, cache_indices)
    return o.to(v.dtype).unsqueeze(0)


def target_verify(original: Hooked, self: Any, *args: Any, **kwargs: Any) -> Tensor:
    """AROUND hook body for TritonKDAKernel.target_verify (kernels/kda_triton.py): speculative
    verify has no CPU implementation; on CPU tensors it raises instead of a NameError deep inside."""
    q = kwargs.get("q", args[2] if len(args) > 2 else None)
    if q is not None and q.device.type != "cpu":
        return original(self, *args, **kwargs)
    raise NotImplementedError("KDA speculative target_verify has no CPU implementation in the sglang-replayssm "
                              "CPU runtime (run without speculative decoding).")


def convolve_prefill(original: Hooked, self: Any, layer: Any, forward_batch: Any, mixed_qkv: Tensor,
                     conv_states: Tensor, cache_indices: Tensor) -> Tensor:
    """AROUND hook body for KDAAttnBackend._convolve_prefill (kda_backend.py): the varlen causal
    conv over [T, dim] with the pool's [dim, W-1] windows (conv_states is the transposed view)."""
    if mixed_qkv.device.type != "cpu":
        return original(self, layer, forward_batch, mixed_qkv, conv_states, cache_indices)
    out = ops.causal_conv1d_fwd_cpu(
        mixed_qkv.transpose(0, 1), layer.conv_weights, layer.bias, conv_states,
        self.forward_metadata.query_start_loc, cache_indices, forward_batch.extend_prefix_lens > 0, True,
    )
    return out.transpose(0, 1)


def fused_rmsnorm_gated_forward(original: Hooked, self: Any, x: Tensor, g: Tensor, residual: Tensor | None = None,
                                prenorm: bool = False, residual_in_fp32: bool = False) -> Tensor:
    """AROUND hook body for FusedRMSNormGated.forward (kernels/ops/attention/fla/fused_norm_gate.py):
    y = RMSNorm(x) * weight * act(g) per row of the last dim (Kimi's o_norm uses sigmoid)."""
    if x.device.type != "cpu":
        return original(self, x, g, residual=residual, prenorm=prenorm, residual_in_fp32=residual_in_fp32)
    if residual is not None or prenorm:
        raise NotImplementedError("FusedRMSNormGated on CPU: residual / prenorm are not supported")
    if self.bias is not None:
        raise NotImplementedError("FusedRMSNormGated on CPU: a bias is not supported")
    weight: Any = self.weight if self.weight is not None else torch.ones(x.shape[-1])
    return norm.rms_norm_gated(x, weight, g.reshape(x.shape), self.eps, None, True, self.activation)

