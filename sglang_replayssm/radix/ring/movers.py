"""Exact ReplaySSM state across the paths that move or re-read a slot outside the decode kernel.

A decode-ring slot's state is ``checkpoint (temporal[slot]) folded with its first write_pos ring
records``. SGLang 0.5.23 has two more places, besides the radix snapshots of :mod:`snapshot`, that
read ``temporal`` alone or copy it alone:

* **Extend over a slot with pending records.** With ``--enable-mixed-chunk`` the decode rows of a
  MIXED batch run SGLang's extend (chunked-prefill) kernels; with ``--enable-streaming-session`` a
  session's next turn (or a retracted turn's resume) extends the slot the previous turn decoded
  into. Extend kernels take ``temporal`` as the initial state and ignore the ring, and they leave
  the cursor as it is, so the state regresses by ``write_pos`` tokens and the next decode folds
  the old records a second time. :func:`fold_before_extend` runs right before SGLang's deferred
  copy-on-write / clear, which ``ModelRunner._forward_raw`` calls before any extend forward reads
  the pool: it folds every row's pending records into its own checkpoint and empties the ring.
  Folding is state preserving (``checkpoint + records`` is the same state before and after), so
  rows without records, or a relabelled decode batch, are unaffected except for the fold itself.

* **CPU retraction backup.** ``Req.offload_kv_cache`` (directly, or through
  ``HybridLinearKVPool.get_cpu_copy``) stores ``MambaPool.get_cpu_copy``: conv + temporal, no ring,
  no cursor. :func:`cpu_copy_exact` folds the pending records into the *copy* (the live slot is not
  modified), and :func:`sglang_replayssm.radix.ring.alloc_reset.empty_loaded` empties the ring of every slot a CPU
  copy is loaded into (the copy is a full state, so the destination has no pending records).

Invariants: after :func:`fold_before_extend` every slot of the batch's rows has ``write_pos == 0``
and ``temporal`` equal to its full state (rows outside a MIXED batch or a streaming session have no
records to fold: checked under ``SGLANG_DEBUG_MEMORY_POOL``); a CPU copy's ``temporal`` is the slot's full state; a
slot loaded from a CPU copy has ``write_pos == 0``. Pools without the decode ring (ReplaySSM off,
the spec-verify ring, the unified pool) are never touched.
"""

from __future__ import annotations

from typing import Any

import torch

from sglang_replayssm.radix.ring.pool import ring_pool

__all__ = ["cpu_copy_exact", "fold_before_extend", "rows_may_hold_records"]


def _reads_extend_state(runner: Any, forward_batch: Any) -> bool:
    """Whether this forward runs extend kernels over persistent mamba slots (not a decode batch
    relabelled as a 1-token extend for DP, not target-verify / draft-extend, not a draft worker)."""
    if getattr(runner, "is_draft_worker", False):
        return False
    mode = getattr(forward_batch, "logical_forward_mode", None) or forward_batch.forward_mode
    if not mode.is_extend() or mode.is_target_verify():
        return False
    return not (hasattr(mode, "is_draft_extend_v2") and mode.is_draft_extend_v2())


def rows_may_hold_records(runner: Any, forward_batch: Any) -> bool:
    """Whether an extend forward's rows can carry pending records: a MIXED batch's decode rows
    (``--enable-mixed-chunk``) and a streaming session's kept slot (``--enable-streaming-session``:
    its next turn, a retracted turn's resume), the two cases admission names. Any other extend row's
    slot is fresh (its ring emptied at alloc), a copy-on-write destination of an exact tree state, a
    slot loaded from a full-state CPU copy, or one its own earlier chunk extended. A runner without
    server args is taken to allow both."""
    if forward_batch.forward_mode.is_mixed():
        return True
    server_args = getattr(runner, "server_args", None)
    return server_args is None or bool(getattr(server_args, "enable_streaming_session", False))


def _check_no_records(view: Any, slots: torch.Tensor) -> None:
    """Under SGLang's ``SGLANG_DEBUG_MEMORY_POOL`` (host syncs already paid): an extend that skips the
    fold reads only slots without pending records."""
    flat = view.index(slots)
    pending = torch.where(flat > 0, view.counts(flat), torch.zeros_like(flat))
    if bool((pending > 0).any().item()):
        raise AssertionError(f"sglang-replayssm: an extend reads slots {flat[pending > 0].tolist()} with pending "
                             "ring records outside a MIXED batch or a streaming session")


def fold_before_extend(original: Any, runner: Any, forward_batch: Any) -> None:
    """``ModelRunner._maybe_execute_deferred_mamba_cow_and_clear`` preceded by a fold of every row.

    Runs for extend and MIXED forwards on a decode-ring pool whose rows may hold records
    (:func:`rows_may_hold_records`; other extends skip the fold's launches): each row's slot
    (``req_to_token_pool.get_mamba_indices(req_pool_indices)``, translated to physical ids) has its
    pending records folded into ``temporal`` and its cursor zeroed; then SGLang's deferred clear /
    copy-on-write runs as before (a cleared slot ends zero with an empty ring, a copy-on-write
    destination is overwritten by its exact source). Folding first keeps the order simple: the
    clear and the copy see a pool where no row of this batch has pending records.
    """
    pool: Any = getattr(runner, "req_to_token_pool", None)
    view = ring_pool(getattr(pool, "mamba_pool", None))
    indices = getattr(forward_batch, "req_pool_indices", None)
    if (
        view is not None
        and indices is not None
        and hasattr(pool, "get_mamba_indices")
        and _reads_extend_state(runner, forward_batch)
    ):
        fold = rows_may_hold_records(runner, forward_batch)
        if fold or getattr(view.pool, "debug_memory_pool", False):
            slots = pool.translate_mamba_indices(pool.get_mamba_indices(indices))
            if fold:
                view.fold(slots)
            else:
                _check_no_records(view, slots)
    original(runner, forward_batch)


def cpu_copy_exact(original: Any, mamba_pool: Any, indices: torch.Tensor) -> Any:
    """``MambaPool.get_cpu_copy`` whose ``temporal`` is the full state of each slot.

    SGLang's copy (conv, temporal, siblings) runs unchanged; when a slot has pending records, the
    returned temporal is replaced by ``checkpoint + records`` computed on the device from gathered
    copies of the slot's checkpoint and ring. The live slot (checkpoint, ring, cursor) is not
    modified, so a copy taken of a request that keeps decoding is harmless. On a CPU pool the copy
    is made to own its memory (SGLang's would alias the slot there).
    """
    result = original(mamba_pool, indices)
    view = ring_pool(mamba_pool)
    if view is None:
        return result
    items = list(result)
    if view.temporal.device.type == "cpu":
        # On a CPU pool SGLang's ``.to("cpu")`` is a no-op, and a 0-d slot index (what
        # ``HybridLinearKVPool.get_cpu_copy`` passes) selects a view: the "backup" would alias the
        # live slot and change when the slot is reused. Own the memory of the copy.
        items[0] = [c.clone() for c in items[0]]
        items[1] = items[1].clone()
    folded = view.folded_temporal(indices)
    if folded is not None:
        items[1] = folded.to("cpu")
    return tuple(items)
