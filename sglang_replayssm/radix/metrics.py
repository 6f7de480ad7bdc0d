"""The "mamba-lost hit": prompt tokens whose KV prefix hit was discarded for lack of a mamba state.

A hybrid model can resume a prefix only from a depth that has a mamba state, so the scheduler keeps
``device_prefix_len`` (the deepest node with a state) of a longer Full-KV hit
``full_kv_hit_length``; the difference is recomputed. Per request (on the admission match, the one
with a request attached) the adapter records ``full_kv_hit_length - device_prefix_len -
host_hit_length`` (host hits are loaded, not lost). When the request enters a prefill batch the
recorded value is moved into that batch's ``PrefillStats``; ``report_prefill_stats`` then

* appends ``#mamba-lost-hit-token: N`` right after ``#cached-token: M`` in SGLang's
  "Prefill batch" log line (a logging filter on the metrics reporter's logger), and
* with ``--enable-metrics`` increments the Prometheus counter
  ``sglang:replayssm_mamba_lost_hit_tokens_total`` with the collector's labels.

Beside it, the admitted hits that were rebuilt from records (the records room, :func:`use_records`): their tokens
``#mamba-rebuilt-token: R`` and the records their rebuilds folded ``#mamba-folded-record: F`` in the
same line; Prometheus ``sglang:replayssm_record_rebuilt_tokens_total``,
``sglang:replayssm_record_rebuilt_hits_total``, ``sglang:replayssm_record_folded_total``, and for the
record pool ``sglang:replayssm_record_pool_bytes`` (gauge) and
``sglang:replayssm_record_evicted_tokens_total`` (records dropped, oldest first, for newer tokens),
``sglang:replayssm_skipped_plants_total`` (rebuilt-state plants skipped by fix ``planted_lock_budget``) and
``sglang:replayssm_store_damaged_files_total{kind}`` (L3 store files refused).

Leak accounting (fix ``leak_gauges``): what the plugin holds beside SGLang's pools, as gauges. Each counts a structure of ours that traffic fills and that must drain back to its idle value
(0) once the requests finished and the tree released what it cached (``/flush_cache``, or eviction):

=======================================================  ===============================================
``sglang:replayssm_record_slots_used``                   device record slots held by an allocated KV index
``sglang:replayssm_interval_states_used``                kept prefill states held by an allocated KV index
``sglang:replayssm_planted_states``                      planted tree states whose rebuild is not issued
``sglang:replayssm_planted_locks``                       tree-node locks those planted states hold
``sglang:replayssm_pending_record_jobs``                 queued rebuilds and record loads (next forward)
``sglang:replayssm_ring_slots_used``                     allocated mamba slots with a non-empty decode ring
``sglang:replayssm_host_record_entries``                 host record rows held by an allocated host KV index
``sglang:replayssm_host_record_pool_bytes``              bytes of the host record pool (allocated once)
=======================================================  ===============================================

A record, kept state or host row keyed by a *free* KV index is dead (the allocator choke point drops it
when the index is handed out again), so it is not counted: "used" means reachable. Reading the counts
costs a few reductions over ``[KV]``-sized index maps and one host sync per update, so they are
refreshed where SGLang reports its own metrics (its decode report, its idle loop), at most once per
:data:`MIN_PERIOD_S` (``force`` for tests): no per-step host sync.

A request is counted once per admission (a chunked prefill's later chunks do not re-match; a
retracted request that is re-admitted is counted again, as SGLang counts its hit tokens again).
"""

from __future__ import annotations

import contextvars
import logging
import re
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

import torch

from sglang_replayssm.state import peek, state_of, take
from sglang_replayssm.strategies import STRATEGIES

__all__ = [
    "GAUGES",
    "gauge_counts",
    "maybe_update_gauges",
    "LOG_KEY",
    "PROMETHEUS_NAME",
    "REBUILT_LOG_KEY",
    "REBUILT_PROMETHEUS_NAME",
    "collect_for_prefill",
    "count_store_damage",
    "lost_hit_tokens",
    "pop_lost_hit",
    "process_total",
    "record_match",
    "report_prefill",
    "use_records",
]

