"""Rebuild planted states from records, at the start of the next forward (before SGLang's
deferred copy-on-write reads them).

For each queued :class:`record_match.Rebuild` (``dst`` a fresh tree slot, ``src`` the ancestor's
state or the zero state, ``slots`` the records of the span): ``dst`` gets ``src``'s state (an exact
copy, :func:`snapshot.copy_from_exact`), then every GDN layer runs SGLang's own prefill kernels over
the stored inputs, all rebuilds of the step batched as one varlen sequence set: ``causal_conv1d_fn``
with ``dst``'s conv window as the initial window, the layer's gates, and the extend kernel of its
backend (``GDNKernelDispatcher.extend``), which leaves the state after the span in ``temporal[dst]``
and the conv window of the span's last three inputs in ``conv[dst]``. That is what a prefill from
``src``'s depth computes, with the same kernels, so the result is as exact as SGLang's prefill.

Runs on the forward thread before the forward's first write, so every slot it reads (``src``, the
records) still holds what the match saw: writes to pool slots and record slots happen only in
forwards, and rebuilds queued by a match run before the next one (``ModelRunner.forward``).
"""

from __future__ import annotations

from typing import Any

import torch

from sglang_replayssm.radix.record_match import Rebuild
from sglang_replayssm.radix.records import LayerRecords, RecordPool, pool_of

__all__ = ["rebuild", "run_pending"]


def run_pending(runner: Any) -> int:
    """Before ``ModelRunner.forward``: run the queued rebuilds; returns how many ran."""
    if getattr(runner, "is_draft_worker", False):
        return 0
    req_pool = getattr(runner, "req_to_token_pool", None)
    pool = pool_of(req_pool)
    if pool is None or not pool.pending:
        return 0
    jobs, pool.pending = pool.pending, []
    rebuild(pool, req_pool, jobs)
    return len(jobs)


def rebuild(pool: RecordPool, req_pool: Any, jobs: list[Rebuild]) -> None:
    """Write into each job's ``dst`` the state of ``src`` followed by the job's records."""
    if not jobs:
        return
    translate = req_pool.translate_mamba_indices
    copied = [j for j in jobs if j.src is not None]
    zeroed = [j for j in jobs if j.src is None]
    if copied:
        req_pool.copy_mamba_state(translate(torch.cat([j.src for j in copied])),  # type: ignore[misc]
                                  translate(torch.cat([j.dst for j in copied])))
    if zeroed:
        req_pool.mamba_pool.clear_slots(translate(torch.cat([j.dst for j in zeroed])))
    device = pool.device
    lens = [int(j.slots.numel()) for j in jobs]
    slots = torch.cat([j.slots for j in jobs]).to(device)
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device=device)
    dst = translate(torch.cat([j.dst for j in jobs])).to(device=device, dtype=torch.int32)
    has_state = torch.tensor([j.src is not None for j in jobs], dtype=torch.bool, device=device)
    for layer_id in sorted(pool.layers):
        _fold_gdn_layer(pool.layers[layer_id], req_pool, slots, cu, lens, dst, has_state)


def _fold_gdn_layer(rec: LayerRecords, req_pool: Any, slots: torch.Tensor, cu: torch.Tensor,
                    lens: list[int], dst: torch.Tensor, has_state: torch.Tensor) -> None:
    from sglang.srt.layers.attention.linear import gdn_backend  # its conv is the platform's
    from sglang.srt.utils import is_cpu

    layer, backend = rec.layer, rec.backend
    cache = req_pool.mamba2_layer_cache(layer.layer_id)
    conv_states, ssm_states = cache.conv[0], cache.temporal
    gather = (
        getattr(backend, "requires_contiguous_prefill_state", False)
        and not is_cpu()
        and (not conv_states.is_contiguous() or not ssm_states.is_contiguous())
    )
    if gather:  # as SGLang's forward_extend: kernels that need a contiguous slot layout
        conv_work, ssm_work = conv_states[dst.long()].contiguous(), ssm_states[dst.long()].contiguous()
        idx = torch.arange(dst.numel(), device=dst.device, dtype=dst.dtype)
    else:
        conv_work, ssm_work, idx = conv_states, ssm_states, dst
    x, a, b = rec.x[slots], rec.a[slots], rec.b[slots]
    total = x.shape[0]
    mixed = gdn_backend.causal_conv1d_fn(
        x.transpose(0, 1),
        layer.conv_weights,
        layer.bias,
        activation=layer.activation,
        conv_states=conv_work,
        has_initial_state=has_state,
        cache_indices=idx,
        query_start_loc=cu,
        seq_lens_cpu=lens,
    ).transpose(0, 1)[:total]
    q, k, v = torch.split(mixed, [layer.q_dim, layer.k_dim, layer.v_dim], dim=-1)
    q = q.reshape(1, total, layer.num_q_heads, layer.head_q_dim)
    k = k.reshape(1, total, layer.num_k_heads, layer.head_k_dim)
    v = v.reshape(1, total, layer.num_v_heads, layer.head_v_dim)
    g, beta = backend._prefill_gates(layer, a, b)
    backend.kernel_dispatcher.extend(
        q=q, k=k, v=v, g=g, beta=beta,
        ssm_states=ssm_work,
        cache_indices=idx,
        query_start_loc=cu,
        state_checkpoint_cu_starts=None,
        num_state_checkpoints=0,
        state_checkpoint_every_n_tokens=0,
        output=None,
        layer_id=layer.layer_id,
        extend_prefix_lens=has_state.to(torch.int32),
        track_state=None,
        track_chunk_idx=None,
    )
    if gather:
        conv_states[dst.long()] = conv_work
        ssm_states[dst.long()] = ssm_work
