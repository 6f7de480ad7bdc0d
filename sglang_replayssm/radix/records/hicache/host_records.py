"""HiCache for records: a node's records go to host with its KV and come back with it (GDN, KDA).

Records (:mod:`records`) are keyed by device KV index. HiCache (``--enable-hierarchical-cache``)
backs a node's KV up to host and may then free the device copy; the freed KV indices are reused and
their records dropped (the allocator choke point). This module keeps a copy keyed by *host* KV index:

* **Backup** (AROUND ``HybridCacheController.write``, every device->host KV write: node backups
  write-through or write-back, PD decode offload): the records of the written device KV go to a host
  record pool (:class:`host_pool.HostRecords`) under the host KV indices SGLang returns. The copy is
  asynchronous on CUDA: one side stream, fenced behind the forward stream (SGLang's
  ``write_fence_stream``) and the scheduler's stream, gathers the rows into contiguous host runs; the
  next forward waits on its event (a device-side wait, no host sync). Each host row carries a ``valid`` flag (the device token
  had a record, and no queued load still has to write its row) written by the same copy.
* **Load-back** (AROUND ``HybridCacheController.load``, every host->device KV load): host rows whose
  copy has completed (event polled, never waited on) and are valid are staged, the new device KV
  indices get device record slots at once (so a match in the same round sees them), and the
  device-side write is queued. At the start of the next forward (BEFORE ``ModelRunner.forward``,
  :func:`run_pending`) the queued writes and the rebuilds the matches queued run in the order they
  were queued: a rebuild queued before a load reads the rows as they were, one queued after reads
  the loaded rows; the forward's own record writes come after both.
* **Host KV reuse** (AFTER ``HostKVCache.alloc``): every host KV index SGLang hands out starts
  without a host record, as on the device; so L3 prefetches and retraction backups never inherit.
* **Planted states** (:mod:`record_match`): a match that plants a state queues its rebuild for the
  next forward. With HiCache on, until that rebuild has been issued (i) the planted node and the
  node its rebuild copies from are locked (``inc_lock_ref``: neither slot can be evicted, freed and
  reused, e.g. as the destination of a host->device mamba load racing the rebuild), and (ii) a
  device->host backup of the planted node leaves its mamba state out (AROUND the tree cores'
  ``build_backup_spec``: the slot does not hold the state yet); the node's KV is still backed up and
  a later backup (write-back eviction) carries the rebuilt state.

Exactness: a host row is used only if its own copy completed and the host KV index was not handed
out again; records missing on either side leave SGLang's result. Interval states stay device-only.
Host hits past the deepest state: :mod:`host_hits`; L3 storage (records beside the pages): :mod:`storage`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from sglang_replayssm.radix.records.hicache.host_pool import (
    HOST_CAPACITY_ENV,
    HostRecords,
    host_capacity_from_env,
    host_runs,
)
from sglang_replayssm.radix.records.hicache.plant_budget import hicache_cache
from sglang_replayssm.radix.records.pool import RecordPool, pool_of
from sglang_replayssm.state import peek, state_of

__all__ = [
    "HOST_CAPACITY_ENV", "HiCacheRecords", "HostRecords", "backed_up", "build_backup_spec", "forward_hook",
    "host_alloc_hook", "host_allocated", "host_capacity_from_env", "loaded_back", "lock_planted", "lock_rebuild",
    "load_hook", "run_pending", "write_hook",
]  # fmt: skip

logger = logging.getLogger(__name__)

@dataclass
class _Load:
    """A queued device-side write of loaded records: ``rows`` (per layer, staged on host) into the
    device record slots ``dst``, after the rebuild ``after`` (None: before every queued rebuild)."""

    after: Any
    dst: torch.Tensor
    rows: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]


@dataclass
class HiCacheRecords:
    """What HiCache adds to one record pool: the host copy, the queued loads, the planted locks."""

    host: HostRecords | None = None
    off: bool = False  # host records refused (no host pool of the supported kind, capacity 0)
    loads: list[_Load] = field(default_factory=list)
    locks: list[tuple[Any, Any, Any, list[tuple[Any, Any]]]] = field(default_factory=list)
    stream: Any = None  # CUDA side stream of the record copies
    last_event: Any = None  # the last copy on it: the next forward waits on it


def _state(pool: RecordPool) -> HiCacheRecords:
    if pool.hicache is None:
        pool.hicache = HiCacheRecords()
    state: HiCacheRecords = pool.hicache
    return state


def _anchor_host_pool(controller: Any) -> Any:
    group = controller.mem_pool_host
    anchor = getattr(group, "anchor_entry", None)
    return group if anchor is None else anchor.host_pool


def _host(pool: RecordPool, controller: Any) -> HostRecords | None:
    """The host record pool of ``pool`` (created at the first backup), or None (off)."""
    from sglang.srt.mem_cache.pool_host.base import HostKVCache

    state = _state(pool)
    if state.host is not None or state.off:
        return state.host
    host_kv = _anchor_host_pool(controller)
    size = int(getattr(host_kv, "logical_size", getattr(host_kv, "size", 0)))
    # Only host pools whose allocations reach the invalidation hook (HostKVCache.alloc) can be keyed.
    supported = isinstance(host_kv, HostKVCache) and type(host_kv).alloc is HostKVCache.alloc
    if not supported:
        state.off = True
        logger.info("sglang-replayssm records: host KV pool %s allocates on its own: records are not backed "
                    "up to host (HiCache hits keep SGLang's result)", type(host_kv).__name__)
        return None
    if not pool.layers:
        return None  # no forward has written records yet
    capacity = host_capacity_from_env(pool.capacity, size)
    if capacity <= 0:
        state.off = True
        return None
    pin = torch.cuda.is_available()
    state.host = HostRecords(kv_size=size + 1, capacity=capacity, pin=pin)
    for layer_id, rec in pool.layers.items():  # every layer now: a row is complete or absent
        state.host.layer(layer_id, (rec.x, rec.a, rec.b))
    state_of(host_kv).host_records = state.host  # the HostRecords its allocations invalidate
    per_token = sum(t.shape[1] * t.element_size() for rec in pool.layers.values() for t in (rec.x, rec.a, rec.b))
    logger.info("sglang-replayssm records: HiCache backs records up to host, %d tokens (%.1f MB%s; %s=N to "
                "change, 0 = off)", capacity, capacity * per_token / 2**20, ", pinned" if pin else "",
                HOST_CAPACITY_ENV)
    return state.host


def _transfer(state: HiCacheRecords, fence: Any, body: Callable[[], None], reads: tuple[torch.Tensor, ...]) -> Any:
    """Run ``body`` (device reads / copies) on the records' side stream on CUDA, after the current
    stream and ``fence`` (the forward stream); returns its event (None off CUDA: ran in place).
    ``reads``: tensors made on the current stream that ``body`` reads; their memory is not handed out
    again before the side stream has run (``record_stream``), however late the fence lets it start."""
    if not torch.cuda.is_available():
        body()
        return None
    if state.stream is None:
        state.stream = torch.cuda.Stream()
    stream = state.stream
    stream.wait_stream(torch.cuda.current_stream())
    if fence is not None:
        stream.wait_stream(fence)
    for t in reads:
        t.record_stream(stream)
    with torch.cuda.stream(stream):
        body()
        event = torch.cuda.Event()
        event.record(stream)
    state.last_event = event
    return event


# ---- hook bodies (hicache/hooks.py) -----------------------------------------------------------------


def write_hook(original: Callable[..., Any], controller: Any, device_indices: Any, *args: Any, **kwargs: Any) -> Any:
    """AROUND ``HybridCacheController.write``: SGLang's write, then :func:`backed_up`."""
    host_indices = original(controller, device_indices, *args, **kwargs)
    if host_indices is not None:
        backed_up(controller, device_indices, host_indices)
    return host_indices


