"""The decode-metadata hooks: KDA force flush and the device cursor, in one fixed order.

SGLang 0.5.23 builds the decode metadata in ``MambaAttnBackendBase._forward_metadata`` (eager) and
``init_forward_metadata_out_graph`` -> ``_replay_metadata`` (CUDA-graph replay). With the decode
ring it there snapshots the per-slot cursors ``MambaPool.replayssm_write_pos``, builds the
forced-flush mask ``seq_lens % mamba_track_interval == 0`` from the host ``seq_lens_cpu`` (one H2D
copy) and scatters the next cursors with boolean-mask indexing and ``torch.unique`` (device->host
syncs on every decode step). One hook wraps each of the two entry points and applies two fixes,
each behind its own switch, always in this order:

1. ``kda_force_flush`` (outer). SGLang skips the force flush when ``mamba_pool.replayssm_is_kda``
   is set, so a KDA track snapshot copies a checkpoint that lags by up to L-1 tokens. For the
   duration of the metadata call the pool reports ``replayssm_is_kda = False``; inside the
   metadata the flag gates nothing but the force-flush mask (the kernel's gate layout comes from
   the layer), so KDA is force-flushed exactly like GDN, on the steps the track snapshot is taken
   (``track_grid`` is a multiple of ``mamba_track_interval``). Every other reader of the flag (spec
   paths) sees the true value.
2. ``device_cursor`` (inner). SGLang's metadata runs with the pool reporting no cursor tensor
   (``replayssm_write_pos = None``), so it builds everything else (slot indices, query_start_loc,
   track buffers, the per-bs static cursor buffers it hands to the kernel) and skips its own
   snapshot and advance. Then :func:`sglang_replayssm.kernels.cursor.cursor_step` does snapshot,
   mask and advance on the device from the device ``seq_lens``:

   * eager decode/idle: ``replayssm_write_pos`` = a fresh int32 snapshot; ``replayssm_force_flush``
     = int32 ``seq_lens % mamba_track_interval == 0`` when SGLang would force-flush (GDN, or KDA
     with the flag lowered by step 1; all zeros when the batch carries no host lengths, as SGLang
     does), else None (SGLang's KDA);
   * CUDA-graph replay: the same values written into SGLang's per-bs static buffers (the objects
     the captured kernels read), the mask buffer zeroed where SGLang zeroes it; during capture and
     for non-decode replays only the snapshot is refreshed and nothing advances, as in SGLang.

Values, dtypes, the pool cursor afterwards and the tensors handed to the kernels are SGLang's.
Rows sharing a slot must agree (SGLang's own assumption: only padding shares slot 0); disagreeing
rows get the smaller next cursor (see ``kernels/cursor.py``) where SGLang's winner is arbitrary.
Other readers of ``write_pos`` during decode (the track snapshot, finish donation, copy-on-write)
run after the metadata and see the same advanced cursor as with SGLang's advance.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

import torch

from sglang_replayssm.kernels.cursor import cursor_step
from sglang_replayssm.radix import config
from sglang_replayssm.radix.ring.pool import RingPool, ring_pool_of

__all__ = [
    "cursor_hidden",
    "device_forward_metadata",
    "device_out_graph_metadata",
    "force_flush_on",
    "forward_metadata",
    "kda_flag_lowered",
    "out_graph_metadata",
]


@contextmanager
def kda_flag_lowered(view: RingPool | None) -> Iterator[None]:
    """Within the block a KDA decode-ring pool reports ``replayssm_is_kda = False`` (always restored)."""
    pool = None if view is None else view.pool
    if pool is None or not getattr(pool, "replayssm_is_kda", False):
        yield
        return
    pool.replayssm_is_kda = False
    try:
        yield
    finally:
        pool.replayssm_is_kda = True


@contextmanager
def cursor_hidden(view: RingPool) -> Iterator[torch.Tensor]:
    """Within the block the pool reports ``replayssm_write_pos = None`` (SGLang's metadata then
    neither snapshots nor advances); yields the real cursor tensor and always restores it."""
    pool = view.pool
    pool.replayssm_write_pos = None
    try:
        yield view.write_pos
    finally:
        pool.replayssm_write_pos = view.write_pos


def force_flush_on(view: RingPool) -> bool:
    """Whether SGLang's decode metadata force-flushes this pool's rows at track boundaries: unless
    ``replayssm_is_kda``, which :func:`kda_flag_lowered` lowers while the fix is on."""
    return not getattr(view.pool, "replayssm_is_kda", False)


def _track_interval() -> int:
    """``mamba_track_interval`` as SGLang's ``_replayssm_track_flush_mask`` reads it (through the
    backend module's ``get_exec``, so a patched one is honoured)."""
    from sglang.srt.layers.attention import hybrid_linear_attn_backend as backend_module

    return int(backend_module.get_exec().mamba.mamba_track_interval)


