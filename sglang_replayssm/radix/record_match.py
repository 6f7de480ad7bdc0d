"""Prefix hits at any depth: a match whose KV reaches deeper than its deepest mamba state is
extended to the KV depth when records (:mod:`records`) cover every token in between.

Around ``MambaComponent.finalize_match_result_in_cache`` (the admission match, ``cow_mamba``), with
SGLang's tree-core API only, so the Python and the Rust tree cores behave alike:

* the span is ``collect_full_device_indices(last_visited, best_match)``: the KV of the tokens from
  the deepest state (``best_match_node``, depth ``device_prefix_len``; the root's zero state
  included) down to the node the walk ended on (depth ``full_kv_hit_length``; the walk split the
  node there);
* if records cover the whole span, that node gets a fresh mamba slot now (the tree owns it:
  SGLang's lock, LRU and eviction apply as to any state) and its rebuild is queued: the deepest
  state plus the span's records, folded at the start of the next forward (:mod:`record_rebuild`),
  before SGLang's deferred copy-on-write copies the planted state into the request's slot. The
  match then reports the KV depth, and later requests hit the planted state directly;
* otherwise (a record evicted, no free slot even after eviction, HiCache) SGLang's result stands.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from sglang_replayssm.radix.records import RecordPool, pool_of

__all__ = ["Rebuild", "plant_and_match", "rebuilt_tokens"]

_REQ_ATTR = "_replayssm_rebuilt_tokens"


@dataclass(frozen=True)
class Rebuild:
    """Fold ``slots`` (record slots, token order) into ``src``'s state (None: zero) as ``dst``."""

    dst: torch.Tensor  # logical mamba slot, shape [1]
    src: torch.Tensor | None  # logical mamba slot of the deepest state above, shape [1]
    slots: torch.Tensor  # [n] record slots


def _hicache(component: Any) -> bool:
    """HiCache keeps mamba states on the host too; records stay device-only, so they are not used."""
    return getattr(component, "_mamba_pool_host", None) is not None


def _alloc_slot(component: Any, node_id: Any) -> torch.Tensor | None:
    """One mamba slot for the planted state, evicting like SGLang's copy-on-write does."""
    from sglang.srt.mem_cache.base_prefix_cache import EvictParams

    cache = component.cache
    allocator = cache.req_to_token_pool.mamba_allocator
    slot = allocator.alloc(1)
    if slot is None:
        lock = cache.inc_lock_ref(node_id)
        cache.evict_for_alloc(EvictParams(num_tokens=0, mamba_num=1))
        slot = allocator.alloc(1)
        cache.dec_lock_ref(node_id, lock.to_dec_params())
    return slot


def plant_and_match(original: Callable[..., Any], component: Any, params: Any, result: Any) -> Any:
    """Extend an admission match to its KV depth through records, then run SGLang's finalizer."""
    pool: RecordPool | None = pool_of(component.cache.req_to_token_pool)
    target = getattr(result, "last_visited_node_id", None)
    depth, full = int(result.device_prefix_len), int(result.full_kv_hit_length or 0)
    if (
        pool is None
        or not params.cow_mamba
        or params.req is None
        or target is None
        or full <= depth
        or int(result.host_hit_length or 0)
        or _hicache(component)
    ):
        return original(component, params, result)
    tree, ct = component.tree_core, component.component_type
    anchor = result.best_match_node
    src = tree.get_component_device_value(anchor, ct) if depth > 0 else None
    if depth > 0 and src is None:
        return original(component, params, result)
    span = tree.collect_full_device_indices(target, anchor)
    if depth + span.numel() != full or not pool.covered(span):
        return original(component, params, result)
    slot = _alloc_slot(component, target)
    if slot is None:
        return original(component, params, result)
    tree.set_component_device_value(target, ct, slot.reshape(1).clone())
    pool.pending.append(Rebuild(dst=slot.reshape(1).clone(),
                                src=None if src is None else src.reshape(1).clone(),
                                slots=pool.slots(span).clone()))
    setattr(params.req, _REQ_ATTR, int(span.numel()))
    extended = result._replace(device_prefix_len=full, last_device_node=target, last_host_node=target,
                               best_match_node=target, mamba_branching_seqlen=None)
    return original(component, params, extended)


def rebuilt_tokens(req: Any) -> int:
    """Tokens of ``req``'s last admission match that were rebuilt from records (popped)."""
    return int(req.__dict__.pop(_REQ_ATTR, 0) or 0)
