"""Exact snapshots of ReplaySSM slots without disturbing the live ring.

A decode-ring slot's state is ``checkpoint (temporal[slot]) folded with its first write_pos
ring records``; ``conv[slot]`` is always current (updated every step). SGLang copies only
``temporal`` when it snapshots a working slot (copy-on-write / checkpoint ``copy_from``, the
extra_buffer decode track copy) and relies on the source having just flushed. Here the copy is
followed by :func:`materialize_rows`, which writes ``checkpoint + records`` of the source into the
destination's ``temporal``, leaving the source (checkpoint, ring, cursor) untouched, so the
destination's ``(conv, temporal)`` both belong to the source's current depth.

Rows whose source has an empty ring are skipped (SGLang's copy already made them exact), so a
copy of a flushed slot costs nothing extra beyond reading the cursor on the device.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["fold_in_place", "is_kda_pool", "materialize_rows", "ring_tensors"]


def ring_tensors(mamba_pool: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """``(replayssm_d, replayssm_k, replayssm_g)`` of a decode-ring pool, else None."""
    if getattr(mamba_pool, "replayssm_write_pos", None) is None:
        return None
    if not getattr(mamba_pool, "enable_linear_replayssm", False):
        return None
    cache = mamba_pool.mamba_cache
    if cache.replayssm_d is None or cache.replayssm_k is None or cache.replayssm_g is None:
        return None
    return cache.replayssm_d, cache.replayssm_k, cache.replayssm_g


def is_kda_pool(mamba_pool: Any) -> bool:
    """KDA pools store a per-channel gate ring ``[layers, slots, HV, L, K]`` (GDN: ``[.., HV, L]``).

    Read from the ring's shape rather than ``replayssm_is_kda``, which the KDA force-flush fix
    flips around the metadata functions.
    """
    return mamba_pool.mamba_cache.replayssm_g.dim() == 5


def materialize_rows(
    mamba_pool: Any,
    src_slots: torch.Tensor,
    dst_slots: torch.Tensor,
    counts: torch.Tensor,
    *,
    layers: slice | None = None,
) -> None:
    """``temporal[:, dst[i]] = temporal[:, src[i]] folded with its first counts[i] ring records``.

    Rows with ``src < 0``, ``dst < 0`` or ``counts == 0`` are skipped (the caller already copied
    those). Sources are read-only; ``dst == src`` folds in place. ``layers`` restricts the fold to
    a slice of the pool's leading layer dim. Runs on the pool's device without host syncs.
    """
    rings = ring_tensors(mamba_pool)
    if rings is None:
        return
    src = src_slots.reshape(-1).to(torch.long)
    dst = dst_slots.reshape(-1).to(device=src.device, dtype=torch.long)
    cnt = counts.reshape(-1).to(device=src.device, dtype=torch.long)
    if src.numel() == 0:
        return
    skip = (cnt <= 0) | (dst < 0)
    src = torch.where(skip, torch.full_like(src, -1), src)
    temporal = mamba_pool.mamba_cache.temporal
    d, k, g = rings
    if layers is not None:
        temporal, d, k, g = temporal[layers], d[layers], k[layers], g[layers]
    from sglang_replayssm.kernels.materialize import materialize

    # Host-side index validation would sync the device on every copy; rows built here satisfy it
    # (distinct destinations from SGLang's allocator, skipped rows marked -1), so check on CPU only.
    materialize(
        temporal, d, k, g, src, dst, cnt, is_kda=is_kda_pool(mamba_pool), check_values=not temporal.is_cuda
    )


def fold_in_place(mamba_pool: Any, slots: torch.Tensor) -> None:
    """Fold each slot's pending records into its own checkpoint and empty its ring.

    Afterwards ``temporal[slot]`` is the slot's state and ``write_pos[slot] == 0``. Only for slots
    whose ring is no longer live (a finished request donating its working slot).
    """
    write_pos = getattr(mamba_pool, "replayssm_write_pos", None)
    if write_pos is None or ring_tensors(mamba_pool) is None:
        return
    flat = slots.reshape(-1).to(device=write_pos.device, dtype=torch.long)
    counts = write_pos[flat.clamp(min=0)]
    counts = torch.where(flat >= 0, counts, torch.zeros_like(counts))
    materialize_rows(mamba_pool, flat, flat, counts)
    write_pos.index_fill_(0, flat.clamp(min=0), 0)


def copy_from_exact(
    original: Any, mamba_pool: Any, src_indices: torch.Tensor, dst_indices: torch.Tensor
) -> None:
    """``MambaPool.copy_from`` whose copy is exact even when a source has pending ring records.

    SGLang's copy (conv + temporal + siblings, destination cursor reset) runs first; then sources
    with records are materialised into the destinations. SGLang asserts "source flushed" only
    under ``SGLANG_DEBUG_MEMORY_POOL``; that requirement is what this lifts, so in debug mode (where
    host syncs are already paid) the assert is skipped when, and only when, a source has records.
    """
    write_pos = getattr(mamba_pool, "replayssm_write_pos", None)
    if write_pos is None or ring_tensors(mamba_pool) is None:
        original(mamba_pool, src_indices, dst_indices)
        return
    src = src_indices.reshape(-1).to(device=write_pos.device, dtype=torch.long)
    counts = write_pos[src.clamp(min=0)].clone()
    debug = getattr(mamba_pool, "debug_memory_pool", False)
    if debug and bool((counts > 0).any().item()):
        mamba_pool.debug_memory_pool = False
        try:
            original(mamba_pool, src_indices, dst_indices)
        finally:
            mamba_pool.debug_memory_pool = debug
    else:
        original(mamba_pool, src_indices, dst_indices)
    materialize_rows(mamba_pool, src, dst_indices, counts)


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
    req_pool = backend.req_to_token_pool
    mamba_pool = getattr(req_pool, "mamba_pool", None)
    write_pos = getattr(mamba_pool, "replayssm_write_pos", None)
    if write_pos is None or ring_tensors(mamba_pool) is None:
        return
    layer_idx = req_pool.mamba_map.get(layer_id)
    if layer_idx is None:
        return
    pools = backend._track_pools()
    if pools is not None:
        if layer_idx != pools[2]:
            return  # SGLang copies all layers at the last mamba layer; do the same
        layers = None
    else:
        layers = slice(layer_idx, layer_idx + 1)
    bs = int(forward_batch.batch_size)
    src = cache_indices[:bs].reshape(-1).to(device=write_pos.device, dtype=torch.long)
    dst = track_dst[:bs].reshape(-1).to(device=write_pos.device, dtype=torch.long)
    mask = track_mask[:bs].reshape(-1).to(device=write_pos.device, dtype=torch.bool)
    counts = write_pos[src.clamp(min=0)]
    src = torch.where(mask & (src >= 0), src, torch.full_like(src, -1))
    materialize_rows(mamba_pool, src, dst, counts, layers=layers)