PROMETHEUS_NAME = "sglang:replayssm_mamba_lost_hit_tokens_total"
LOG_KEY = "#mamba-lost-hit-token"
REBUILT_PROMETHEUS_NAME = "sglang:replayssm_record_rebuilt_tokens_total"
REBUILT_LOG_KEY = "#mamba-rebuilt-token"
FOLDED_LOG_KEY = "#mamba-folded-record"
HITS_PROMETHEUS_NAME = "sglang:replayssm_record_rebuilt_hits_total"
FOLDED_PROMETHEUS_NAME = "sglang:replayssm_record_folded_total"
POOL_BYTES_PROMETHEUS_NAME = "sglang:replayssm_record_pool_bytes"
EVICTED_PROMETHEUS_NAME = "sglang:replayssm_record_evicted_tokens_total"
STORE_DAMAGED_PROMETHEUS_NAME = "sglang:replayssm_store_damaged_files_total"
SKIPPED_PLANTS_PROMETHEUS_NAME = "sglang:replayssm_skipped_plants_total"
_REPORTER_LOGGER = "sglang.srt.managers.scheduler_components.metrics_reporter"

_pending: contextvars.ContextVar[tuple[int, int, int] | None] = contextvars.ContextVar("replayssm_lost_hit", default=None)
_lock = threading.Lock()
_total = 0
_counters: dict[str, Any] = {}
_evicted_reported: dict[int, int] = {}  # id(record pool) -> evictions already counted
_filter_installed = False
_CACHED_RE = re.compile(r"(#cached-token: \d+, )")


def use_records(rebuild_of: Callable[[Any], tuple[int, int]], pool_of: Callable[[Any], Any]) -> None:
    """Install the records room's rebuilt-hit counts and record-pool lookup (idempotent;
    ``STRATEGIES.rebuild_of`` / ``record_pool_of``)."""
    STRATEGIES.rebuild_of, STRATEGIES.record_pool_of = rebuild_of, pool_of


def lost_hit_tokens(result: Any) -> int:
    """KV-hit tokens of a match result that no mamba state (device or host) can resume from."""
    full = int(getattr(result, "full_kv_hit_length", 0) or 0)
    kept = int(result.device_prefix_len) + int(getattr(result, "host_hit_length", 0) or 0)
    return max(0, full - kept)


def record_match(params: Any, result: Any) -> None:
    """After a match with a request attached, remember its lost hit on the request (overwrites
    the value of an earlier match of the same request, e.g. one that was not admitted)."""
    req = getattr(params, "req", None)
    if req is not None:
        state_of(req).lost_hit_tokens = lost_hit_tokens(result)


def pop_lost_hit(req: Any) -> int:
    """The lost hit recorded on ``req`` by its last match (0 if none), removed from it."""
    return int(take(req, "lost_hit_tokens") or 0)


def collect_for_prefill(stats: Any, reqs: Iterable[Any]) -> int:
    """Move the recorded lost hits of the newly admitted ``reqs`` onto ``stats``; return the sum."""
    n = tokens = hits = folded = 0
    for req in reqs:
        n += pop_lost_hit(req)
        t, f = STRATEGIES.rebuild_of(req)
        tokens, hits, folded = tokens + t, hits + (t > 0), folded + f
    state = state_of(stats)
    state.lost_hit_tokens, state.prefill_rebuilds = n, (tokens, hits, folded)
    return n


def process_total() -> int:
    """Lost-hit tokens reported by this process so far (also what the counter holds)."""
    return _total


class _AppendLostHit(logging.Filter):
    """Adds ``#mamba-lost-hit-token: N, `` after ``#cached-token: M, `` of a prefill log line."""

    def filter(self, record: logging.LogRecord) -> bool:
        pending = _pending.get()
        if pending is not None and isinstance(record.msg, str) and record.msg.startswith("Prefill batch"):
            n, rebuilt, folded = pending
            keys = f"{LOG_KEY}: {n}, {REBUILT_LOG_KEY}: {rebuilt}, {FOLDED_LOG_KEY}: {folded}"
            text, hits = _CACHED_RE.subn(rf"\g<1>{keys}, ", record.msg, count=1)
            record.msg = text if hits else f"{record.msg}, {keys}"
        return True


