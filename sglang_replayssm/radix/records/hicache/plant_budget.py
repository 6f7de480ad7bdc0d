"""Planted-state locks inside SGLang's prefill budget (fix ``planted_lock_budget``).

With HiCache a planted state (:mod:`record_match`) is locked from the admission match until its rebuild
is issued at the next forward (:func:`host_records.lock_planted`). SGLang matches each waiting request
(``init_next_round_input``) *between* ``PrefillAdder.add_one_req`` calls of one round, and the adder's
budget (``available + evictable``) for the requests it already admitted counted the evictable tokens
such a lock then protects. Request B's plant on an unlocked path after request A was admitted could
thus take the tokens A's allocation (``prepare_for_extend``) was promised: the scheduler's
``Out of memory`` with every tree token locked, the planted lock held by a request the adder then
rejected.

Invariant kept: a plant whose lock would protect tokens that are evictable now is skipped (SGLang's
result stands: a lost hit, exact) while the round's adder has admitted a request (``can_run_list``
non-empty, the chunked request included) other than this one. A plant on an already locked path, or
the first admission of a round (whose lock the adder's own live budget then sees), is unchanged.

The round's adder is read from the tree cache's state (``prefill_adder``, a weak reference set AFTER
``PrefillAdder.__init__``): no module global, and a finished round's adder is not kept alive.
"""

from __future__ import annotations

import weakref
from typing import Any

from sglang_replayssm.state import peek, state_of

__all__ = ["hicache_cache", "note_adder", "overcommits"]


def hicache_cache(component: Any) -> bool:
    """Whether ``component`` (the tree's mamba component) has HiCache's host pool."""
    return getattr(component, "_mamba_pool_host", None) is not None


def note_adder(result: Any, adder: Any, *args: Any, **kwargs: Any) -> None:
    """AFTER ``PrefillAdder.__init__``: this round's adder, on its tree cache's state."""
    cache = getattr(adder, "tree_cache", None)
    if cache is not None:
        state_of(cache).prefill_adder = weakref.ref(adder)


def _committed(cache: Any, req: Any) -> bool:
    """The current round's adder has admitted a request other than ``req``."""
    state = peek(cache)
    ref = None if state is None else state.prefill_adder
    adder = None if ref is None else ref()
    admitted = [] if adder is None else list(getattr(adder, "can_run_list", ()) or ())
    return any(r is not req for r in admitted)


def overcommits(cache: Any, req: Any, node: Any) -> bool:
    """Whether locking ``node`` for ``req``'s plant would protect tokens the round's adder already
    counted as evictable for a request it admitted. Probed with a lock taken and released at once
    (``evictable_size`` before and after; no tree change is left behind). Both callers skip the plant on
    True, so each True is counted in ``sglang:replayssm_skipped_plants_total``."""
    from sglang_replayssm.radix import config

    if not config.enabled("planted_lock_budget") or not _committed(cache, req):
        return False
    before = int(cache.evictable_size())
    lock = cache.inc_lock_ref(node)
    try:
        after = int(cache.evictable_size())
    finally:
        cache.dec_lock_ref(node, lock.to_dec_params())
    if after >= before:
        return False
    from sglang_replayssm.radix.metrics import count_skipped_plant

    count_skipped_plant()
    return True
