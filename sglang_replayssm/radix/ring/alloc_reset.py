"""The one choke point for ReplaySSM ring cursors: a mamba slot enters use with an empty ring.

SGLang 0.5.23 keeps one int32 cursor per persistent mamba slot (``MambaPool.replayssm_write_pos``);
``temporal[slot]`` is the slot's state only when its cursor is 0, otherwise the state is the
checkpoint folded with the first ``write_pos`` ring records. SGLang zeroes the cursor on only some
of the paths that hand a slot to a new owner, so a slot reused through
another path (copy-on-write destination, ping-pong track slot, HiCache load-back, int8 load)
inherits the previous owner's cursor and its first decode folds that owner's records.

Invariant maintained here: every slot returned by the pool's ``MambaSlotAllocator.alloc`` has
``write_pos == 0`` (an empty ring), and so has every slot an int8 checkpoint is loaded into. Since
every path that gives a slot a new owner allocates it first, no path can read another owner's
records. The reset is a device-side ``index_fill_`` (no host sync), the same cost as SGLang's own
reset in ``HybridReqToTokenPool.alloc``.
"""

from __future__ import annotations

from typing import Any

import torch

from sglang_replayssm.radix.ring.pool import empty_rings, ring_pool
from sglang_replayssm.state import peek, state_of

__all__ = ["empty_allocated", "empty_loaded", "link_allocator", "linked_write_pos"]

#: Attribute set on a ``MambaSlotAllocator`` that hands out slots of a ReplaySSM-decode pool.


def link_allocator(req_to_token_pool: Any) -> None:
    """Tell ``req_to_token_pool.mamba_allocator`` which cursor tensor its slots index.

    Called after ``HybridReqToTokenPool._init_mamba_pool`` (which also runs for draft clones);
    links ``None`` without the decode ring (the spec-verify ring owns its cursors), which makes the
    allocator hook a no-op.
    """
    allocator = getattr(req_to_token_pool, "mamba_allocator", None)
    mamba_pool = getattr(req_to_token_pool, "mamba_pool", None)
    if allocator is None or mamba_pool is None:
        return
    view = ring_pool(mamba_pool)
    state_of(allocator).write_pos = None if view is None else view.write_pos


def linked_write_pos(allocator: Any) -> torch.Tensor | None:
    """The cursor tensor linked by :func:`link_allocator`, or None."""
    state = peek(allocator)
    return None if state is None else state.write_pos


def empty_allocated(allocator: Any, slots: torch.Tensor | None) -> None:
    """After ``MambaSlotAllocator.alloc``: the handed-out slots start with an empty ring."""
    empty_rings(linked_write_pos(allocator), slots)


def empty_loaded(mamba_pool: Any, slots: Any) -> None:
    """After a full state (int8 checkpoint, CPU backup) is loaded into ``slots``: no pending records."""
    view = ring_pool(mamba_pool)
    if view is not None:
        view.empty(slots)
