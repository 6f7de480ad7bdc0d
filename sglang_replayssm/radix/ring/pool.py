"""One view of a ``MambaPool`` that runs the ReplaySSM decode ring: its tensors, cursor, kind, folds.

A decode-ring slot's state is ``checkpoint (temporal[slot]) folded with its first write_pos[slot]
ring records``; ``conv[slot]`` is always current. SGLang 0.5.23's pool holds (layer dim first):

* ``temporal``: ``[layers, slots, HV, V, K]`` checkpoints;
* ring ``d``: ``[layers, slots, HV, L, V]``, ``k``: ``[layers, slots, H, L, K]``, ``g`` (fp32):
  ``[layers, slots, HV, L]`` (GDN) or ``[layers, slots, HV, L, K]`` (KDA);
* ``write_pos``: int32 ``[slots]`` cursors (the record count of each slot's ring).

With rings keyed by request row (``SGLANG_REPLAYSSM_RING_ROWS``, :mod:`.rows`) the ring tensors hold
``rows`` (the req-to-token pool's rows) instead of ``slots`` in their second dim, and ``RingPool.rows``
(int32 ``[slots]``) maps a slot to the ring row of the request decoding into it; every fold reads a
slot's records there. The cursor stays per slot.

Slot 0 is SGLang's reserved padding slot (never handed to a request, its ring never live); ``-1``
marks padding / empty rows in index tensors. :func:`ring_pool` is the one test of "is this a
decode-ring pool": the spec-verify ring (``enable_linear_replayssm`` off, its own cursors), pools
without ReplaySSM and the unified pool are never viewed, so no radix module touches them. Every
operation runs on the pool's device without host syncs unless it says otherwise.

A feature that keeps its own copy of each checkpoint (the read copy, radix/read_copy/) installs its
:class:`~sglang_replayssm.strategies.CheckpointCopies` (:func:`use_checkpoint_copies`, when it attaches to a pool); the folds
and the ring decode binding consult it, and import no feature.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from sglang_replayssm.kernels.materialize import materialize
from sglang_replayssm.state import peek
from sglang_replayssm.strategies import STRATEGIES, CheckpointCopies

__all__ = ["RingPool", "empty_rings", "ring_pool", "ring_pool_of"]


def empty_rings(write_pos: torch.Tensor | None, slots: torch.Tensor | None) -> None:
    """``write_pos[slots] = 0`` on the device (an empty ring); slots < 0 (padding) are skipped.

    ``slots`` may be any shape (0-d, ``[n]``, ``[n, 1]``); None or empty is a no-op.
    """
    if write_pos is None or slots is None:
        return
    flat = slots.reshape(-1)
    if flat.numel() == 0:
        return
    # -1 sentinels would index the last slot; send them to the reserved padding slot 0,
    # whose ring is never live (padded decode rows read and write nothing there).
    write_pos.index_fill_(0, flat.to(device=write_pos.device, dtype=torch.long).clamp(min=0), 0)


def use_checkpoint_copies(copies: CheckpointCopies) -> None:
    """Install the checkpoint copies the folds and the ring decode consult (idempotent;
    ``STRATEGIES.checkpoint_copies``)."""
    STRATEGIES.checkpoint_copies = copies


def checkpoint_copies() -> CheckpointCopies | None:
    """The installed checkpoint copies, or None."""
    return STRATEGIES.checkpoint_copies


@dataclass(frozen=True)
class RingPool:
    """A decode-ring ``MambaPool`` (``pool``) with its ring tensors and cursor (shapes: module doc)."""

    pool: Any
    write_pos: torch.Tensor
    d: torch.Tensor
    k: torch.Tensor
    g: torch.Tensor
    rows: torch.Tensor | None = None

    @property
    def temporal(self) -> torch.Tensor:
        return self.pool.mamba_cache.temporal

    @property
    def is_kda(self) -> bool:
        """KDA stores a per-channel gate ring (5-d ``g``). Read from the shape, not from
        ``replayssm_is_kda``, which the ``kda_force_flush`` fix lowers around the decode metadata."""
        return self.g.dim() == 5

    @property
    def read_copy(self) -> tuple[Any, bool]:
        """``(the pool's read copy or None, whether folds replay its raw records)``: a pool with a
        read copy (radix/read_copy/store.py) keeps copy-based deltas in its own ``d`` ring, so its folds
        replay ``k, g, v, beta`` from the checkpoint (the ``read_copy_exact_fold`` fix; off: fold ``d~``).
        ``(None, False)`` while no :class:`CheckpointCopies` is installed."""
        copies = STRATEGIES.checkpoint_copies
        if copies is None:
            return None, False
        return copies.copy_of(self.pool), copies.exact_fold()

    def index(self, slots: Any) -> torch.Tensor:
        """``slots`` (any shape, tensor or int) as a flat long tensor on the pool's device."""
        return torch.as_tensor(slots).reshape(-1).to(device=self.write_pos.device, dtype=torch.long)

    def counts(self, flat: torch.Tensor) -> torch.Tensor:
        """Pending record counts of the flat long slots (a -1 row reads the padding slot 0's)."""
        return self.write_pos[flat.clamp(min=0)].to(torch.long)

    def ring_rows(self, flat: torch.Tensor) -> torch.Tensor | None:
        """The ring row of each flat long slot (``rows[slot]``; a -1 row reads slot 0's), or None
        with one ring per slot."""
        return None if self.rows is None else self.rows[flat.clamp(min=0)].to(torch.long)

    def materialize(
        self, src: torch.Tensor, dst: torch.Tensor, counts: torch.Tensor, *, layers: slice | None = None
    ) -> None:
        """``temporal[:, dst[i]] = temporal[:, src[i]] folded with its first counts[i] ring records``.

        Rows with ``src < 0``, ``dst < 0`` or ``counts == 0`` are skipped (the caller already copied
        those). Sources are read-only; ``dst == src`` folds in place; cursors are not touched.
        ``layers`` restricts the fold to a slice of the leading layer dim.
        """
        src = src.reshape(-1).to(torch.long)
        if src.numel() == 0:
            return
        dst = dst.reshape(-1).to(device=src.device, dtype=torch.long)
        cnt = counts.reshape(-1).to(device=src.device, dtype=torch.long)
        src = torch.where((cnt <= 0) | (dst < 0), torch.full_like(src, -1), src)
        temporal, d, k, g = self.temporal, self.d, self.k, self.g
        if layers is not None:
            temporal, d, k, g = temporal[layers], d[layers], k[layers], g[layers]
        rc, exact = self.read_copy
        copies = STRATEGIES.checkpoint_copies
        if rc is not None and copies is not None:  # the destinations' checkpoints are rewritten: copies stale
            copies.mark_stale(rc, dst)
            if exact:  # copy-based deltas in the ring: replay the raw records (radix/read_copy/store.py)
                copies.replay_into(rc, temporal, k, g, src, dst, cnt, is_kda=self.is_kda, layers=layers)
                return
            d = (rc.d if layers is None else rc.d[layers]).to(temporal.dtype)  # exact fold off: fold d~
        # Host-side index validation would sync the device on every copy; rows built here satisfy
        # it (distinct destinations from SGLang's allocator, skipped rows marked -1): CPU only.
        materialize(temporal, d, k, g, src, dst, cnt, is_kda=self.is_kda, check_values=not temporal.is_cuda,
                    ring_src=self.ring_rows(src))

    def fold(self, slots: Any) -> None:
        """Fold each live slot's pending records into its own checkpoint and empty its ring.

        Afterwards ``temporal[slot]`` is the slot's state and ``write_pos[slot] == 0``. Entries
        ``<= 0`` (the padding slot 0, -1 sentinels) are left alone; live slots must be pairwise
        distinct and no longer read by a running decode row.
        """
        flat = self.index(slots)
        if flat.numel() == 0:
            return
        live = flat > 0
        flat = torch.where(live, flat, torch.full_like(flat, -1))
        self.materialize(flat, flat, torch.where(live, self.counts(flat), torch.zeros_like(flat)))
        # Zero the live slots' cursors; rows left alone write slot 0's own cursor back to it.
        idx = flat.clamp(min=0)
        wp = self.write_pos
        wp[idx] = torch.where(live, torch.zeros_like(idx), wp[idx].to(torch.long)).to(wp.dtype)

    def folded_temporal(self, indices: Any) -> torch.Tensor | None:
        """A copy of ``temporal[:, indices]`` with each live slot's pending records folded in, or
        None when no slot has records. The live slots are not modified. One host read of the
        cursors (for callers that synchronise anyway, e.g. a CPU backup)."""
        flat = self.index(indices)
        if flat.numel() == 0:
            return None
        counts = torch.where(flat > 0, self.counts(flat), torch.zeros_like(flat))
        if not bool((counts > 0).any().item()):
            return None
        idx = flat.clamp(min=0)
        temporal = self.temporal[:, idx].clone()
        rows = torch.arange(flat.numel(), device=flat.device, dtype=torch.long)
        ring = self.ring_rows(idx)
        d, k, g = (t[:, idx if ring is None else ring].contiguous() for t in (self.d, self.k, self.g))
        rc, exact = self.read_copy
        copies = STRATEGIES.checkpoint_copies
        if rc is not None and exact and copies is not None:  # exact replay of the raw records, into the copy only
            copies.replay_into(copies.gathered(rc, idx), temporal, k, g, rows, rows, counts, is_kda=self.is_kda)
        else:
            if rc is not None:  # read_copy_exact_fold off: the copy-based deltas
                d = rc.d[:, idx].to(temporal.dtype).contiguous()
            materialize(temporal, d, k, g, rows, rows, counts, is_kda=self.is_kda)
        return temporal.reshape(self.temporal[:, torch.as_tensor(indices)].shape)

    def empty(self, slots: Any) -> None:
        """Empty the rings of ``slots`` (cursor 0); see :func:`empty_rings`."""
        empty_rings(self.write_pos, torch.as_tensor(slots))


def ring_pool(mamba_pool: Any) -> RingPool | None:
    """The decode-ring view of ``mamba_pool``, or None when it runs no decode ring (None, no
    ``--enable-linear-replayssm``, no cursor tensor, e.g. hidden by the metadata hook, or no rings)."""
    if mamba_pool is None or not getattr(mamba_pool, "enable_linear_replayssm", False):
        return None
    write_pos = getattr(mamba_pool, "replayssm_write_pos", None)
    cache = getattr(mamba_pool, "mamba_cache", None)
    if write_pos is None or cache is None:
        return None
    d, k, g = (getattr(cache, name, None) for name in ("replayssm_d", "replayssm_k", "replayssm_g"))
    if d is None or k is None or g is None:
        return None
    state = peek(mamba_pool)
    return RingPool(mamba_pool, write_pos, d, k, g, None if state is None else state.ring_rows)


def ring_pool_of(owner: Any) -> RingPool | None:
    """The decode-ring view of ``owner.req_to_token_pool.mamba_pool`` (a backend, model runner)."""
    return ring_pool(getattr(getattr(owner, "req_to_token_pool", None), "mamba_pool", None))
