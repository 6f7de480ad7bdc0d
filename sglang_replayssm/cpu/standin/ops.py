"""Torch reference implementations of the `torch.ops.sgl_kernel.*` ops SGLang's CPU engine calls.

Each op is set on the `torch.ops.sgl_kernel` namespace as a plain Python callable with the
argument order SGLang 0.5.23 uses at its call site (named in each docstring).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from sglang_replayssm.cpu.standin import gdn

REGISTERED: dict[str, Callable] = {}
PYTHON_API: dict[str, Callable] = {}


def op(fn: Callable) -> Callable:
    REGISTERED[fn.__name__] = fn
    return fn


def register_all() -> None:
    ns = torch.ops.sgl_kernel
    for name, fn in REGISTERED.items():
        setattr(ns, name, fn)


def _gemma_rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Gemma-style RMSNorm (scale is 1 + weight), computed in fp32 and cast back."""
    xf = x.float()
    out = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * (1.0 + weight.float())
    return out.to(x.dtype)


@op
def fused_sigmoid_mul_cpu(x: torch.Tensor, gate: torch.Tensor) -> None:
    """x *= sigmoid(gate), in place (models/qwen3_5.py: gate may be a [T, heads, d] strided view)."""
    x.mul_(torch.sigmoid(gate.float()).to(x.dtype).reshape(x.shape))


@op
def fused_qk_gemma_rmsnorm_cpu(q, k, q_weight, k_weight, eps: float, head_dim: int):
    """Per-head Gemma RMSNorm of q and k (models/qwen3_5.py); returns [-1, head_dim] tensors."""
    return (
        _gemma_rmsnorm(q.reshape(-1, head_dim), q_weight, eps),
        _gemma_rmsnorm(k.reshape(-1, head_dim), k_weight, eps),
    )


@op
def fused_qk_gemma_rmsnorm_with_gate_cpu(q_gate, k, q_weight, k_weight, eps: float, head_dim: int, num_heads: int):
    """Split q_gate [T, heads*(2*d)] per head into (q, gate), norm q and k; returns (q, k, gate)."""
    t = q_gate.shape[0]
    q, gate = torch.chunk(q_gate.reshape(t, num_heads, 2 * head_dim), 2, dim=-1)
    q_out = _gemma_rmsnorm(q.reshape(-1, head_dim), q_weight, eps)
    k_out = _gemma_rmsnorm(k.reshape(-1, head_dim), k_weight, eps)
    return q_out, k_out, gate.contiguous()


@op
def fused_qkvzba_split_reshape_cat_contiguous_cpu(mixed_qkvz, mixed_ba, num_heads_qk, num_heads_v, head_qk, head_v):
    """Contiguous Qwen3.5 layout [q|k|v|z], [b|a] -> (cat(q,k,v), z [T,HV,dv], b [T,HV], a [T,HV])."""
    kd, vd = num_heads_qk * head_qk, num_heads_v * head_v
    q, k, v, z = mixed_qkvz.split([kd, kd, vd, vd], dim=-1)
    b, a = mixed_ba.split([num_heads_v, num_heads_v], dim=-1)
    mixed_qkv = torch.cat([q, k, v], dim=-1)
    return mixed_qkv, z.reshape(z.shape[0], num_heads_v, head_v).contiguous(), b.contiguous(), a.contiguous()


# --- causal conv1d (gdn_backend.py / kda_backend.py via sgl_kernel.mamba) -------------------------

def _conv_window_out(window: torch.Tensor, weight: torch.Tensor, bias, silu: bool) -> torch.Tensor:
    """window [..., dim, W] (oldest first), weight [dim, W] -> [..., dim]."""
    y = (window.float() * weight.float()).sum(-1)
    if bias is not None:
        y = y + bias.float()
    return F.silu(y) if silu else y


@op
def causal_conv1d_fwd_cpu(x, weight, bias, conv_states, query_start_loc, cache_indices, has_initial_state,
                          silu: bool, pad_slot_id: int = -1, _unused: bool = True):
    """Varlen causal conv: x [dim, T] -> [dim, T]; conv_states[slot] [dim, W-1] is the window before
    each sequence (zeros unless has_initial_state) and is replaced by its last W-1 inputs."""
    weight = weight.reshape(weight.shape[0], -1)
    width = weight.shape[1]
    out = torch.empty_like(x)
    cu = query_start_loc.tolist()
    for i in range(len(cu) - 1):
        lo, hi = cu[i], cu[i + 1]
        slot = int(cache_indices[i])
        if slot == pad_slot_id or hi <= lo:
            continue
        init = conv_states[slot].to(x.dtype) if bool(has_initial_state[i]) else x.new_zeros(x.shape[0], width - 1)
        seq = torch.cat([init, x[:, lo:hi]], dim=1)  # [dim, W-1+L]
        windows = seq.unfold(1, width, 1)  # [dim, L, W]
        out[:, lo:hi] = _conv_window_out(windows.transpose(0, 1), weight, bias, silu).transpose(0, 1).to(x.dtype)
        conv_states[slot] = seq[:, -(width - 1):].to(conv_states.dtype)
    return out