def _device_seq_lens(forward_batch: Any, device: torch.device) -> torch.Tensor | None:
    """The batch's sequence lengths on ``device``: the device tensor ``seq_lens`` when the batch has
    one (a real ForwardBatch / graph replay view always does), else ``seq_lens_cpu`` copied over."""
    seq_lens = getattr(forward_batch, "seq_lens", None)
    if not isinstance(seq_lens, torch.Tensor):
        seq_lens = getattr(forward_batch, "seq_lens_cpu", None)
    if seq_lens is None:
        return None
    return seq_lens.to(device, non_blocking=True)


def _split_forward_batch(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return args[0] if args else kwargs["forward_batch"]


def _with_both_fixes(
    device_path: Callable[..., Any], original: Callable[..., Any], backend: Any, *args: Any, **kwargs: Any
) -> Any:
    """SGLang's metadata function with the KDA flag lowered (``kda_force_flush``, outer) and run
    through ``device_path`` (``device_cursor``, inner), each only while its fix is on."""
    lowered = kda_flag_lowered(ring_pool_of(backend)) if config.enabled("kda_force_flush") else nullcontext()
    with lowered:
        if config.enabled("device_cursor"):
            return device_path(original, backend, *args, **kwargs)
        return original(backend, *args, **kwargs)


def forward_metadata(original: Callable[..., Any], backend: Any, *args: Any, **kwargs: Any) -> Any:
    """Eager decode metadata (``_forward_metadata``) with both fixes, in the module's order."""
    return _with_both_fixes(device_forward_metadata, original, backend, *args, **kwargs)


def out_graph_metadata(original: Callable[..., Any], backend: Any, *args: Any, **kwargs: Any) -> Any:
    """CUDA-graph metadata (``init_forward_metadata_out_graph``) with both fixes, in the module's order."""
    return _with_both_fixes(device_out_graph_metadata, original, backend, *args, **kwargs)


def device_forward_metadata(original: Callable[..., Any], backend: Any, *args: Any, **kwargs: Any) -> Any:
    """Eager decode metadata (``_forward_metadata``) with the cursor advanced on the device."""
    view = ring_pool_of(backend)
    forward_batch = _split_forward_batch(args, kwargs)
    mode = getattr(forward_batch, "logical_forward_mode", None)
    if view is None or mode is None or not mode.is_decode_or_idle():
        return original(backend, *args, **kwargs)
    with cursor_hidden(view) as write_pos:
        metadata = original(backend, *args, **kwargs)
    slots = metadata.mamba_cache_indices
    seq_lens = interval = None
    flush = force_flush_on(view)
    if flush and getattr(forward_batch, "seq_lens_cpu", None) is not None:
        seq_lens = _device_seq_lens(forward_batch, write_pos.device)
        interval = _track_interval() if seq_lens is not None else None
    wp, ff = cursor_step(
        write_pos, slots, view.pool.linear_replayssm_cache_len, seq_lens=seq_lens, track_interval=interval
    )
    if flush and ff is None:  # SGLang's "no host lengths: never flush" mask
        ff = torch.zeros(slots.shape[0], dtype=torch.int32, device=write_pos.device)
    metadata.replayssm_write_pos = wp
    metadata.replayssm_force_flush = ff
    return metadata


def device_out_graph_metadata(original: Callable[..., Any], backend: Any, *args: Any, **kwargs: Any) -> Any:
    """CUDA-graph metadata (``init_forward_metadata_out_graph`` -> ``_replay_metadata``) with the
    static cursor / flush buffers refreshed and the cursor advanced on the device."""
    view = ring_pool_of(backend)
    if view is None or getattr(backend, "replayssm_write_pos_list", None) is None:
        return original(backend, *args, **kwargs)
    forward_batch = _split_forward_batch(args, kwargs)
    in_capture = bool(args[1]) if len(args) > 1 else bool(kwargs.get("in_capture", False))
    with cursor_hidden(view) as write_pos:
        result = original(backend, *args, **kwargs)
    metadata = backend.forward_metadata
    static_wp = getattr(metadata, "replayssm_write_pos", None)
    static_ff = getattr(metadata, "replayssm_force_flush", None)
    if static_wp is None or static_ff is None:
        return result
    slots = metadata.mamba_cache_indices
    if in_capture or not forward_batch.forward_mode.is_decode_or_idle():
        # Refresh the snapshot only: capture must not move real cursors, verify never does.
        static_wp.copy_(write_pos.index_select(0, slots.to(torch.long).clamp(min=0)))
        static_ff.zero_()
        return result
    seq_lens = None
    if force_flush_on(view) and getattr(forward_batch, "seq_lens_cpu", None) is not None:
        seq_lens = _device_seq_lens(forward_batch, write_pos.device)
    if seq_lens is None:
        static_ff.zero_()
    cursor_step(
        write_pos,
        slots,
        view.pool.linear_replayssm_cache_len,
        seq_lens=seq_lens,
        track_interval=_track_interval() if seq_lens is not None else None,
        wp_out=static_wp,
        ff_out=static_ff if seq_lens is not None else None,
    )
    return result
