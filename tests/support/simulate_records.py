"""Records in the simulation (``SimConfig(records=True)``, GDN): capture, match, rebuild as a server does.

The simulated server's GDN layers are the toy model's: the conv is the identity on the token's row
(the pool's window holds raw rows, :meth:`ToyModel.conv_window`), the gates come from the per-layer
``A_log`` / ``dt_bias``. So the rebuild runs the product code (:func:`record_rebuild.rebuild`) with
those layers and the CPU engine's kernels (the conv, gates and chunk stand-ins a CPU server runs),
and the property checks then compare every planted node with the fp64 oracle of its token path.

* :func:`attach`: a :class:`RecordPool` on the simulation's pool (capacity ``cfg.record_tokens``).
* :func:`assign`: after an allocation, the new tokens get slots.
* :func:`run_pending`: at the start of a simulated forward (prefill and decode), the queued rebuilds
  (and, with HiCache, the queued record loads, in queue order: :mod:`record_hicache`).
* :func:`capture`: then the forward's tokens' inputs.
* :func:`kept_depths` / :func:`assign_states` / :func:`capture_states`: with ``cfg.state_interval``,
  the prefill states the product keeps (:mod:`interval_states`), on the grid of ``cfg.chunk``.
"""

from __future__ import annotations

import types
from collections.abc import Sequence
from typing import Any
from unittest import mock

import torch

from sglang_replayssm.radix import config
from sglang_replayssm.radix.records import rebuild as record_rebuild
from sglang_replayssm.radix.records.hicache import host_records as record_hicache
from sglang_replayssm.radix.records.interval_states import IntervalStates, kept_positions
from sglang_replayssm.radix.records.pool import RecordPool, pool_of
from sglang_replayssm.radix.records.pool import attach as attach_pool
from sglang_replayssm.state import state_of

__all__ = [
    "assign",
    "assign_states",
    "attach",
    "capture",
    "capture_states",
    "KDAAttnBackend",
    "cpu_engine_backend",
    "kept_depths",
    "run_pending",
    "toy_layer",
]