def _install_filter() -> None:
    global _filter_installed
    with _lock:
        if not _filter_installed:
            logging.getLogger(_REPORTER_LOGGER).addFilter(_AppendLostHit())
            _filter_installed = True


_DOCS = {
    PROMETHEUS_NAME: "Prompt tokens whose KV prefix hit was discarded because no mamba state existed at "
    "that depth (recomputed instead), sglang-replayssm.",
    REBUILT_PROMETHEUS_NAME: "Prompt tokens of prefix hits whose mamba state was rebuilt from stored "
    "layer inputs (records) instead of recomputed, sglang-replayssm.",
    HITS_PROMETHEUS_NAME: "Prefix hits whose mamba state was rebuilt from records, sglang-replayssm.",
    FOLDED_PROMETHEUS_NAME: "Records folded by those rebuilds (from the deepest kept state), sglang-replayssm.",
    POOL_BYTES_PROMETHEUS_NAME: "Bytes held by the record pool (records, interval states, maps), sglang-replayssm.",
    EVICTED_PROMETHEUS_NAME: "Records dropped, oldest first, to make room for newer tokens, sglang-replayssm.",
    STORE_DAMAGED_PROMETHEUS_NAME: "Damaged files found in the HiCache L3 store (label kind: truncated, corrupt, "
    "other_model, other_layout, missing_twin), skipped and never served, sglang-replayssm.",
    SKIPPED_PLANTS_PROMETHEUS_NAME: "Rebuilt-state plants skipped because their lock would take tokens the prefill "
    "round had promised (fix planted_lock_budget; a lost hit, exact), sglang-replayssm.",
}


def _prometheus_counter(name: str, labelnames: list[str], kind: str = "Counter") -> Any:
    with _lock:
        if name not in _counters:
            import prometheus_client

            cls = getattr(prometheus_client, kind)
            _counters[name] = cls(name=name, documentation=_DOCS[name], labelnames=labelnames)
        return _counters[name]


def _record_pool_values(reporter: Any) -> tuple[int, int] | None:
    """``(pool bytes, evictions since the last report)`` of the scheduler's record pool, if any."""
    pool = STRATEGIES.record_pool_of(getattr(getattr(reporter, "scheduler", None), "req_to_token_pool", None))
    if pool is None:
        return None
    with _lock:
        new = pool.evicted - _evicted_reported.get(id(pool), 0)
        _evicted_reported[id(pool)] = pool.evicted
    return pool.nbytes, new


def count_store_damage(kind: str) -> None:
    """One damaged L3 store file of ``kind`` (radix/records/hicache/store_integrity.py), counted in
    ``sglang:replayssm_store_damaged_files_total{kind}`` (the storage threads have no collector
    labels; the scheduler process exports it with the others)."""
    _prometheus_counter(STORE_DAMAGED_PROMETHEUS_NAME, ["kind"]).labels(kind=kind).inc()


def count_skipped_plant() -> None:
    """One rebuilt-state plant skipped by ``planted_lock_budget``, counted in
    ``sglang:replayssm_skipped_plants_total`` (no labels, like the store's counter)."""
    _prometheus_counter(SKIPPED_PLANTS_PROMETHEUS_NAME, []).inc()


