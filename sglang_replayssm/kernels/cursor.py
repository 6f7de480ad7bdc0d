"""Device-side ReplaySSM ring cursor: snapshot, forced-flush mask and advance, with no host sync.

SGLang 0.5.23 advances the per-slot ring cursor ``MambaPool.replayssm_write_pos`` on the host
side of ``MambaAttnBackendBase._forward_metadata`` / ``_replay_metadata``
(``sglang/srt/layers/attention/hybrid_linear_attn_backend.py``), with boolean-mask indexing and
``torch.unique`` (each forces a device->host sync) and a forced-flush mask computed from
``seq_lens_cpu``. This module computes the same thing from device tensors only, so one decode step
(cursor step + ring decode kernels) can be captured in a CUDA graph and replayed.

Semantics, for a batch of ``B`` decode rows with persistent slots ``slots`` (``-1`` = padding):

* snapshot: ``wp[n] = write_pos_buf[max(slots[n], 0)]`` (int32, what the ring kernel reads);
* forced flush: ``ff[n] = int(seq_lens[n] % track_interval == 0)`` for ``n < len(seq_lens)``,
  ``0`` beyond (SGLang pads the host mask with False); ``None`` when force flush is off (SGLang's
  KDA path);
* next cursor of row ``n``: ``0`` if ``wp[n] == L-1`` or ``ff[n]``, else ``(wp[n] + 1) % L``;
* write-back: for every valid row (``slots[n] >= 0``) ``write_pos_buf[slots[n]] = next[n]``; rows
  sharing a slot (only padding does that in SGLang) write the *minimum* of their next values. When
  such rows agree (SGLang's stated assumption) this is exactly SGLang's result; when they disagree
  a flush wins (next 0), the only choice consistent with a checkpoint that one of them rewrote.
  Slots of no valid row are untouched.

Both implementations are deterministic, allocate only small temporaries (legal inside CUDA graph
capture) and never read a device value on the host:

* :func:`cursor_step_torch`: tensor ops only (gather, ``scatter_reduce_`` ``amin`` into a one-longer
  copy whose extra entry absorbs padded rows); runs on CPU and CUDA;
* :func:`cursor_step_triton`: one single-program Triton launch (snapshot, barrier, reset, barrier,
  ``atomic_min``); needs a device Triton can run on (or ``TRITON_INTERPRET=1``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = [
    "ROW_COUNT_ARGS",
    "cursor_step",
    "cursor_step_torch",
    "cursor_step_triton",
    "force_flush_mask",
    "next_cursor",
]

#: The kernel's per-step row counts, left unspecialized: Triton would compile apart a count of 1, one divisible by
#: 16 and any other (0.1-0.2 s each, the scheduler waiting, at a step's first new kind outside graph capture).
ROW_COUNT_ARGS = ("B", "n_seq")

_INT32_MAX = 2**31 - 1


def force_flush_mask(seq_lens: torch.Tensor, bs: int, track_interval: int) -> torch.Tensor:
    """int32 ``[bs]``: ``seq_lens[n] % track_interval == 0`` for ``n < len(seq_lens)``, 0 beyond.

    ``seq_lens`` stays on its device; nothing is copied to the host.
    """
    if track_interval <= 0:
        raise ValueError(f"track_interval must be positive (got {track_interval})")
    n = min(bs, seq_lens.shape[0])
    ff = torch.zeros(bs, dtype=torch.int32, device=seq_lens.device)
    ff[:n] = (seq_lens[:n].to(torch.int64) % track_interval == 0).to(torch.int32)
    return ff


def next_cursor(wp: torch.Tensor, ff: torch.Tensor | None, L: int) -> torch.Tensor:
    """Per-row next cursor (same dtype as ``wp``): 0 after a flush, else ``(wp + 1) % L``."""
    flushed = wp == (L - 1)
    if ff is not None:
        flushed = flushed | (ff != 0)
    return torch.where(flushed, torch.zeros_like(wp), (wp + 1) % L)


def cursor_step_torch(
    write_pos_buf: torch.Tensor,
    slots: torch.Tensor,
    L: int,
    *,
    seq_lens: torch.Tensor | None = None,
    track_interval: int | None = None,
    wp_out: torch.Tensor | None = None,
    ff_out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Snapshot the cursors of ``slots``, build the forced-flush mask and advance, with tensor ops only.

    Args:
        write_pos_buf: int32 ``[num_slots]`` per-slot cursors, advanced in place.
        slots: ``[B]`` persistent slot per decode row, ``-1`` for padding (any integer dtype).
        L: ring length (``--linear-replayssm-cache-len``).
        seq_lens: device ``[>= B]`` sequence lengths; with ``track_interval`` enables force flush.
        track_interval: ``mamba_track_interval``; ``None`` (or no ``seq_lens``) means no force flush.
        wp_out, ff_out: optional int32 ``[>= B]`` buffers (e.g. CUDA-graph static buffers) that
            receive the snapshot / mask in their first ``B`` entries.

    Returns:
        ``(wp, ff)``: int32 ``[B]`` snapshot (views of ``wp_out``/``ff_out`` when given) and the
        int32 mask, or ``None`` when force flush is off.
    """
    B = slots.shape[0]
    N = write_pos_buf.shape[0]
    slots_l = slots.to(torch.int64)
    safe = slots_l.clamp(min=0)
    wp = write_pos_buf.index_select(0, safe)
    ff = None
    if seq_lens is not None and track_interval is not None:
        ff = force_flush_mask(seq_lens, B, track_interval)
    nxt = next_cursor(wp, ff, L)
    # One extra entry absorbs padded rows, so no boolean-mask indexing is needed.
    ext = torch.cat([write_pos_buf, write_pos_buf.new_zeros(1)])
    idx = torch.where(slots_l >= 0, safe, torch.full_like(safe, N))
    ext.scatter_reduce_(0, idx, nxt.to(write_pos_buf.dtype), reduce="amin", include_self=False)
    if wp_out is not None:
        wp_out[:B].copy_(wp)
        wp = wp_out[:B]
    else:
        wp = wp.to(torch.int32)
    if ff is not None and ff_out is not None:
        ff_out[:B].copy_(ff)
        ff = ff_out[:B]
    write_pos_buf.copy_(ext[:N])
    return wp, ff