@op
def causal_conv1d_update_cpu(x, conv_states, weight, bias, silu: bool, cache_seqlens=None,
                             conv_state_indices=None, pad_slot_id: int = -1, _unused: bool = True):
    """Decode conv: x [B, dim] or [B, dim, L]; shifts each row's window left by one per token."""
    if cache_seqlens is not None:
        raise NotImplementedError("circular conv_state (cache_seqlens) is not used by SGLang's CPU engine")
    weight = weight.reshape(weight.shape[0], -1)
    width = weight.shape[1]
    squeeze = x.dim() == 2
    xs = x.unsqueeze(-1) if squeeze else x
    out = torch.empty_like(xs)
    for i in range(xs.shape[0]):
        slot = i if conv_state_indices is None else int(conv_state_indices[i])
        if slot == pad_slot_id:
            out[i] = 0
            continue
        win = conv_states[slot].to(xs.dtype)
        for t in range(xs.shape[2]):
            full = torch.cat([win[:, -(width - 1):], xs[i, :, t : t + 1]], dim=1)
            out[i, :, t] = _conv_window_out(full, weight, bias, silu).to(xs.dtype)
            win = full[:, 1:]
        conv_states[slot] = win.to(conv_states.dtype)
    return out.squeeze(-1) if squeeze else out


# --- GDN gates and recurrence (gdn_backend.py, kernels/gdn_triton.py) -------------------------

@op
def fused_gdn_gating_cpu(A_log, a, b, dt_bias):
    """(g, beta) each [1, T, HV] fp32: g = -exp(A_log) softplus(a + dt_bias), beta = sigmoid(b)."""
    g = gdn.gdn_gate(A_log, a, dt_bias)
    return g.unsqueeze(0), torch.sigmoid(b.float()).unsqueeze(0)


@op
def chunk_gated_delta_rule_cpu(q, k, v, g, beta, initial_state, output_final_state, cu_seqlens, head_first,
                               use_qk_l2norm_in_kernel, initial_state_indices):
    """Prefill: q,k [1,T,H,K], v [1,T,HV,V], g/beta [1,T,HV]; state pool updated in place.
    Returns (o, state pool, h [1,NT,HV,V,K] per-chunk states, see gdn.recurrent_varlen)."""
    if head_first:
        raise NotImplementedError("head_first layout is not used by SGLang's CPU engine")
    scale = q.shape[-1] ** -0.5
    o, h = gdn.recurrent_varlen(q[0], k[0], v[0], g[0], beta[0], initial_state, initial_state_indices,
                                cu_seqlens, scale, bool(use_qk_l2norm_in_kernel))
    return o.unsqueeze(0), initial_state, h.to(q.dtype).unsqueeze(0)


@op
def fused_sigmoid_gating_delta_rule_update_cpu(A_log, dt_bias, q, k, v, a, b, initial_state_source,
                                               initial_state_indices, cu_seqlens=None,
                                               use_qk_l2norm_in_kernel=True, softplus_beta=1.0,
                                               softplus_threshold=20.0, scale=None, **unused):
    """Decode (one token per sequence): gates from a/b, state pool updated in place; o [1,B,HV,V]."""
    if unused.get("disable_state_update") and not unused.get("is_kda"):  # GDN verify (cpu/spec_standin.py)
        from sglang_replayssm.cpu import spec_standin

        spec_standin._refuse_tree("fused_sigmoid_gating_delta_rule_update_cpu",
                                  retrieve_parent_token=unused.get("retrieve_parent_token"))
        return spec_standin.gdn_verify(A_log, dt_bias, q, k, v, a, b, initial_state_source, initial_state_indices,
                                       cu_seqlens, unused["intermediate_states_buffer"],
                                       unused["intermediate_state_indices"], unused["cache_steps"],
                                       use_qk_l2norm_in_kernel, softplus_beta, softplus_threshold, scale)
    if unused.get("disable_state_update") or unused.get("is_kda"):
        raise NotImplementedError("target-verify / KDA variants are not used by the CPU runtime")
    n = initial_state_indices.shape[0]
    hk = q.shape[-1]
    q3, k3 = q.reshape(n, -1, hk), k.reshape(n, -1, hk)
    v3 = v.reshape(n, -1, v.shape[-1])
    hv = v3.shape[1]
    g = gdn.gdn_gate(A_log, a.reshape(n, hv), dt_bias, softplus_beta, softplus_threshold)
    beta = torch.sigmoid(b.reshape(n, hv).float())
    out = gdn.decode_rows(q3, k3, v3, g, beta, hk ** -0.5 if scale is None else scale, initial_state_source,
                          initial_state_indices, bool(use_qk_l2norm_in_kernel))
    return out.to(v.dtype).unsqueeze(0)