def cpu_engine_backend() -> types.SimpleNamespace:
    """What a GDN backend on SGLang's CPU engine calls: the gates and extend kernel stand-ins."""
    from sgl_kernel.mamba import chunk_gated_delta_rule_cpu

    def gates(layer: Any, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.ops.sgl_kernel.fused_gdn_gating_cpu(layer.A_log, a, b, layer.dt_bias)

    def extend(q: Any, k: Any, v: Any, g: Any, beta: Any, *, ssm_states: Any, cache_indices: Any,
               query_start_loc: Any, **unused: Any) -> Any:
        return chunk_gated_delta_rule_cpu(q=q, k=k, v=v, g=g, beta=beta, initial_state=ssm_states,
                                          cu_seqlens=query_start_loc, head_first=False,
                                          use_qk_l2norm_in_kernel=True, initial_state_indices=cache_indices)

    return types.SimpleNamespace(_prefill_gates=gates, kernel_dispatcher=types.SimpleNamespace(extend=extend),
                                 requires_contiguous_prefill_state=True)  # as SGLang's GDN backend


class KDAAttnBackend:
    """What a KDA backend on the CPU runtime calls: the KDA chunk prefill stand-in (the record pool
    tells KDA layers by this class name, as it does SGLang's ``KDAAttnBackend``)."""

    def __init__(self) -> None:
        from sglang_replayssm.cpu.kda import chunk_kda

        def extend(q: Any, k: Any, v: Any, g: Any, beta: Any, *, ssm_states: Any, cache_indices: Any,
                   query_start_loc: Any, A_log: Any, dt_bias: Any, beta_is_raw: bool, **unused: Any) -> Any:
            return chunk_kda(q, k, v, g, beta, ssm_states=ssm_states, cache_indices=cache_indices,
                             query_start_loc=query_start_loc, A_log=A_log, dt_bias=dt_bias, beta_is_raw=beta_is_raw,
                             return_intermediate_states=False, track_state=None, track_chunk_idx=None)

        self.kernel_dispatcher = types.SimpleNamespace(extend=extend)


def toy_layer(model: Any, layer_id: int) -> types.SimpleNamespace:
    """The toy model's layer ``layer_id`` as SGLang's ``RadixLinearAttention`` fields: identity conv."""
    weights = torch.zeros(model.qkv_dim, model.win + 1)
    weights[:, -1] = 1.0
    return types.SimpleNamespace(
        layer_id=layer_id, conv_weights=weights, bias=None, activation=None,
        A_log=model.A_log[layer_id], dt_bias=model.dt_bias[layer_id].reshape(-1).contiguous(), lower_bound=None,
        q_dim=model.H * model.K, k_dim=model.H * model.K, v_dim=model.HV * model.V,
        num_q_heads=model.H, num_k_heads=model.H, num_v_heads=model.HV,
        head_q_dim=model.K, head_k_dim=model.K, head_v_dim=model.V,
    )


def attach(sim: Any) -> RecordPool:
    """Give the simulation's pool a record pool linked to its KV allocator, as a server builds it with its pools."""
    pool = RecordPool(kv_size=sim.allocator.size + 2, capacity=sim.cfg.record_tokens, device=torch.device("cpu"))
    if sim.cfg.state_interval > 0:
        pool.states = IntervalStates(kv_size=pool.kv_size, capacity=sim.cfg.record_tokens // sim.cfg.state_interval + 2,
                                     interval=sim.cfg.state_interval, device=pool.device, chunk=sim.cfg.chunk)
    attach_pool(sim.req_pool, pool)
    state_of(sim.allocator).record_pool = pool  # what record_capture.assign_batch links
    sim.record_layers = [toy_layer(sim.model, li) for li in range(sim.cfg.mamba_layers)]
    sim.record_backend = KDAAttnBackend() if sim.cfg.is_kda else cpu_engine_backend()
    return pool


def assign(sim: Any, locs: torch.Tensor) -> None:
    """Newly allocated KV ``locs`` get record slots (``prepare_for_extend/decode`` on a server)."""
    pool = pool_of(sim.req_pool)
    if pool is not None and locs.numel() > 0:
        pool.assign(locs)


def capture(sim: Any, locs: torch.Tensor, tokens: Sequence[int]) -> None:
    """The forward computing ``tokens`` at KV ``locs`` stores every layer's inputs (after the
    forward's rebuilds: :func:`run_pending` first, as ``ModelRunner.forward``)."""
    pool = pool_of(sim.req_pool)
    if pool is None or locs.numel() == 0:
        return
    ids = torch.tensor(list(tokens), dtype=torch.long)
    for li, layer in enumerate(sim.record_layers):
        x, a, b = sim.model.decode_inputs(li, ids)
        pool.write(layer, sim.record_backend, locs, x, a, b)


def kept_depths(sim: Any, prefix_len: int, n_new: int) -> list[int]:
    """Depths (from the root) of the prefill states a prefill of ``n_new`` tokens after
    ``prefix_len`` keeps (none without interval states)."""
    pool = pool_of(sim.req_pool)
    if pool is None or pool.states is None:
        return []
    tokens, _ = kept_positions([prefix_len], [n_new], pool.states.interval, pool.states.chunk)
    return [prefix_len + t + 1 for t in tokens]


def assign_states(sim: Any, locs: torch.Tensor, prefix_len: int) -> None:
    """State slots for the kept prefill states of the new tokens ``locs`` (``prepare_for_extend``)."""
    pool = pool_of(sim.req_pool)
    depths = kept_depths(sim, prefix_len, locs.numel())
    if pool is not None and pool.states is not None and depths:
        pool.states.assign(locs[torch.tensor([d - prefix_len - 1 for d in depths])])


def capture_states(sim: Any, locs: torch.Tensor, prefix_len: int, states: list[list[torch.Tensor]]) -> None:
    """The prefill's kept states (``states[i][layer]`` at ``kept_depths(...)[i]``), as the extend
    kernel's per-chunk states reach :meth:`IntervalStates.write`."""
    pool = pool_of(sim.req_pool)
    depths = kept_depths(sim, prefix_len, locs.numel())
    if pool is None or pool.states is None or not depths:
        return
    keys = locs[torch.tensor([d - prefix_len - 1 for d in depths])]
    for li in range(sim.cfg.mamba_layers):
        h = torch.stack([s[li] for s in states]).to(sim.temporal.dtype)
        pool.states.write(li, keys, h, torch.arange(len(depths)), sim.temporal.dtype)


def run_pending(sim: Any) -> int:
    """The queued rebuilds, with the CPU engine's conv (what ``gdn_backend.causal_conv1d_fn`` is there)."""
    from sgl_kernel.mamba import causal_conv1d_fn_cpu
    from sglang.srt.layers.attention.linear import gdn_backend

    pool = pool_of(sim.req_pool)
    from_state = 0 if pool is None else sum(job.state is not None for job in pool.pending)
    runner = types.SimpleNamespace(req_to_token_pool=sim.req_pool, is_draft_worker=False)
    with mock.patch.object(gdn_backend, "causal_conv1d_fn", causal_conv1d_fn_cpu):
        # The two BEFORE hooks of ModelRunner.forward in their order: HiCache's queued loads and the
        # rebuilds in queue order (radix/records/hicache/host_records.py), then any rebuild left.
        n = record_hicache.run_pending(runner) if config.enabled("record_hicache") else 0
        n += record_rebuild.run_pending(runner)
    sim.rebuilds = getattr(sim, "rebuilds", 0) + n
    sim.state_rebuilds = getattr(sim, "state_rebuilds", 0) + (from_state if n else 0)
    return n