def load_hook(original: Callable[..., Any], controller: Any, host_indices: Any, *args: Any, **kwargs: Any) -> Any:
    """AROUND ``HybridCacheController.load``: SGLang's load, then :func:`loaded_back`."""
    device_indices = original(controller, host_indices, *args, **kwargs)
    if device_indices is not None:
        loaded_back(controller, host_indices, device_indices)
    return device_indices


def host_alloc_hook(result: Any, host_pool: Any, *args: Any, **kwargs: Any) -> None:
    """AFTER ``HostKVCache.alloc``: :func:`host_allocated`."""
    host_allocated(host_pool, result)


def forward_hook(runner: Any, *args: Any, **kwargs: Any) -> None:
    """BEFORE ``ModelRunner.forward`` (outside the rebuild hook): :func:`run_pending` while
    ``record_hicache`` and ``record_hits`` are on."""
    from sglang_replayssm.radix import config

    if config.enabled("record_hicache") and config.enabled("record_hits"):
        run_pending(runner)


# ---- backup: device -> host ----------------------------------------------------------------------


def _linked_pool(controller: Any) -> RecordPool | None:
    """The record pool linked on the controller's device KV allocator (by records/capture.py)."""
    linked = peek(controller.mem_pool_device_allocator)
    return None if linked is None else linked.record_pool


