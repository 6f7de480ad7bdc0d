"""Host hits through records: a match whose KV runs on into host-only nodes past its deepest state
reaches the KV depth (HiCache, GDN and KDA, switch ``record_host_hits``).

HiCache evicts a node's device KV (leaves first) after backing it up to host; the node stays in the
tree with its host KV (``host_value``) and, where it had one, its host mamba state. A later match
walks on into such host-only nodes (``last_visited_node_id``), but SGLang 0.5.23 loads back only as
far as the deepest node with a mamba state (``best_match_node``, ``host_hit_length``): a host node
without a state is not a hit, and :mod:`record_match` plants at the deepest *device* node only.

With the tokens' records on host (:mod:`record_hicache`, keyed by host KV index) the deeper hit is
exact. Two steps, both on SGLang's tree-core API:

* **Match** (AROUND ``MambaComponent.finalize_match_result_in_cache``, outside the plant): when the
  deepest state is on device (node ``A``, depth ``s``, ``host_hit_length == 0``), the walk ended on a
  host-only node ``T`` (depth ``n``) and every token in ``(s, n]`` has a record (device records for
  the device part ``A..D``, ready and valid host records for the host-only part ``D..T``), SGLang's
  finalizer runs on the match as it is (copy-on-write from ``A``: the fallback) and the match is
  reported as a host hit to ``T``: ``best_match_node = T``, ``host_hit_length = n - s`` (what
  ``init_load_back`` reports loaded: the path from ``A``, its device part included). The scheduler then loads ``T``'s path back (``init_load_back``), as for any host hit.
* **Load-back** (AROUND ``UnifiedRadixCache.init_load_back``): once SGLang has loaded the KV (the
  host records came back under the new device KV indices, :func:`record_hicache.loaded_back`),
  ``T`` gets a fresh mamba slot, its rebuild from ``A``'s state over the span's records is queued
  (after the loads, :func:`record_hicache.run_pending`), ``T`` and ``A`` stay locked until it is
  issued, and the request's copy-on-write source becomes ``T``'s slot. If anything is missing at
  that point (a record, a slot, ``A``'s state) the load is reported as not done (``(0, last
  device node)``, SGLang's "nothing loaded" result): the request recomputes from ``A``, whose state
  its slot already copies; the loaded KV stays in the tree. Never a hit without its exact state.

Not covered (SGLang's result stands): a deepest state that is itself on host (``host_hit_length >
0``: SGLang loads that state into the request's slot, a rebuild would have to start from it), and
interval states (device-only: the rebuild folds from ``A``'s state or a device interval state).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from sglang_replayssm.radix.records.pool import RecordPool, pool_of
from sglang_replayssm.state import state_of, take

__all__ = ["host_records_cover", "load_back_hook", "match_hook"]



def _enabled() -> bool:
    from sglang_replayssm.radix import config

    return config.enabled("record_hits") and config.enabled("record_hicache")


def host_records_cover(pool: RecordPool, host_kv: torch.Tensor) -> bool:
    """Whether every host KV index of ``host_kv`` has a host record that :func:`record_hicache.
    loaded_back` would restore now (its copy completed, the device token had a record), and all of
    them fit in the device pool."""
    host = None if pool.hicache is None else pool.hicache.host
    if host is None or set(host.layers) != set(pool.layers) or host_kv.numel() > pool.capacity:
        return False
    if host_kv.numel() == 0:
        return True
    host.poll()
    rows = host.slot_of[host_kv.reshape(-1).to("cpu", torch.int64)]
    safe = rows.clamp(min=0)
    return bool(((rows >= 0) & (host.seq[safe] <= host.done) & host.valid[safe]).all())


def _plan(component: Any, params: Any, result: Any) -> tuple[Any, Any, int, int, int] | None:
    """``(T, A, s, n, host tokens)`` when the match can be a host hit through records, else None."""
    pool: RecordPool | None = pool_of(component.cache.req_to_token_pool)
    target = getattr(result, "last_visited_node_id", None)
    depth, full = int(result.device_prefix_len), int(result.full_kv_hit_length or 0)
    if (pool is None or not params.cow_mamba or params.req is None or target is None or full <= depth
            or int(result.host_hit_length or 0) or getattr(component, "_mamba_pool_host", None) is None):
        return None
    from sglang.srt.mem_cache.unified_cache.components.base import CacheTransferPhase, ComponentType

    from sglang_replayssm.radix.records.match import _device_target

    tree, anchor = component.tree_core, result.best_match_node
    device_end = _device_target(tree, target, anchor)
    if device_end == target:
        return None  # the walk ended on device: record_match's plant
    if depth > 0 and tree.get_component_device_value(anchor, component.component_type) is None:
        return None
    device_span = tree.collect_full_device_indices(device_end, anchor)
    (kv,) = tree.build_hicache_transfers(ComponentType.FULL, target, CacheTransferPhase.LOAD_BACK)
    host_kv = kv.host_indices
    if depth + device_span.numel() + host_kv.numel() != full or full - depth > pool.capacity:
        return None
    if not pool.covered(device_span) or not host_records_cover(pool, host_kv):
        return None
    return target, anchor, depth, full, int(host_kv.numel())


def match_hook(original: Callable[..., Any], component: Any, params: Any, result: Any) -> Any:
    """AROUND the admission match (outermost): a host hit to the KV depth when records cover it."""
    plan = _plan(component, params, result) if _enabled() else None
    if params.req is not None and params.cow_mamba:
        # A new admission match forgets an earlier one's plan; other matches of the request (the
        # storage prefetch's, cow_mamba False) leave it: the request's fields may still be this one's.
        take(params.req, "host_hit")
    if plan is None:
        return original(component, params, result)
    target, anchor, depth, full, _ = plan
    # SGLang's finalizer on the match as it stands (copy-on-write from the deepest state: what the
    # request recomputes from if the load-back cannot plant); record_match sees no span to plant.
    out = original(component, params, result._replace(full_kv_hit_length=depth))
    state_of(params.req).host_hit = (target, anchor, depth, full)  # on the Req: its host-records hit
    # host_hit_length counts the span from the deepest state (its device part included): what
    # init_load_back reports as loaded, so the admission takes its "all promised tokens" path.
    return out._replace(full_kv_hit_length=full, best_match_node=target, last_host_node=target,
                        host_hit_length=full - depth, mamba_branching_seqlen=None)


def load_back_hook(original: Callable[..., Any], cache: Any, params: Any) -> Any:
    """AROUND ``UnifiedRadixCache.init_load_back``: SGLang's load-back, then the planted state."""
    req = getattr(params, "req", None)
    plan = None if req is None else take(req, "host_hit")
    out = original(cache, params)
    if req is None or plan is None or out is None or not _enabled():
        return out
    loaded, node = out
    target, anchor, depth, full = plan
    if params.best_match_node != target:
        return out  # the request's match is no longer this plan's: SGLang's load stands
    if loaded and node == target and depth + int(loaded) == full and _plant(cache, req, target, anchor, depth, full):
        return out
    # Loaded to where no state is (or not as planned): recompute from the deepest state, whose copy
    # the request's slot already has; the loaded KV stays in the tree.
    return (0, req.last_node) if loaded else out


