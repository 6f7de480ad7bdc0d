"""no_buffer finish donation at the request's real depth.

Under ``--mamba-radix-cache-strategy no_buffer`` a finished request donates its working slot to
the radix tree. With the decode ring, SGLang 0.5.23 keys that state at ``token_ids_len -
write_pos`` (the last flush) and zeroes the cursor, but ``conv[slot]`` holds the window at
``token_ids_len``: the node's conv and temporal belong to different depths, and the pending
records are thrown away.

Fix: fold the slot's pending records into its checkpoint first (the request is finished, its ring
is no longer live), which empties the ring. SGLang's own code then sees ``write_pos == 0`` and
donates the full state at ``token_ids_len``, where conv and temporal agree.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sglang_replayssm.radix.ring.pool import ring_pool
from sglang_replayssm.strategies import STRATEGIES

__all__ = ["end_state_before_finish_donation", "materialize_before_finish_donation", "use_end_state"]

def use_end_state(end_state: Callable[[Any, Any, int, bool], None]) -> None:
    """Install the extra_buffer end-state donation run by :func:`end_state_before_finish_donation` (the
    records room's, radix/records/donation.py; ``STRATEGIES.end_state``)."""
    STRATEGIES.end_state = end_state


def materialize_before_finish_donation(component: Any, req: Any, is_finished: bool) -> None:
    """Before ``MambaComponent.prepare_for_caching_req``: make a finishing no_buffer slot exact.

    No-op for unfinished requests, extra_buffer (which donates track slots), pools without the
    decode ring, and requests that no longer hold a mamba slot.
    """
    if not is_finished or component.cache.enable_mamba_extra_buffer:
        return
    req_pool = component.cache.req_to_token_pool
    view = ring_pool(getattr(req_pool, "mamba_pool", None))
    if view is None:
        return
    slot = req.kv.mamba_pool_idx
    if slot is None:
        return
    view.fold(req_pool.translate_mamba_indices(slot.reshape(1)))


def end_state_before_finish_donation(component: Any, req: Any, token_ids_len: int, is_finished: bool) -> None:
    """Before ``MambaComponent.prepare_for_caching_req`` (fix ``end_state``): the installed end-state
    donation (records room), or nothing."""
    end_state = STRATEGIES.end_state
    if end_state is not None:
        end_state(component, req, token_ids_len, is_finished)
