"""extra_buffer finish donation of the exact end state (fix ``end_state``, records on).

Run by the ring room's finish-donation hook through :func:`sglang_replayssm.radix.ring.donation.use_end_state`
(installed by :func:`sglang_replayssm.radix.records.hooks.install`).
"""

from __future__ import annotations

from typing import Any

from sglang_replayssm.radix import config
from sglang_replayssm.radix.records.pool import pool_of
from sglang_replayssm.radix.spec.ring import fold_before_copy

__all__ = ["end_state_before_finish_donation", "keeps_branch_state"]


def keeps_branch_state(req: Any) -> bool:
    """Whether the last tracked state of ``req`` is its branch point's (fix ``end_state_branch``): the
    admission match found KV deeper than any state (SGLang's ``mamba_branching_seqlen``, a depth where
    another path already leaves this one, no records planted there), so the prefill tracked the state at
    that depth for the next request that leaves there too. That state serves every later branch; the end
    state only this conversation's next turn, so it is kept and the end state is not swapped in."""
    if not config.enabled("end_state_branch"):
        return False
    branch = getattr(req, "mamba_branching_seqlen", None)
    return branch is not None and int(branch) > 0 and req.kv.mamba_last_track_seqlen == int(branch)


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
    records, not from the tracked state. With ``end_state_branch`` on, a tracked state at the request's
    branch point is kept (:func:`keeps_branch_state`). No-op unless finished, extra_buffer, no int8 checkpoints,
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
    if (req.kv.mamba_last_track_seqlen or 0) >= token_ids_len or keeps_branch_state(req):
        return
    if config.enabled("record_spec_ring"):  # the spec ring's pending accepted records, folded first
        fold_before_copy(req_pool, req)
    req_pool.copy_mamba_state(req_pool.translate_mamba_indices(slot.reshape(1)),
                              req_pool.translate_mamba_indices(track[keep].reshape(1)))
    req.kv.mamba_last_track_seqlen = token_ids_len