def _plant(cache: Any, req: Any, target: Any, anchor: Any, depth: int, full: int) -> bool:
    """Plant ``target``'s state (rebuilt from ``anchor``'s over the span's records, queued) and make
    it the request's copy-on-write source; False if the span lost a record or no slot is free."""
    from sglang.srt.mem_cache.unified_cache.components.base import ComponentType

    from sglang_replayssm.radix.records.hicache import host_records as record_hicache
    from sglang_replayssm.radix.records.hicache.plant_budget import overcommits
    from sglang_replayssm.radix.records.match import _alloc_slot, _from_interval_state, rebuild_job

    component = cache.components[ComponentType.MAMBA]
    pool: RecordPool | None = pool_of(cache.req_to_token_pool)
    tree, ct = component.tree_core, component.component_type
    if pool is None:
        return False
    span = tree.collect_full_device_indices(target, anchor)
    if depth + span.numel() != full:
        return False
    start = _from_interval_state(pool, span)
    src = tree.get_component_device_value(anchor, ct) if depth > 0 else None
    if start is None and ((depth > 0 and src is None) or not pool.covered(span)):
        return False
    if overcommits(cache, req, target):  # its lock would take tokens the round's adder promised
        return False
    slot = _alloc_slot(component, target)
    if slot is None:
        return False
    tree.set_component_device_value(target, ct, slot.reshape(1).clone())
    job = rebuild_job(pool, slot, span, start, src)
    pool.pending.append(job)
    record_hicache.lock_rebuild(pool, cache, tree, job, target, anchor)
    req.kv.mamba_cow_src_index = tree.get_component_device_value(target, ct)
    req.kv.mamba_needs_clear = False
    state_of(req).rebuilt_tokens = (int(span.numel()), int(job.slots.numel()) - job.lead)
    return True
