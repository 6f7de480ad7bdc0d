"""A first-in-first-out map from keys (KV indices) to slots, kept on the device: the record pool's and the interval
states' bookkeeping.

``index [K + 1]`` int64: the slot of key ``k``, or -1; ``index[K]`` is a sink that stays -1.
``owner [C + 1]`` int64: the key slot ``s`` was last given to, or ``K`` (the sink) for a slot never given.
``iota [C]``: ``arange(C)`` (slot numbers, sliced instead of computed per call).

Invariant: ``index[k] == s >= 0`` only if :func:`assign` gave ``s`` to ``k`` and no later call gave ``s`` to another
key. A key whose slot is taken loses it only if it still holds that slot (a key invalidated and given another slot
since keeps the new one).
"""

from __future__ import annotations

import torch

__all__ = ["assign", "unassigned_owner"]


def unassigned_owner(capacity: int, kv_size: int, device: torch.device) -> torch.Tensor:
    """``owner`` of a map with no slot given: every entry the index's sink ``kv_size``."""
    return torch.full((capacity + 1,), kv_size, dtype=torch.int64, device=device)


def assign(index: torch.Tensor, owner: torch.Tensor, iota: torch.Tensor, head: int, keys: torch.Tensor) -> int:
    """Give ``keys [n]`` (distinct, ``0 < n <= C``) the slots ``head, head + 1, ...`` (mod ``C``), taking them
    from the keys that held them; returns the next head. Six launches where the slots do not wrap, no host
    sync."""
    capacity, n, sink = iota.numel(), keys.numel(), index.numel() - 1
    end = head + n
    if end <= capacity:
        slots, old = iota[head:end], owner[head:end]
    else:
        slots = torch.cat((iota[head:], iota[:end - capacity]))
        old = owner[slots]
    lost = index[old] != slots  # keys that no longer hold their old slot (and the sink) keep what they hold
    index.index_fill_(0, old.masked_fill(lost, sink), -1)  # the sink absorbs them
    index.index_copy_(0, keys, slots)
    if end <= capacity:
        owner[head:end].copy_(keys)
    else:
        owner.index_copy_(0, slots, keys)
    return end % capacity
