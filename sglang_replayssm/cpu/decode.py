"""Packed GDN decode on CPU tensors: the ReplaySSM ring decode (torch reference with SGLang's exact
ring layout, cursor and flush semantics) when the pool has rings, the conventional recurrent update
otherwise. With a read copy on the pool (``SGLANG_REPLAYSSM_READ_COPY``, radix/read_copy/store.py) the ring
decode is :func:`sglang_replayssm.kernels.read_copy_ref.read_copy_decode_torch`. Bound as an AROUND
hook on TritonGDNKernel.packed_decode (see cpu/hooks.py)."""

from __future__ import annotations

import torch

from sglang_replayssm.cpu.decode_probe import PROBE
from sglang_replayssm.cpu.standin import gdn
from sglang_replayssm.kernels.read_copy_ref import read_copy_decode_torch
from sglang_replayssm.kernels.ring_decode_ref import ring_decode_torch
from sglang_replayssm.radix.read_copy.store import decode_step, layer_of
from sglang_replayssm.radix.ring.rows import ring_map_of


def _by_slot(d: torch.Tensor, ring_map: torch.Tensor | None) -> torch.Tensor:
    """The ring records ``[slots, ...]`` of each slot: ``d`` itself, or its rows gathered by ``ring_map``."""
    return d if ring_map is None else d[ring_map.long()]


def _packed_decode_plain(mixed_qkv, a, b, A_log, dt_bias, scale, ssm_states, cache_indices, out) -> None:
    n, hv, v_dim = out.shape[0], out.shape[2], out.shape[3]
    q, k, v = gdn.unpack_mixed_qkv(mixed_qkv, hv, v_dim, ssm_states.shape[-1])
    g = gdn.gdn_gate(A_log, a.reshape(n, hv), dt_bias)
    beta = torch.sigmoid(b.reshape(n, hv).float())
    out[:, 0] = gdn.decode_rows(q, k, v, g, beta, scale, ssm_states, cache_indices).to(out.dtype)


def gdn_packed_decode(original, self, mixed_qkv, a, b, *, A_log, dt_bias, scale, ssm_states, cache_indices,
                      num_v_heads, head_v_dim, **kwargs):
    """AROUND hook body: torch on CPU tensors, SGLang's Triton path on any other device."""
    if mixed_qkv.device.type != "cpu":
        return original(self, mixed_qkv, a, b, A_log=A_log, dt_bias=dt_bias, scale=scale,
                        ssm_states=ssm_states, cache_indices=cache_indices, num_v_heads=num_v_heads,
                        head_v_dim=head_v_dim, **kwargs)
    out = mixed_qkv.new_empty(mixed_qkv.shape[0], 1, num_v_heads, head_v_dim)
    ring = [kwargs.get(n) for n in ("replayssm_d", "replayssm_k", "replayssm_g", "replayssm_write_pos")]
    if all(t is not None for t in ring):
        d, k, g, wp = ring
        copy = layer_of(self, ssm_states)
        if copy is not None:
            decode_step(read_copy_decode_torch, copy, mixed_qkv, a, b, A_log, dt_bias, scale, ssm_states, k, g, out,
                        cache_indices, wp, kwargs.get("replayssm_force_flush"), is_kda=False)  # fmt: skip
            if PROBE is not None:
                PROBE.call("gdn", True, out.shape[0])
            return out.transpose(0, 1)
        ring_map = ring_map_of(self)
        if PROBE is not None:  # the probe reads records by slot
            PROBE.before_ring_step(ssm_states, _by_slot(d, ring_map), cache_indices, wp)
        ring_decode_torch(mixed_qkv, a, b, A_log, dt_bias, scale, ssm_states, d, k, g, out, cache_indices, wp,
                          kwargs.get("replayssm_force_flush"), use_qk_l2norm_in_kernel=True, ring_map=ring_map)
        if PROBE is not None:
            PROBE.after_ring_step(ssm_states, _by_slot(d, ring_map), cache_indices, wp)
            PROBE.call("gdn", True, out.shape[0])
    else:
        _packed_decode_plain(mixed_qkv, a, b, A_log, dt_bias, scale, ssm_states, cache_indices, out)
        if PROBE is not None:
            PROBE.call("gdn", False, out.shape[0])
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
