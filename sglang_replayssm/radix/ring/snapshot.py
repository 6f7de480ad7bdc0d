"""Exact snapshots of ReplaySSM slots without disturbing the live ring.

A decode-ring slot's state is ``checkpoint (temporal[slot]) folded with its first write_pos
ring records``; ``conv[slot]`` is always current (updated every step). SGLang copies only
``temporal`` when it snapshots a working slot (copy-on-write / checkpoint ``copy_from``, the
extra_buffer decode track copy) and relies on the source having just flushed. Here the copy is
followed by a fold that writes ``checkpoint + records`` of the source into the
destination's ``temporal`` (:meth:`RingPool.materialize`), leaving the source (checkpoint, ring,
cursor) untouched, so the destination's ``(conv, temporal)`` both belong to the source's current depth.

Rows whose source has an empty ring are skipped (SGLang's copy already made them exact), so a
copy of a flushed slot costs nothing extra beyond reading the cursor on the device.
"""

from __future__ import annotations

from typing import Any

import torch

from sglang_replayssm.radix import config
from sglang_replayssm.radix.ring.pool import ring_pool, ring_pool_of

__all__ = ["copy_from_exact", "flush_covers_track", "track_decode_exact"]


def copy_from_exact(
    original: Any, mamba_pool: Any, src_indices: torch.Tensor, dst_indices: torch.Tensor
) -> None:
    """``MambaPool.copy_from`` whose copy is exact even when a source has pending ring records.

    SGLang's copy (conv + temporal + siblings, destination cursor reset) runs first; then sources
    with records are materialised into the destinations. SGLang asserts "source flushed" only
    under ``SGLANG_DEBUG_MEMORY_POOL``; that requirement is what this lifts, so in debug mode (where
    host syncs are already paid) the assert is skipped when, and only when, a source has records.
    """
    view = ring_pool(mamba_pool)
    if view is None:
        original(mamba_pool, src_indices, dst_indices)
        return
    src = view.index(src_indices)
    counts = view.counts(src)  # a gathered copy: SGLang's copy then resets destination cursors
    debug = getattr(mamba_pool, "debug_memory_pool", False)
    if debug and bool((counts > 0).any().item()):
        mamba_pool.debug_memory_pool = False
        try:
            original(mamba_pool, src_indices, dst_indices)
        finally:
            mamba_pool.debug_memory_pool = debug
    else:
        original(mamba_pool, src_indices, dst_indices)
    view.materialize(src, dst_indices, counts)


def track_decode_exact(
    original: Any,
    backend: Any,
    forward_batch: Any,
    conv_states: torch.Tensor,
    ssm_states: torch.Tensor,
    cache_indices: torch.Tensor,
    layer_id: int | None = None,
) -> None:
    """``MambaAttnBackendBase._track_mamba_state_decode`` whose snapshot includes pending records.

    SGLang copies ``conv`` and ``temporal`` of each tracked row's working slot into its track slot
    (once for all layers at the last mamba layer, or per layer). ``conv`` is current, but
    ``temporal`` is only the checkpoint unless the step flushed (GDN force-flushes on the track
    interval; KDA does not). After SGLang's copy this folds the working slot's records (the cursor
    already advanced for this step, so ``write_pos`` is the post-step record count) into the
    track slot, for the same layers SGLang just copied. The working slot is not modified.
    """
    original(backend, forward_batch, conv_states, ssm_states, cache_indices, layer_id)
    track_mask = getattr(forward_batch, "mamba_track_mask", None)
    metadata = getattr(backend, "forward_metadata", None)
    track_dst = getattr(metadata, "mamba_track_indices", None) if metadata is not None else None
    if track_mask is None or track_dst is None or layer_id is None:
        return
    view = ring_pool_of(backend)
    if view is None:
        return
    layer_idx = backend.req_to_token_pool.mamba_map.get(layer_id)
    if layer_idx is None:
        return
    pools = backend._track_pools()
    if pools is not None:
        if layer_idx != pools[2]:
            return  # SGLang copies all layers at the last mamba layer; do the same
        layers = None
    else:
        layers = slice(layer_idx, layer_idx + 1)
    covered = flush_covers_track(view, forward_batch)
    debug = bool(getattr(view.pool, "debug_memory_pool", False))
    if covered and not debug:
        return  # before any tensor op: nothing of the fold is launched (or captured)
    bs = int(forward_batch.batch_size)
    src, dst = view.index(cache_indices[:bs]), view.index(track_dst[:bs])
    mask = track_mask[:bs].reshape(-1).to(device=src.device, dtype=torch.bool)
    counts = view.counts(src)
    if covered:  # debug memory pool: check the claim (a host sync, as SGLang's own debug checks)
        if bool((mask & (src >= 0) & (counts > 0)).any()):
            raise AssertionError("sglang-replayssm: a tracked decode row kept ring records after its force flush")
        return
    src = torch.where(mask & (src >= 0), src, torch.full_like(src, -1))
    view.materialize(src, dst, counts, layers=layers)


def flush_covers_track(view: Any, forward_batch: Any) -> bool:
    """Whether this decode step's force flush emptied the ring of every row the track snapshot copies,
    so the fold has nothing to add (fix ``track_flush_skip``). SGLang force-flushes the rows with
    ``seq_len % mamba_track_interval == 0`` (from the batch's host lengths, present on every decode
    batch) and tracks those with ``seq_len % track_grid == 0``, a multiple of the interval: a subset.
    It skips the flush for KDA unless ``kda_force_flush`` lowers the flag around the metadata."""
    if not config.enabled("track_flush_skip"):
        return False
    if getattr(forward_batch, "seq_lens_cpu", None) is None:
        return False  # no host lengths: SGLang's mask is all zeros, nothing was flushed
    mode = getattr(forward_batch, "forward_mode", None)
    if mode is None or not mode.is_decode_or_idle():
        return False
    return not view.is_kda or config.enabled("kda_force_flush")
