"""KV eviction order: leaves whose KV no match can use go first (fix ``stateless_kv_first``).

A hybrid model's prefix hit lands no deeper than the deepest mamba state on its path (or, with records,
the deepest token whose span from that state the records cover). SGLang 0.5.23's KV eviction pops the
tree's evictable device leaves by its eviction strategy alone (``FullComponent._evict_device_start``: a
heap keyed by ``eviction_strategy.get_priority``, LRU by default), blind to states. A leaf whose state
was evicted while it had children (an internal tombstone) and whose children went since keeps its KV as
a device leaf (``_iteratively_delete_tombstone_ancestors`` stops at KV): tokens no request can resume
from, held as long as any live KV of the same age.

:func:`stateless_kv_first` keys that heap by ``(live, SGLang's key)``: a leaf is dead (``live`` 0, popped
first, among the dead in SGLang's order) when it holds no mamba state on the device or the host, no
streaming session references it, and no record covers its first token (so no span through it can be
rebuilt: :mod:`records.match`); every other leaf keeps SGLang's key behind the dead. A parent that becomes
a leaf mid-walk is keyed alike when SGLang pushes it.

Only on a server whose mamba pool runs the decode ring (``--enable-linear-replayssm``); with ReplaySSM
off the order is SGLang's.

Invariant: only the order in which evictable leaves are taken changes: which leaves are evictable, how
many tokens a walk frees and every lock are SGLang's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch

__all__ = ["DeadFirst", "dead_leaves", "stateless_kv_first"]


def _mamba_free(node: Any, mamba: Any) -> bool:
    """Whether ``node`` holds no mamba state, on the device or the host."""
    cd = node.component_data[mamba]
    return cd.value is None and cd.host_value is None


def _kv_only(node: Any, full: Any, mamba: Any) -> bool:
    """Whether ``node`` holds KV, no mamba state, and no session reference (a streaming session's path keeps
    SGLang's order)."""
    kv = node.component_data[full]
    return (_mamba_free(node, mamba) and kv.value is not None and len(kv.value) > 0
            and not getattr(kv, "session_ref", 0))


def dead_leaves(nodes: Iterable[Any], full: Any, mamba: Any, slot_of: torch.Tensor | None) -> set[Any]:
    """The nodes of ``nodes`` with KV only (:func:`_kv_only`) whose first KV token has no record (``slot_of``: the
    record pool's KV index -> record slot map, -1 where none; None: no records). One lookup for all of them."""
    free = [n for n in nodes if _kv_only(n, full, mamba)]
    if not free or slot_of is None:
        return set(free)
    first = torch.stack([n.component_data[full].value[0] for n in free]).to(slot_of.device, torch.int64)
    has = (slot_of[first] >= 0).tolist()
    return {n for n, covered in zip(free, has, strict=True) if not covered}


class DeadFirst:
    """A heap key for SGLang's KV leaf heap: ``(0, key)`` for a dead leaf, ``(1, key)`` otherwise, ``key``
    SGLang's own (``inner``). ``dead`` is set per walk (:func:`dead_leaves`); a node not classified there (a
    parent pushed mid-walk) is classified on its own."""

    def __init__(self, inner: Callable[[Any], Any], full: Any, mamba: Any) -> None:
        self.inner, self.full, self.mamba = inner, full, mamba
        self.slot_of: torch.Tensor | None = None
        self.dead: set[Any] = set()
        self.known: set[Any] = set()

    def classify(self, nodes: Iterable[Any], slot_of: torch.Tensor | None) -> None:
        nodes = list(nodes)
        self.slot_of, self.known = slot_of, set(nodes)
        self.dead = dead_leaves(nodes, self.full, self.mamba, slot_of)

    def __call__(self, node: Any) -> tuple[int, Any]:
        if node not in self.known:
            self.known.add(node)
            self.dead |= dead_leaves((node,), self.full, self.mamba, self.slot_of)
        return (0 if node in self.dead else 1), self.inner(node)


def _slot_of(cache: Any) -> torch.Tensor | None:
    """The record pool's KV index -> record slot map (the state object's ``record_pool``), None without one."""
    from sglang_replayssm.state import peek

    state = peek(getattr(cache, "req_to_token_pool", None))
    pool = None if state is None else state.record_pool
    return None if pool is None else pool.slot_of


def stateless_kv_first(original: Callable[..., Any], component: Any, request_cnt: int) -> Any:
    """SGLang's KV walk start, its heap keyed dead leaves first (with the decode ring and mamba states)."""
    from sglang.srt.mem_cache.unified_cache.component_type import ComponentType

    from sglang_replayssm.radix.eviction.order import has_decode_ring

    tree = component.tree_core
    if ComponentType.MAMBA not in tree.components_by_type or not has_decode_ring(
            getattr(component.cache, "req_to_token_pool", None)):
        return original(component, request_cnt)
    component._ensure_eviction_strategy()
    key = component.session_ref_eviction_strategy
    if not isinstance(key, DeadFirst):
        key = component.session_ref_eviction_strategy = DeadFirst(key, ComponentType.FULL, ComponentType.MAMBA)
    key.classify(tree.evictable_device_leaves, _slot_of(component.cache))
    return original(component, request_cnt)
