"""Packed GDN decode on CPU tensors: the ReplaySSM ring decode (torch reference with SGLang's exact
ring layout, cursor and flush semantics) when the pool has rings, the conventional recurrent update
otherwise. Bound as an AROUND hook on TritonGDNKernel.packed_decode (see cpu/hooks.py)."""

from __future__ import annotations

import json
import os

import torch

from sglang_replayssm.cpu.standin import gdn
from sglang_replayssm.kernels.ring_decode_ref import ring_decode_torch

#: Counts ring-decode calls in this process.
RING_DECODE_CALLS = 0
#: With SGLANG_REPLAYSSM_RING_TRACE=<path>, each ring decode step of the first linear layer appends one
#: JSON line per live row: the cursor it ran with and what the step did to that slot's pool contents.
_TRACE_PATH = os.environ.get("SGLANG_REPLAYSSM_RING_TRACE")
_trace_layer: int | None = None


def _trace_ring_step(ssm_states, d, cache_indices, wp, before_state, before_d) -> None:
    rows = (cache_indices.long() >= 0).nonzero().flatten().tolist()
    with open(_TRACE_PATH, "a") as f:
        for r in rows:
            slot, m = int(cache_indices[r]), int(wp[r])
            f.write(json.dumps({
                "slot": slot,
                "write_pos": m,
                "checkpoint_written": not torch.equal(ssm_states[slot], before_state[r]),
                "record_written": not torch.equal(d[slot, :, m], before_d[r]),
            }) + "\n")


def _packed_decode_plain(mixed_qkv, a, b, A_log, dt_bias, scale, ssm_states, cache_indices, out) -> None:
    n, hv, v_dim = out.shape[0], out.shape[2], out.shape[3]
    q, k, v = gdn.unpack_mixed_qkv(mixed_qkv, hv, v_dim, ssm_states.shape[-1])
    g = gdn.gdn_gate(A_log, a.reshape(n, hv), dt_bias)
    beta = torch.sigmoid(b.reshape(n, hv).float())
    out[:, 0] = gdn.decode_rows(q, k, v, g, beta, scale, ssm_states, cache_indices).to(out.dtype)


def gdn_packed_decode(original, self, mixed_qkv, a, b, *, A_log, dt_bias, scale, ssm_states, cache_indices,
                      num_v_heads, head_v_dim, **kwargs):
    """AROUND hook body: torch on CPU tensors, SGLang's Triton path on any other device."""
    global RING_DECODE_CALLS
    if mixed_qkv.device.type != "cpu":
        return original(self, mixed_qkv, a, b, A_log=A_log, dt_bias=dt_bias, scale=scale,
                        ssm_states=ssm_states, cache_indices=cache_indices, num_v_heads=num_v_heads,
                        head_v_dim=head_v_dim, **kwargs)
    out = mixed_qkv.new_empty(mixed_qkv.shape[0], 1, num_v_heads, head_v_dim)
    ring = [kwargs.get(n) for n in ("replayssm_d", "replayssm_k", "replayssm_g", "replayssm_write_pos")]
    if all(t is not None for t in ring):
        d, k, g, wp = ring
        global _trace_layer
        trace = _TRACE_PATH is not None and _trace_layer in (None, ssm_states.data_ptr())
        if trace:
            _trace_layer = ssm_states.data_ptr()
            live = cache_indices.long().clamp(min=0)
            before_state = ssm_states[live].clone()
            before_d = d[live, :, wp.long()].clone()
        ring_decode_torch(mixed_qkv, a, b, A_log, dt_bias, scale, ssm_states, d, k, g, out, cache_indices, wp,
                          kwargs.get("replayssm_force_flush"), use_qk_l2norm_in_kernel=True)
        RING_DECODE_CALLS += 1
        if trace:
            _trace_ring_step(ssm_states, d, cache_indices, wp, before_state, before_d)
    else:
        _packed_decode_plain(mixed_qkv, a, b, A_log, dt_bias, scale, ssm_states, cache_indices, out)
    return out.transpose(0, 1)


def track_states_copy(original, conv_states, ssm_states, cache_indices, mamba_track_mask, mamba_track_indices,
                      batch_size, num_layers, conv_strides, ssm_strides, *args, **kwargs):
    """AROUND hook body for SGLang's Triton track-copy launcher: on CPU tensors, the same copy in torch
    (rows < batch_size with the track mask set copy conv and temporal of their working slot into
    their track slot, for every layer the pools hold); on any other device SGLang's kernel."""
    if conv_states.device.type != "cpu":
        return original(conv_states, ssm_states, cache_indices, mamba_track_mask, mamba_track_indices,
                        batch_size, num_layers, conv_strides, ssm_strides, *args, **kwargs)
    if batch_size == 0:
        return None
    src = cache_indices[:batch_size].reshape(-1).long()
    dst = mamba_track_indices[:batch_size].reshape(-1).long()
    rows = mamba_track_mask[:batch_size].reshape(-1).bool() & (src >= 0) & (dst >= 0)
    src, dst = src[rows], dst[rows]
    per_layer = num_layers == 1 and conv_strides[0] == 0
    for pool in (conv_states, ssm_states):
        if per_layer:
            pool[dst] = pool[src]
        else:
            pool[:, dst] = pool[:, src]
    return None