def report_prefill(original: Callable[..., Any], reporter: Any, *args: Any, **kwargs: Any) -> Any:
    """Around ``SchedulerMetricsReporter.report_prefill_stats``: log and count the batch's lost hits."""
    global _total
    stats = kwargs.get("prefill_stats", args[1] if len(args) > 1 else None)
    state = peek(stats)
    n = int((None if state is None else state.lost_hit_tokens) or 0)
    rebuilt, hits, folded = (None if state is None else state.prefill_rebuilds) or (0, 0, 0)
    with _lock:
        _total += n
    collector = getattr(reporter, "metrics_collector", None)
    if getattr(reporter, "current_scheduler_metrics_enabled", False) and collector is not None:
        labels = dict(getattr(collector, "labels", {}) or {})
        pool = _record_pool_values(reporter)
        evicted = 0 if pool is None else pool[1]
        for name, value in ((PROMETHEUS_NAME, n), (REBUILT_PROMETHEUS_NAME, rebuilt), (HITS_PROMETHEUS_NAME, hits),
                            (FOLDED_PROMETHEUS_NAME, folded), (EVICTED_PROMETHEUS_NAME, evicted)):
            counter = _prometheus_counter(name, list(labels))  # exported from the first prefill on, at 0 if none
            if value:
                (counter.labels(**labels) if labels else counter).inc(value)
            elif labels:
                counter.labels(**labels)
        if pool is not None:
            gauge = _prometheus_counter(POOL_BYTES_PROMETHEUS_NAME, list(labels), "Gauge")
            (gauge.labels(**labels) if labels else gauge).set(pool[0])
    _install_filter()
    token = _pending.set((n, rebuilt, folded))
    try:
        return original(reporter, *args, **kwargs)
    finally:
        _pending.reset(token)


# ---- leak-accounting gauges -----------------------------------------------------------------------

#: Gauge name -> help text (the counts of :func:`gauge_counts`, keyed by the name without the prefix).
GAUGES: dict[str, str] = {
    "record_slots_used": "Device record slots held by an allocated KV index, sglang-replayssm.",
    "interval_states_used": "Kept prefill (interval) states held by an allocated KV index, sglang-replayssm.",
    "planted_states": "Planted tree states whose rebuild has not been issued, sglang-replayssm.",
    "planted_locks": "Tree-node locks held for planted states until their rebuild is issued, sglang-replayssm.",
    "pending_record_jobs": "Record rebuilds and record loads queued for the next forward, sglang-replayssm.",
    "ring_slots_used": "Allocated mamba slots whose decode ring holds unfolded records, sglang-replayssm.",
    "host_record_entries": "Host record rows held by an allocated host KV index, sglang-replayssm.",
    "host_record_pool_bytes": "Bytes of the host record pool (HiCache), sglang-replayssm.",
}
GAUGE_PREFIX = "sglang:replayssm_"
#: Least wall time between two updates outside tests (bounds the host syncs on CUDA).
MIN_PERIOD_S = 1.0

_last_update: dict[int, float] = {}
_gauges: dict[str, Any] = {}


def _used_mask(size: int, free: torch.Tensor | None, device: Any, page_size: int = 1) -> torch.Tensor:
    """``[size]`` bool: the indices not in ``free`` (page ids when ``page_size`` > 1), index 0 (SGLang's
    padding slot) excluded."""
    used = torch.ones(size, dtype=torch.bool, device=device)
    used[0] = False
    if free is not None and free.numel():
        idx = free.reshape(-1).to(device, torch.int64)
        if page_size > 1:
            idx = (idx[:, None] * page_size + torch.arange(page_size, device=device)).reshape(-1)
        used[idx[idx < size]] = False
    return used


def _reachable(keyed: torch.Tensor, used: torch.Tensor) -> torch.Tensor:
    """0-d count of entries ``keyed[i] >= 0`` at used indices ``i`` (``keyed`` has a trailing sink)."""
    n = min(used.numel(), keyed.numel() - 1)
    return ((keyed[:n] >= 0) & used[:n]).sum()


def _kv_free(allocator: Any) -> tuple[torch.Tensor | None, int]:
    get = getattr(allocator, "get_all_free_pages", None)
    free = get() if get is not None else None
    return free, int(getattr(allocator, "page_size", 1) or 1)


def _host_counts(pool: Any, tree_cache: Any) -> tuple[torch.Tensor | int, int]:
    host = getattr(getattr(pool, "hicache", None), "host", None)
    if host is None:
        return 0, 0
    group = getattr(getattr(tree_cache, "cache_controller", None), "mem_pool_host", None)
    anchor = getattr(group, "anchor_entry", None)
    host_kv = group if anchor is None else anchor.host_pool
    slot_used = getattr(host_kv, "slot_used", None)
    if slot_used is None:
        entries: torch.Tensor | int = int((host.slot_of[:-1] >= 0).sum())
    else:
        entries = _reachable(host.slot_of, slot_used)
    return entries, int(host.nbytes)


