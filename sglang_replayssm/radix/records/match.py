"""Prefix hits at any depth: a match whose KV reaches deeper than its deepest mamba state is
extended to the KV depth when records (:mod:`records`) cover every token in between.

Around ``MambaComponent.finalize_match_result_in_cache`` (the admission match, ``cow_mamba``), with
SGLang's tree-core API only, so the Python and the Rust tree cores behave alike:

* the span is ``collect_full_device_indices(last_visited, best_match)``: the KV of the tokens from
  the deepest state (``best_match_node``, depth ``device_prefix_len``; the root's zero state
  included) down to the node the walk ended on (depth ``full_kv_hit_length``; the walk split the
  node there);
* the rebuild starts from the deepest kept interval state in the span (:mod:`interval_states`)
  whose conv window's records exist, else from the deepest state itself;
* if records cover the span from that start, that node gets a fresh mamba slot now (the tree owns it:
  SGLang's lock, LRU and eviction apply as to any state) and its rebuild is queued: the deepest
  state plus the span's records, folded at the start of the next forward (:mod:`record_rebuild`),
  before SGLang's deferred copy-on-write copies the planted state into the request's slot. The
  match then reports the KV depth, and later requests hit the planted state directly;
* otherwise (a record evicted, no free slot even after eviction, HiCache without its records, a
  HiCache plant whose lock would take tokens this prefill round already promised: :mod:`plant_budget`)
  SGLang's result stands.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from sglang_replayssm.radix.records.pool import RecordPool, pool_of
from sglang_replayssm.state import state_of, take

__all__ = ["Rebuild", "plant_and_match", "rebuild_of", "rebuilt_tokens", "refresh"]



@dataclass(frozen=True)
class Rebuild:
    """Fold ``slots[lead:]`` (record slots, token order) into a start state as ``dst``.

    The start is the interval state ``state`` when given (then ``slots[:lead]`` are the records of
    the ``lead`` tokens before it, which only make the conv window), else ``src``'s tree state
    (None: the zero state; ``lead`` is 0 and the conv window is ``src``'s)."""

    dst: torch.Tensor  # logical mamba slot, shape [1]
    src: torch.Tensor | None  # logical mamba slot of the deepest state above, shape [1]
    slots: torch.Tensor  # [lead + n] record slots
    state: int | None = None  # interval state slot (radix/records/interval_states.py)
    lead: int = 0


def _hicache(component: Any) -> bool:
    """HiCache keeps mamba states on the host too: records are used only with their host backup
    (:mod:`record_hicache`, the ``record_hicache`` fix), which also guards planted states."""
    from sglang_replayssm.radix import config

    return getattr(component, "_mamba_pool_host", None) is not None and not config.enabled("record_hicache")


def _device_target(tree: Any, target: Any, anchor: Any) -> Any:
    """The deepest node from ``target`` up to ``anchor`` whose KV is on device (HiCache evicts a
    node's device KV leaves first, so every node above it is on device too): a match's walk
    (``last_visited_node_id``) may end in host-only nodes that SGLang does not load back (no state
    past them: ``host_hit_length`` 0), and a planted state's records must be device-resident.
    Read from ``collect_path_info`` (the tree cores' path API; ``get_parent_node_id`` is only on
    SGLang's test-kit inspectors)."""
    (path,) = tree.collect_path_info([target])
    ids = [info.node_id for info in path]
    node, below = anchor, anchor not in ids  # the root anchor is not on the path
    for info in path:
        if below:
            if info.full_value_len is None:
                break
            node = info.node_id
        below = below or info.node_id == anchor
    return node


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


def _interval_start(pool: RecordPool, span: torch.Tensor) -> tuple[int, int] | None:
    """``(first, state slot)`` for a rebuild of ``span`` from its deepest interval state whose conv window's
    records and every later record exist: the job reads the records of ``span[first:]`` (the conv lead
    included); None if there is none."""
    states, lead = pool.states, pool.conv_lead
    if states is None or not pool.layers or not states.usable(list(pool.layers)):
        return None
    found = states.deepest(span)
    if found is None or found[0] + 1 < lead:
        return None
    j, state = found
    first = j + 1 - lead
    if not pool.covered(span[first:]):
        return None
    return first, state


def _from_interval_state(pool: RecordPool, span: torch.Tensor) -> tuple[int, int, torch.Tensor] | None:
    """``(state slot, lead, record slots)`` for a rebuild from the deepest interval state of
    ``span`` whose conv window's records and every later record exist; None if there is none."""
    found = _interval_start(pool, span)
    return None if found is None else _interval_job_start(pool, span, found)


def _interval_job_start(pool: RecordPool, span: torch.Tensor, found: tuple[int, int]) -> tuple[int, int, torch.Tensor]:
    """``(state slot, lead, record slots)`` of the rebuild :func:`_interval_start` found (``found``); the
    record slots are read now, so after any refresh that moved them."""
    first, state = found
    return state, pool.conv_lead, pool.slots(span[first:]).clone()


def refresh(pool: RecordPool, kv: torch.Tensor) -> bool:
    """Move the records of the tokens of ``kv`` that have one to the young end of the first-in-first-out
    pool (fix ``record_refresh``): new slots through :meth:`RecordPool.assign` (the oldest records go, as
    for any new token), every layer's rows copied there. A path that keeps being hit keeps its records; one
    that is not ages out. Returns whether it moved them.

    Skipped (False) where the slots it would take hold a queued rebuild's records (they are read at the
    next forward), with HiCache (queued record loads), or for more than half the pool. Exact: the rows
    are copied, not recomputed, one tensor at a time (:func:`_moved_tensors`: the layer stacks in groups
    of layers whose moved rows take at most :data:`REFRESH_TRANSIENT_BYTES`, else layer by layer)."""
    from sglang_replayssm.radix import config

    if not config.enabled("record_refresh") or pool.hicache is not None or not pool.layers:
        return False
    kv = kv.reshape(-1).to(pool.slot_of.device, torch.int64)
    old = pool.slots(kv)
    keep = old >= 0
    kv, old = kv[keep], old[keep]
    n = int(kv.numel())
    if n == 0 or 2 * n > pool.capacity:
        return False
    taken = (pool.head + torch.arange(n, device=pool.device)) % pool.capacity
    busy = [job.slots for job in pool.pending if isinstance(job, Rebuild)]
    if busy and bool(torch.isin(taken, torch.cat(busy).to(taken.device)).any()):
        return False
    pool.assign(kv)  # bookkeeping only: every row stays where it is until copied below
    new = pool.slots(kv)
    for rows in _moved_tensors(pool, n):  # the gather copies one tensor's rows before the write
        rows.index_copy_(-2, new, rows.index_select(-2, old))
    return True


#: The most bytes of rows one gather of :func:`refresh` copies out at once (its transient).
REFRESH_TRANSIENT_BYTES = 64 << 20


def _moved_tensors(pool: RecordPool, n: int) -> list[torch.Tensor]:
    """The record tensors :func:`refresh` moves ``n`` tokens' rows in, rows on dim -2: where every layer's
    records are rows of the stacks (:meth:`RecordPool.stacked_ab`), the stacks ``[L, R + 1, *]`` cut into
    groups of layers whose ``n`` rows take at most :data:`REFRESH_TRANSIENT_BYTES` (one group for a short
    fold: four launches for every layer; ``a``, ``b`` together where they are :attr:`RecordPool.gate_stack`'s
    halves), else every layer's ``x``, ``a``, ``b``."""
    ab, xs = pool.stacked_ab(), pool.xs
    if ab is None or xs is None:
        return [rows for rec in pool.layers.values() for rows in (rec.x, rec.a, rec.b)]
    out: list[torch.Tensor] = []
    for stack in (xs, pool.gate_stack) if pool.gate_stack is not None else (xs, *ab):
        lead = stack.dim() - 3  # the layer dim: 1 in ``gate_stack`` [2, L, R + 1, HV], else 0
        per_layer = n * stack.numel() // (stack.shape[lead] * stack.shape[-2]) * stack.element_size()
        group = max(1, REFRESH_TRANSIENT_BYTES // max(per_layer, 1))
        out += [stack.narrow(lead, i, min(group, stack.shape[lead] - i)) for i in range(0, stack.shape[lead], group)]
    return out


def rebuild_job(pool: RecordPool, slot: torch.Tensor, span: torch.Tensor,
                start: tuple[int, int, torch.Tensor] | None, src: torch.Tensor | None) -> Rebuild:
    """The rebuild of ``slot`` over ``span``: from the interval state ``start`` (:func:`_from_interval_state`)
    when given, else from the tree state ``src`` (None: the zero state)."""
    if start is not None:
        state, lead, slots = start
        return Rebuild(dst=slot.reshape(1).clone(), src=None, slots=slots, state=state, lead=lead)
    return Rebuild(dst=slot.reshape(1).clone(), src=None if src is None else src.reshape(1).clone(),
                   slots=pool.slots(span).clone())


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
    if getattr(component, "_mamba_pool_host", None) is not None:
        target = _device_target(tree, target, anchor)  # HiCache: the walk may go on into host-only nodes
    span = tree.collect_full_device_indices(target, anchor)
    if target != result.last_visited_node_id:
        full = depth + span.numel()  # planted above the host-only nodes
    if span.numel() == 0 or depth + span.numel() != full:
        return original(component, params, result)
    from sglang_replayssm.radix.records.hicache.plant_budget import hicache_cache, overcommits

    if hicache_cache(component) and overcommits(component.cache, params.req, target):
        return original(component, params, result)  # HiCache locks the plant till its rebuild: over budget
    found = _interval_start(pool, span)
    covered = found is None and pool.covered(span)  # a refresh moves records, it never drops one
    if found is not None or covered:
        # only what the job folds moves (from an interval state: its tail): the rest of the span is not
        # read, and moving it would push other paths' tails out of the pool; the job's slots are read after
        refresh(pool, span if found is None else span[found[0]:])
    start = None if found is None else _interval_job_start(pool, span, found)
    src = None
    if start is None:
        src = tree.get_component_device_value(anchor, ct) if depth > 0 else None
        if (depth > 0 and src is None) or not covered:
            return original(component, params, result)
    slot = _alloc_slot(component, target)
    if slot is None:
        return original(component, params, result)
    tree.set_component_device_value(target, ct, slot.reshape(1).clone())
    job = rebuild_job(pool, slot, span, start, src)
    pool.pending.append(job)
    state_of(params.req).rebuilt_tokens = (int(span.numel()), int(job.slots.numel()) - job.lead)
    extended = result._replace(device_prefix_len=full, last_device_node=target, last_host_node=target,
                               best_match_node=target, mamba_branching_seqlen=None)
    return original(component, params, extended)


def rebuild_of(req: Any) -> tuple[int, int]:
    """``(hit tokens, records folded)`` of ``req``'s last admission match's rebuild, (0, 0) without
    one (popped: counted once)."""
    found = take(req, "rebuilt_tokens")
    return (0, 0) if found is None else (int(found[0]), int(found[1]))


def rebuilt_tokens(req: Any) -> int:
    """Tokens of ``req``'s last admission match that were rebuilt from records (popped)."""
    return rebuild_of(req)[0]
