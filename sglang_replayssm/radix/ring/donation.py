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

from typing import Any

from sglang_replayssm.radix import config
from sglang_replayssm.radix.records.pool import pool_of
from sglang_replayssm.radix.ring.pool import ring_pool
from sglang_replayssm.radix.spec.ring import fold_before_copy

__all__ = ["end_state_before_finish_donation", "materialize_before_finish_donation"]


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
    """Before ``MambaComponent.prepare_for_caching_req`` (extra_buffer, finished): make the state
    SGLang donates the request's exact end state.

    extra_buffer donates the ping-pong slot of the last tracked depth (a prefill chunk end rounded
    to the checkpoint grid, or a decode multiple of the track interval) and cuts the inserted key
    there, so the tokens after it are lost to every later request. The working slot holds the state
    after all ``token_ids_len`` tokens with KV (checkpoint + ring with the decode ring): copy it,
    pending records folded (``MambaPool.copy_from`` is exact, :mod:`snapshot`), into the slot SGLang
    is about to donate and record that depth, so the key is inserted to its full length.

    Only with records on (:mod:`records`, which need the decode ring): the donated state replaces
    the tracked one, so a later prompt that leaves this path between the two depths resumes from
    records, not from the tracked state. No-op unless finished, extra_buffer, no int8 checkpoints,
    a page-aligned depth, and a live working slot and keep slot.
    """
    cache = component.cache
    if not is_finished or not cache.enable_mamba_extra_buffer or token_ids_len <= 0:
        return
    req_pool = cache.req_to_token_pool
    if pool_of(req_pool) is None or getattr(req_pool, "mamba_ckpt_pool", None) is not None:
        return  # without records the track state it replaces would be the only state below
    if token_ids_len % max(1, int(getattr(cache, "page_size", 1))):
        return
    slot, track = req.kv.mamba_pool_idx, req.kv.mamba_ping_pong_track_buffer
    keep = req_pool.get_mamba_ping_pong_keep_idx(req)
    if slot is None or track is None or keep is None or int(track[keep]) < 0:
        return
    if (req.kv.mamba_last_track_seqlen or 0) >= token_ids_len:
        return
    if config.enabled("record_spec_ring"):  # the spec ring's pending accepted records, folded first
        fold_before_copy(req_pool, req)
    req_pool.copy_mamba_state(req_pool.translate_mamba_indices(slot.reshape(1)),
                              req_pool.translate_mamba_indices(track[keep].reshape(1)))
    req.kv.mamba_last_track_seqlen = token_ids_len