@triton.jit(do_not_specialize=ROW_COUNT_ARGS)
def _cursor_step_kernel(
    buf,
    slots,
    seq_lens,
    wp_out,
    ff_out,
    B,
    n_seq,
    track_interval,
    L: tl.constexpr,
    HAS_FF: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """Single program. Phase 1 snapshots every row, phase 2 resets the rows' slots to INT32_MAX,
    phase 3 ``atomic_min``s the next cursors in. Barriers order the phases inside the program."""
    offs = tl.arange(0, BLOCK)
    for start in range(0, B, BLOCK):
        rows = start + offs
        in_b = rows < B
        slot = tl.load(slots + rows, mask=in_b, other=-1).to(tl.int64)
        cur = tl.load(buf + tl.maximum(slot, 0), mask=in_b, other=0)
        tl.store(wp_out + rows, cur, mask=in_b)
        if HAS_FF:
            sl = tl.load(seq_lens + rows, mask=in_b & (rows < n_seq), other=1).to(tl.int64)
            ff = ((sl % track_interval) == 0) & (rows < n_seq)
            tl.store(ff_out + rows, ff.to(tl.int32), mask=in_b)
    tl.debug_barrier()
    for start in range(0, B, BLOCK):
        rows = start + offs
        in_b = rows < B
        slot = tl.load(slots + rows, mask=in_b, other=-1).to(tl.int64)
        ok = in_b & (slot >= 0)
        tl.store(buf + tl.maximum(slot, 0), tl.full([BLOCK], 2147483647, tl.int32), mask=ok)
    tl.debug_barrier()
    for start in range(0, B, BLOCK):
        rows = start + offs
        in_b = rows < B
        slot = tl.load(slots + rows, mask=in_b, other=-1).to(tl.int64)
        ok = in_b & (slot >= 0)
        cur = tl.load(wp_out + rows, mask=in_b, other=0)
        flushed = cur == L - 1
        if HAS_FF:
            flushed = flushed | (tl.load(ff_out + rows, mask=in_b, other=0) != 0)
        nxt = tl.where(flushed, 0, (cur + 1) % L).to(tl.int32)
        tl.atomic_min(buf + tl.maximum(slot, 0), nxt, mask=ok)


def cursor_step_triton(
    write_pos_buf: torch.Tensor,
    slots: torch.Tensor,
    L: int,
    *,
    seq_lens: torch.Tensor | None = None,
    track_interval: int | None = None,
    wp_out: torch.Tensor | None = None,
    ff_out: torch.Tensor | None = None,
    block: int = 256,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Same contract as :func:`cursor_step_torch`, as one single-program Triton launch.

    ``write_pos_buf`` must be int32 and contiguous; ``slots`` int32 or int64 contiguous.
    """
    if write_pos_buf.dtype != torch.int32 or not write_pos_buf.is_contiguous():
        raise ValueError("write_pos_buf must be a contiguous int32 tensor")
    B = slots.shape[0]
    dev = write_pos_buf.device
    wp = wp_out if wp_out is not None else torch.empty(B, dtype=torch.int32, device=dev)
    lens = seq_lens if track_interval is not None else None  # the force-flush mask's input, if any
    interval = int(track_interval) if track_interval is not None else 1
    if lens is not None and interval <= 0:
        raise ValueError(f"track_interval must be positive (got {track_interval})")
    ff = None
    if lens is not None:
        ff = ff_out if ff_out is not None else torch.empty(B, dtype=torch.int32, device=dev)
    if B == 0:
        return wp[:0], (ff[:0] if ff is not None else None)
    _cursor_step_kernel[(1,)](
        write_pos_buf, slots.contiguous(), lens if lens is not None else slots, wp, ff if ff is not None else wp,
        B, lens.shape[0] if lens is not None else 0, interval if lens is not None else 1,
        L=L, HAS_FF=lens is not None, BLOCK=block, num_warps=4,
    )  # fmt: skip
    return wp[:B], (ff[:B] if ff is not None else None)


def cursor_step(
    write_pos_buf: torch.Tensor,
    slots: torch.Tensor,
    L: int,
    *,
    seq_lens: torch.Tensor | None = None,
    track_interval: int | None = None,
    wp_out: torch.Tensor | None = None,
    ff_out: torch.Tensor | None = None,
    impl: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Dispatch: ``impl="triton"`` on CUDA by default, ``"torch"`` elsewhere. Same contract as
    :func:`cursor_step_torch`."""
    if impl == "auto":
        impl = "triton" if write_pos_buf.is_cuda else "torch"
    fn = cursor_step_triton if impl == "triton" else cursor_step_torch
    return fn(
        write_pos_buf, slots, L, seq_lens=seq_lens, track_interval=track_interval, wp_out=wp_out, ff_out=ff_out
    )
