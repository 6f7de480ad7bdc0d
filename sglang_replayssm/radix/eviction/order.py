"""Tree-state eviction order: states on reused paths go last (fix ``reused_states_last``).

SGLang 0.5.23 evicts the tree's mamba states in plain LRU order: its walk starts at the LRU end of the
``MambaComponent``'s list (``_evict_device_start``). Under memory pressure that order spends the few state
slots on every finished request's fresh end state, which ages out before its next turn arrives, and evicts
the states at shared depths (a document's end, a branch point) that later requests resume from.

Before each walk, :func:`reused_states_last` moves the states of nodes that at least two later requests went
through (``hit_count``, counted by SGLang's insert walk; 2 is its ``SLRUStrategy`` threshold) to the MRU end,
their order kept, so the walk takes every other state first: a segmented LRU over states. At most 60% of the
state pool is protected (the most recently used such states); older ones keep their place, so states of
documents no longer asked about still age out.

Only SGLang's Python TreeCore keeps that list in Python; the Rust TreeCore (SGLang's default where its
extension loads) keeps it native, with no way to order it from outside, and runs its eviction walks natively
(no component's ``_evict_device_start`` is called, so ``stateless_kv_first``'s KV walk is bypassed too).
:func:`python_tree_core` therefore selects the Python TreeCore for a cache with mamba states while either fix
is on (one log line).

Both act only on a server whose mamba pool runs the decode ring (``--enable-linear-replayssm``): with
ReplaySSM off the tree is SGLang's, order and TreeCore alike.

Invariant: only the list's order changes: no state is freed, locked or moved; the session partition's
sentinels (not in the list's ``cache``) stay where they are.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

logger = logging.getLogger(__name__)

__all__ = ["PROTECTED_HITS", "TREE_ORDER_FIXES", "has_decode_ring", "protected_cap", "python_tree_core", "reorder",
           "reused_states_last"]

#: A state is protected once this many later requests went through its node (SGLang's SLRU threshold).
PROTECTED_HITS = 2
#: At most this share of the state pool is protected: more protection gains on a loop over conversations (rag-mem)
#: and, past this share, loses on zipf-drawn documents (the capacity simulator's trace; lab/plan/RESULTS.md).
PROTECTED_SHARE = 0.6


def protected_cap(component: Any) -> int:
    """How many states may be protected: :data:`PROTECTED_SHARE` of the state pool (its slots, ``MambaPool.size``)."""
    return int(component.cache.req_to_token_pool.mamba_pool.size * PROTECTED_SHARE)


def _protected_from_mru(lru: Any, cap: int) -> list[tuple[Any, bool]]:
    """The ``cap`` most recently used protected nodes of ``lru``, most recent first, each with whether a node
    that stays (unprotected, or a sentinel: not in ``cache``) is more recent than it, i.e. whether it must move."""
    slot = lru.component_type  # a device list's pointer slot (UnifiedLRUList._pt)
    found: list[tuple[Any, bool]] = []
    behind = False
    node = lru.head.lru_next[slot]
    while node is not lru.tail and len(found) < cap:
        if node.id in lru.cache and node.hit_count >= PROTECTED_HITS:
            found.append((node, behind))
        else:
            behind = True
        node = node.lru_next[slot]
    return found


def reorder(lru: Any, cap: int) -> int:
    """Put the ``cap`` most recently used protected nodes of ``lru`` (a device ``UnifiedLRUList``) at its MRU end,
    in their order, the rest in theirs; returns how many nodes moved. Nodes already in place stay: after the
    previous walk's reorder only newly protected nodes move, so a walk costs one pass over the list. With SGLang's
    session partition (``mid``) every protected node takes SGLang's own MRU move, which keeps its half."""
    found = _protected_from_mru(lru, cap)
    if lru.mid is not None:
        for node, _ in reversed(found):  # the least recent first: the most recent ends at the MRU end
            lru.reset_node_mru(node)
        return len(found)
    placed, moved = None, 0  # the protected node last put in its final place
    for node, behind in found:
        if behind:
            if placed is None:
                lru.reset_node_mru(node)
            else:
                lru.remove_node(node)
                lru.insert_after(placed, node)
            moved += 1
        placed = node
    return moved


def has_decode_ring(req_to_token_pool: Any) -> bool:
    """Whether the mamba pool of ``req_to_token_pool`` runs the decode ring (``--enable-linear-replayssm``)."""
    from sglang_replayssm.radix.ring.pool import ring_pool

    return ring_pool(getattr(req_to_token_pool, "mamba_pool", None)) is not None


def reused_states_last(original: Callable[..., Any], component: Any, request_cnt: int) -> Any:
    """SGLang's walk start, on a list whose protected states are at the MRU end (with the decode ring)."""
    if has_decode_ring(getattr(component.cache, "req_to_token_pool", None)):
        reorder(component.tree_core.lru_lists[component.component_type], protected_cap(component))
    return original(component, request_cnt)


#: The fixes that run inside SGLang's Python TreeCore's eviction walks (the Rust TreeCore runs its own).
TREE_ORDER_FIXES = ("reused_states_last", "stateless_kv_first")


def python_tree_core(original: Callable[..., Any], name: str, params: Any) -> str:
    """SGLang's TreeCore choice, but the Python one for a cache with mamba states while a fix of
    :data:`TREE_ORDER_FIXES` is on (their walks run there)."""
    from sglang.srt.mem_cache.unified_cache.component_type import ComponentType

    from sglang_replayssm.radix import config

    chosen = original(name, params)
    fixes = [fix for fix in TREE_ORDER_FIXES if config.enabled(fix)]
    if (chosen == "rust" and fixes and ComponentType.MAMBA in (params.tree_components or ())
            and has_decode_ring(getattr(params, "req_to_token_pool", None))):
        logger.info("sglang-replayssm: the Python TreeCore, not %s: %s order the eviction walks, which only the "
                    "Python TreeCore runs in Python", chosen, " and ".join(fixes))
        return "python"
    return chosen
