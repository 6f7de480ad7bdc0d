"""The one choke point for ReplaySSM ring cursors: a mamba slot enters use with an empty ring.

SGLang 0.5.23 keeps one int32 cursor per persistent mamba slot (``MambaPool.replayssm_write_pos``);
``temporal[slot]`` is the slot's state only when its cursor is 0, otherwise the state is the
checkpoint folded with the first ``write_pos`` ring records. SGLang zeroes the cursor on only some
of the paths that hand a slot to a new owner (integration map section 1), so a slot reused through
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

__all__ = ["WRITE_POS_ATTR", "link_allocator", "linked_write_pos", "reset_cursors"]

#: Attribute set on a ``MambaSlotAllocator`` that hands out slots of a ReplaySSM-decode pool.
WRITE_POS_ATTR = "_replayssm_write_pos"


def link_allocator(req_to_token_pool: Any) -> None:
    """Tell ``req_to_token_pool.mamba_allocator`` which cursor tensor its slots index.

    Called after ``HybridReqToTokenPool._init_mamba_pool`` (which also runs for draft clones);
    links ``None`` when the decode ring is off, which makes the allocator hook a no-op.
    """
    allocator = getattr(req_to_token_pool, "mamba_allocator", None)
    mamba_pool = getattr(req_to_token_pool, "mamba_pool", None)
    if allocator is None or mamba_pool is None:
        return
    write_pos = getattr(mamba_pool, "replayssm_write_pos", None)
    if write_pos is not None and not getattr(mamba_pool, "enable_linear_replayssm", False):
        write_pos = None  # the spec-verify ring owns its cursors; not ours to touch
    setattr(allocator, WRITE_POS_ATTR, write_pos)


def linked_write_pos(allocator: Any) -> torch.Tensor | None:
    """The cursor tensor linked by :func:`link_allocator`, or None."""
    return getattr(allocator, WRITE_POS_ATTR, None)


def reset_cursors(write_pos: torch.Tensor | None, slots: torch.Tensor | None) -> None:
    """``write_pos[slots] = 0`` on the device; slots < 0 (padding / empty ping-pong) are skipped.

    ``slots`` may be any shape (0-d, ``[n]``, ``[n, 1]``); None or empty is a no-op.
    """
    if write_pos is None or slots is None:
        return
    flat = slots.reshape(-1)
    if flat.numel() == 0:
        return
    flat = flat.to(device=write_pos.device, dtype=torch.long)
    # -1 sentinels would index the last slot; send them to the reserved padding slot 0,
    # whose ring is never live (padded decode rows read and write nothing there).
    flat = flat.clamp(min=0)
    write_pos.index_fill_(0, flat, 0)