def gauge_counts(req_to_token_pool: Any, kv_allocator: Any, tree_cache: Any) -> dict[str, int]:
    """The gauges' values (keys of :data:`GAUGES`) for one scheduler's pools; every value is 0 when
    nothing of ours is held. One host sync (device reductions gathered into one tensor)."""
    out = dict.fromkeys(GAUGES, 0)
    device_counts: dict[str, torch.Tensor] = {}
    pool = STRATEGIES.record_pool_of(req_to_token_pool)
    if pool is not None and kv_allocator is not None:
        free, page_size = _kv_free(kv_allocator)
        used = _used_mask(pool.slot_of.numel() - 1, free, pool.slot_of.device, page_size)
        device_counts["record_slots_used"] = _reachable(pool.slot_of, used)
        if pool.states is not None:
            device_counts["interval_states_used"] = _reachable(pool.states.state_of, used)
    if pool is not None:
        hicache = pool.hicache
        locks = [] if hicache is None else hicache.locks
        out["planted_locks"] = sum(len(entry[3]) for entry in locks)
        out["pending_record_jobs"] = len(pool.pending) + (0 if hicache is None else len(hicache.loads))
        host_entries, out["host_record_pool_bytes"] = _host_counts(pool, tree_cache)
        if isinstance(host_entries, torch.Tensor):
            out["host_record_entries"] = int(host_entries)
        else:
            out["host_record_entries"] = host_entries
    core_state = peek(getattr(tree_cache, "tree_core", None)) if tree_cache is not None else None
    planted = None if core_state is None else core_state.planted_nodes
    out["planted_states"] = len(planted) if planted else 0  # nodes, each with >= 1 unissued rebuild
    mamba_pool = getattr(req_to_token_pool, "mamba_pool", None)
    write_pos = getattr(mamba_pool, "replayssm_write_pos", None)
    allocator = getattr(req_to_token_pool, "mamba_allocator", None)
    if write_pos is not None and allocator is not None:
        used = _used_mask(write_pos.numel(), getattr(allocator, "free_slots", None), write_pos.device)
        device_counts["ring_slots_used"] = ((write_pos > 0) & used).sum()
    if device_counts:
        values = torch.stack([v.to("cpu" if v.device.type == "cpu" else v.device, torch.int64)
                              for v in device_counts.values()]).tolist()  # the one host sync
        out.update(zip(device_counts, (int(v) for v in values)))
    return out


def _gauge(name: str, labelnames: list[str]) -> Any:
    if name not in _gauges:
        import prometheus_client

        _gauges[name] = prometheus_client.Gauge(name=GAUGE_PREFIX + name, documentation=GAUGES[name],
                                                labelnames=labelnames)
    return _gauges[name]


def update_gauges(scheduler: Any, labels: dict[str, str]) -> dict[str, int]:
    """Set every gauge from ``scheduler``'s pools (with the collector's ``labels``); returns the counts."""
    values = gauge_counts(getattr(scheduler, "req_to_token_pool", None),
                    getattr(scheduler, "token_to_kv_pool_allocator", None), getattr(scheduler, "tree_cache", None))
    for name, value in values.items():
        gauge = _gauge(name, list(labels))
        (gauge.labels(**labels) if labels else gauge).set(value)
    return values


def maybe_update_gauges(reporter: Any, *, force: bool = False) -> dict[str, int] | None:
    """:func:`update_gauges` for a ``SchedulerMetricsReporter`` with metrics on, at most once per
    :data:`MIN_PERIOD_S` unless ``force``; None when skipped."""
    collector = getattr(reporter, "metrics_collector", None)
    if not getattr(reporter, "current_scheduler_metrics_enabled", False) or collector is None:
        return None
    now = time.monotonic()
    if not force and now - _last_update.get(id(reporter), -1e9) < MIN_PERIOD_S:
        return None
    _last_update[id(reporter)] = now
    return update_gauges(getattr(reporter, "scheduler", None), dict(getattr(collector, "labels", {}) or {}))