def backed_up(controller: Any, device_indices: Any, host_indices: Any) -> None:
    """After ``HybridCacheController.write``: copy the records of ``device_indices`` to host under
    ``host_indices`` (the KV SGLang is copying there)."""
    pool = _linked_pool(controller)
    if pool is None or not isinstance(host_indices, torch.Tensor) or host_indices.numel() == 0:
        return
    host = _host(pool, controller)
    if host is None or set(host.layers) != set(pool.layers):
        return
    state = _state(pool)
    dev_kv = device_indices.reshape(-1).to(pool.slot_of.device, torch.int64)[-host.capacity:]
    host_kv = host_indices.reshape(-1).to("cpu", torch.int64)[-host.capacity:]
    n = host_kv.numel()
    slots = pool.slot_of[dev_kv]
    ok = slots >= 0
    if state.loads:  # rows a queued load has not written yet: not backed up (device-side mask, no sync)
        loading = torch.zeros(pool.capacity + 1, dtype=torch.bool, device=slots.device)
        for load in state.loads:
            loading[load.dst] = True
        ok &= ~loading[slots.clamp(min=0)]
    src = torch.where(ok, slots, pool.capacity)
    start = host.assign(host_kv)
    seq = host.next_seq
    host.next_seq += 1
    host.backed_up += n
    runs = host_runs(start, n, host.capacity)
    rows = host.layers

    def copy() -> None:
        blocking = not host.pin
        for layer_id, rec in pool.layers.items():
            for dst, t in zip(rows[layer_id], (rec.x, rec.a, rec.b)):
                got = t.index_select(0, src)
                for off, lo, hi in runs:
                    dst[lo:hi].copy_(got[off:off + hi - lo], non_blocking=not blocking)
        for off, lo, hi in runs:
            host.valid[lo:hi].copy_(ok[off:off + hi - lo], non_blocking=not blocking)

    event = _transfer(state, getattr(controller, "write_fence_stream", None), copy, reads=(src, ok))
    host.events.append((seq, event))


# ---- load-back: host -> device -------------------------------------------------------------------


def loaded_back(controller: Any, host_indices: Any, device_indices: Any) -> None:
    """After ``HybridCacheController.load``: the new device KV indices get the host records of
    ``host_indices`` (slots now; the rows at the next forward, :func:`run_pending`)."""
    pool = _linked_pool(controller)
    if pool is None or pool.hicache is None or pool.hicache.host is None:
        return
    if not isinstance(device_indices, torch.Tensor) or host_indices.numel() == 0:
        return
    state, host = pool.hicache, pool.hicache.host
    if set(pool.layers) != set(host.layers):
        return
    host.poll()
    h = host_indices.reshape(-1).to("cpu", torch.int64)
    rows = host.slot_of[h]
    safe = rows.clamp(min=0)
    ready = (rows >= 0) & (host.seq[safe] <= host.done) & host.valid[safe]
    keep = ready.nonzero().flatten()[-pool.capacity:]
    host.missed += h.numel() - keep.numel()
    if keep.numel() == 0:
        return
    src = rows[keep]
    kv = device_indices.reshape(-1).to(pool.slot_of.device, torch.int64)[keep.to(pool.slot_of.device)]
    pool.assign(kv)
    dst = pool.slot_of[kv]
    dst = torch.where(dst >= 0, dst, pool.capacity)
    staged: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}
    for layer_id, host_rows in host.layers.items():
        out = []
        for t in host_rows:
            buf = torch.empty((src.numel(), t.shape[1]), dtype=t.dtype, pin_memory=host.pin)
            torch.index_select(t, 0, src, out=buf)
            out.append(buf)
        staged[layer_id] = (out[0], out[1], out[2])
    state.loads.append(_Load(after=pool.pending[-1] if pool.pending else None, dst=dst, rows=staged))
    host.restored += keep.numel()


def _apply(pool: RecordPool, load: _Load) -> None:
    for layer_id, rec in pool.layers.items():
        rows = load.rows.get(layer_id)
        if rows is None:
            continue
        for t, src in zip((rec.x, rec.a, rec.b), rows):
            t.index_copy_(0, load.dst, src.to(t.device, non_blocking=True))


