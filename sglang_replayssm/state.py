"""The package's state on SGLang objects: one typed object per object, attached once, one accessor.

SGLang's objects carry no slot for a plugin, so what the package keeps beside them rides on them, in
one attribute (``_replayssm_state``) set in one place (:func:`state_of`); nothing else of ours is set
on an SGLang object. Which fields an object uses depends on its kind:

* a ``MambaPool``: ``read_copy`` (radix/read_copy/store.py), ``ring_rows`` (the slot -> ring row map of rings
  keyed by request row, radix/ring/rows.py);
* a linear-attention decode kernel (``TritonGDNKernel`` / ``TritonKDAKernel``): ``mamba_pool``, the pool
  its backend decodes into, linked when the backend is built (radix/read_copy/hooks.py); the decode step
  reaches the pool's read copy through it;
* a model (``ModelRunner.model``, the ``KVCacheConfigurator``'s ``model``): ``record_capacity``, the record
  tokens the KV-budget reservation fixed for it (radix/records/budget.py), read when ``configure`` has
  built the pools (radix/records/startup.py);
* a ``HybridReqToTokenPool``: ``record_pool``, built once with the pools, and ``records_off``
  (radix/records/startup.py, radix/records/pool.py); ``ring_rows``, its mamba pool's slot -> ring row map
  (radix/ring/rows.py);
* the KV allocator: ``record_pool`` (linked by radix/records/capture.py);
* the mamba slot allocator: ``write_pos`` (radix/ring/alloc_reset.py), ``read_copy``;
* a host KV pool: ``host_records``; a tree core: ``planted_nodes`` (radix/records/hicache/);
* a ``ForwardBatch``: ``kept_chunk_states``, ``record_dest`` (``(out_cache_loc's key, ForwardCapture or None)``:
  whether and where the forward captures, whether it may hold inputs for its last layer, whether it keeps chunk
  states), both computed at the forward's first GDN layer for all (radix/records/capture.py);
* a GDN kernel dispatcher: ``extending``, ``(record pool, layer, forward batch)`` while a forward's own
  ``forward_extend`` runs (radix/records/capture.py);
* a ``PrefillStats``: ``lost_hit_tokens`` and ``prefill_rebuilds`` ``(tokens, hits, folded records)`` of the
  batch (radix/metrics.py);
* a ``Req``: ``lost_hit_tokens`` (radix/metrics.py), ``rebuilt_tokens`` (radix/records/match.py),
  ``host_hit`` (radix/records/hicache/host_hits.py);
* a HiCache ``PrefetchOperation``: ``storage_records`` (radix/records/hicache/storage.py);
* the tree cache (``UnifiedRadixCache``): ``prefill_adder``, a weak reference to the round's ``PrefillAdder``
  (radix/records/hicache/plant_budget.py).

A field is None (``records_off`` False) until set; a one-shot field is read and cleared with
:func:`take`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["ReplaySSMState", "peek", "state_of", "take"]

_ATTR = "_replayssm_state"


@dataclass
class ReplaySSMState:
    """What the package keeps on one SGLang object (module docstring: which object uses which field)."""

    read_copy: Any = None
    ring_rows: Any = None
    mamba_pool: Any = None
    record_capacity: int | None = None
    record_pool: Any = None
    records_off: bool = False
    write_pos: Any = None
    host_records: Any = None
    planted_nodes: dict[Any, Any] | None = None
    kept_chunk_states: Any = None
    record_dest: Any = None
    extending: tuple[Any, Any, Any] | None = None
    lost_hit_tokens: int | None = None
    rebuilt_tokens: tuple[int, int] | None = None
    prefill_rebuilds: tuple[int, int, int] | None = None
    host_hit: tuple[Any, ...] | None = None
    storage_records: Any = None
    prefill_adder: Any = None


def peek(obj: Any) -> ReplaySSMState | None:
    """The state of ``obj``, or None when nothing was attached to it (``obj`` None: None)."""
    attrs = getattr(obj, "__dict__", None)  # the object's own attributes: never a delegated lookup
    return None if attrs is None else attrs.get(_ATTR)


def state_of(obj: Any) -> ReplaySSMState:
    """The state of ``obj``, attached on first use: the one place the package sets an attribute of ours
    on an SGLang object."""
    state = peek(obj)
    if state is None:
        state = ReplaySSMState()
        setattr(obj, _ATTR, state)
    return state


def take(obj: Any, field: str) -> Any:
    """Read field ``field`` of ``obj``'s state and clear it (None when nothing was attached)."""
    state = peek(obj)
    if state is None:
        return None
    value = getattr(state, field)
    setattr(state, field, None)
    return value
