"""Torch references of the device kernels SGLang 0.5.23's EAGLE / NEXTN verify and commit run for a
GDN hybrid without the spec ring: the T-token conv update that keeps every step's window, the
T-step gated delta rule that keeps every step's state and leaves the pool untouched, and the two
commit scatters (which refuse CPU tensors upstream: kernels/ops/mamba/mamba_state_scatter_triton.py).

Chain drafts only (topk 1): tree arguments are refused in one line. The scatters run on CPU tensors
only; on any other device the hook calls SGLang's kernel.
"""

from __future__ import annotations

from typing import Any

import torch

from sglang_replayssm.cpu.standin import gdn


def _refuse_tree(what: str, **tree: Any) -> None:
    given = sorted(k for k, v in tree.items() if v is not None)
    if given:
        raise NotImplementedError(f"{what}: tree drafts ({', '.join(given)}) are not served by the CPU runtime; "
                                  "pass --speculative-eagle-topk 1")


def conv_update_verify(x: torch.Tensor, conv_states: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                       silu: bool, conv_state_indices: torch.Tensor, intermediate_conv_window: torch.Tensor,
                       intermediate_state_indices: torch.Tensor, pad_slot_id: int = -1) -> torch.Tensor:
    """Verify conv (causal_conv1d_triton.py causal_conv1d_update, SAVE_INTERMEDIATE): x [B, dim, T];
    row i starts from conv_states[conv_state_indices[i]], writes each step t's window (after token t)
    to intermediate_conv_window[intermediate_state_indices[i], t] and the window after all T tokens
    back to conv_states (as the kernel does; the commit scatter then sets the accepted step's)."""
    weight = weight.reshape(weight.shape[0], -1)
    width = weight.shape[1]
    out = torch.zeros_like(x)
    for i in range(x.shape[0]):
        slot = int(conv_state_indices[i])
        if slot == pad_slot_id or slot < 0:
            continue
        row = int(intermediate_state_indices[i])
        win = conv_states[slot].to(x.dtype)
        for t in range(x.shape[2]):
            full = torch.cat([win[:, -(width - 1):], x[i, :, t:t + 1]], dim=1)
            y = (full.float() * weight.float()).sum(-1)
            if bias is not None:
                y = y + bias.float()
            out[i, :, t] = (torch.nn.functional.silu(y) if silu else y).to(x.dtype)
            win = full[:, 1:]
            intermediate_conv_window[row, t] = win.to(intermediate_conv_window.dtype)
        conv_states[slot] = win.to(conv_states.dtype)
    return out


def gdn_verify(A_log: torch.Tensor, dt_bias: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               a: torch.Tensor, b: torch.Tensor, initial_state_source: torch.Tensor,
               initial_state_indices: torch.Tensor, cu_seqlens: torch.Tensor, intermediate_states_buffer: torch.Tensor,
               intermediate_state_indices: torch.Tensor, cache_steps: int, use_qk_l2norm_in_kernel: bool = True,
               softplus_beta: float = 1.0, softplus_threshold: float = 20.0, scale: float | None = None
               ) -> torch.Tensor:
    """Target verify (fused_sigmoid_gating_recurrent.py, disable_state_update=True): sequence i (its
    cu_seqlens segment) runs from initial_state_source[initial_state_indices[i]] and stores the state
    after each of its tokens t in intermediate_states_buffer[intermediate_state_indices[i], t]; the
    pool is not written. q,k [1,N,H,K], v [1,N,HV,V], a,b [N,HV]; returns o [1,N,HV,V]."""
    hk, hv = q.shape[-1], v.shape[-2]
    n_tok = q.shape[1]
    q3, k3, v3 = q.reshape(n_tok, -1, hk), k.reshape(n_tok, -1, hk), v.reshape(n_tok, hv, -1)
    g = gdn.gdn_gate(A_log, a.reshape(n_tok, hv), dt_bias, softplus_beta, softplus_threshold)
    beta = torch.sigmoid(b.reshape(n_tok, hv).float())
    qe, ke = gdn.prepare_qk(q3, k3, hv, hk ** -0.5 if scale is None else scale, bool(use_qk_l2norm_in_kernel))
    out = torch.zeros(v3.shape, dtype=torch.float32)
    cu = cu_seqlens.tolist()
    for i in range(len(cu) - 1):
        slot = int(initial_state_indices[i])
        lo, hi = cu[i], cu[i + 1]
        if slot < 0 or hi <= lo:
            continue
        if hi - lo > cache_steps:
            raise ValueError(f"gdn verify: {hi - lo} tokens for {cache_steps} cached steps")
        row = int(intermediate_state_indices[i])
        s = initial_state_source[slot].float()[None]
        for t in range(lo, hi):
            o, s = gdn.delta_rule_step(s, qe[t:t + 1], ke[t:t + 1], v3[t:t + 1].float(), g[t:t + 1], beta[t:t + 1])
            out[t] = o[0]
            intermediate_states_buffer[row, t - lo] = s[0].to(intermediate_states_buffer.dtype)
    return out.to(v.dtype).unsqueeze(0)


def _scatter(dst: torch.Tensor, src: torch.Tensor, dst_indices_raw: torch.Tensor, step_indices_raw: torch.Tensor,
             src_indices_raw: torch.Tensor | None) -> None:
    """for each i with step >= 0 (and a valid dst): dst[:, dst_i] = src[:, src_i, step_i] (every layer)."""
    steps = step_indices_raw.long()
    dsts = dst_indices_raw.long()
    srcs = torch.arange(steps.shape[0]) if src_indices_raw is None else src_indices_raw.long()
    keep = (steps >= 0) & (dsts >= 0) & (dsts < dst.shape[1]) & (srcs < src.shape[1]) & (steps < src.shape[2])
    if bool(keep.any()):
        dst[:, dsts[keep]] = src[:, srcs[keep], steps[keep]].to(dst.dtype)


def mamba_state_scatter(original, dst, src, dst_indices_raw, step_indices_raw, src_indices_raw=None):
    """AROUND hook body for fused_mamba_state_scatter_with_mask: the accepted step's state of each
    row into its slot, in torch on CPU tensors; SGLang's kernel elsewhere."""
    if dst.device.type != "cpu":
        return original(dst, src, dst_indices_raw, step_indices_raw, src_indices_raw)
    return _scatter(dst, src, dst_indices_raw, step_indices_raw, src_indices_raw)


def conv_window_scatter(original, dst, src, dst_indices_raw, step_indices_raw, src_indices_raw=None):
    """AROUND hook body for fused_conv_window_scatter_with_mask (src: the deduplicated, overlapping
    window view; read through its strides): as mamba_state_scatter."""
    if dst.device.type != "cpu":
        return original(dst, src, dst_indices_raw, step_indices_raw, src_indices_raw)
    return _scatter(dst, src, dst_indices_raw, step_indices_raw, src_indices_raw)