def host_allocated(host_pool: Any, indices: Any) -> None:
    """After a host KV allocation: the handed-out host indices carry no host record."""
    linked = peek(host_pool)
    host: HostRecords | None = None if linked is None else linked.host_records
    if host is not None and isinstance(indices, torch.Tensor):
        host.invalidate(indices)


# ---- planted states and the forward ---------------------------------------------------------------


def lock_planted(original: Callable[..., Any], component: Any, params: Any, result: Any) -> Any:
    """Around the admission match (outside the plant): lock what a queued rebuild reads and writes
    until it is issued, and mark the planted node's state as not built yet."""
    pool = pool_of(component.cache.req_to_token_pool)
    before = len(pool.pending) if pool is not None else 0
    out = original(component, params, result)
    if pool is None or len(pool.pending) <= before or not hicache_cache(component):
        return out
    target = out.best_match_node  # the planted node (record_match reports it as the best match)
    for job in pool.pending[before:]:
        lock_rebuild(pool, component.cache, component.tree_core, job, target, result.best_match_node)
    return out


def lock_rebuild(pool: RecordPool, cache: Any, core: Any, job: Any, target: Any, source: Any) -> None:
    """Until ``job`` (a queued rebuild into ``target``'s planted state) is issued: lock ``target``
    and, when the rebuild copies a tree state, its node ``source``; back ``target`` up without its
    mamba state (:func:`build_backup_spec`)."""
    core_state = state_of(core)  # node ids whose planted state is unbuilt
    planted = core_state.planted_nodes
    if planted is None:
        planted = core_state.planted_nodes = {}
    nodes = [target] if job.src is None else [target, source]
    locks = [(node, cache.inc_lock_ref(node).to_dec_params()) for node in nodes]
    planted[target] = planted.get(target, 0) + 1
    _state(pool).locks.append((job, cache, core, locks))


def build_backup_spec(original: Callable[..., Any], core: Any, node_id: Any) -> Any:
    """A node whose planted state is not rebuilt yet is backed up without its mamba state."""
    device_value, comp_xfers = original(core, node_id)
    core_state = peek(core)
    planted = None if core_state is None else core_state.planted_nodes
    if planted and node_id in planted and comp_xfers:
        from sglang.srt.mem_cache.unified_cache.components.base import ComponentType

        comp_xfers.pop(ComponentType.MAMBA, None)
    return device_value, comp_xfers


def run_pending(runner: Any) -> int:
    """Before ``ModelRunner.forward``: wait (on the device) for the record copies in flight, run the
    queued loads and rebuilds in their queue order, then release the planted locks; returns the
    rebuilds run."""
    from sglang_replayssm.radix.records import rebuild as record_rebuild

    if getattr(runner, "is_draft_worker", False):
        return 0
    req_pool = getattr(runner, "req_to_token_pool", None)
    pool = pool_of(req_pool)
    state = None if pool is None else pool.hicache
    if pool is None or state is None or not (state.loads or state.locks or state.last_event is not None):
        return 0
    if state.last_event is not None:
        torch.cuda.current_stream().wait_event(state.last_event)
        state.last_event = None
    ran = 0
    loads, state.loads = state.loads, []
    for load in loads:
        cut = next((i + 1 for i, job in enumerate(pool.pending) if job is load.after), 0)
        if cut:
            jobs, pool.pending = pool.pending[:cut], pool.pending[cut:]
            record_rebuild.rebuild(pool, req_pool, jobs)
            ran += len(jobs)
        _apply(pool, load)
    ran += record_rebuild.run_pending(runner)
    _release(pool, state)
    return ran


def _release(pool: RecordPool, state: HiCacheRecords) -> None:
    """Unlock the planted nodes whose rebuilds were issued."""
    pending = {id(job) for job in pool.pending}
    kept = []
    for entry in state.locks:
        job, cache, core, locks = entry
        if id(job) in pending:
            kept.append(entry)
            continue
        for node, params in locks:
            cache.dec_lock_ref(node, params)
        core_state = peek(core)
        planted = {} if core_state is None or core_state.planted_nodes is None else core_state.planted_nodes
        target = locks[0][0]
        if planted.get(target, 0) <= 1:
            planted.pop(target, None)
        else:
            planted[target] -= 1
    state.locks = kept
