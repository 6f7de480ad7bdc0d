"""The read copy beside the decode ring (``SGLANG_REPLAYSSM_READ_COPY=bf16|fp8``, issue 15): its
buffers, the stale marks that keep it equal to the fp32 checkpoint, the exact fold movers use.

Per decode-ring ``MambaPool`` (:func:`attach`, right after SGLang allocates the ring), layer dim
first like SGLang's ring:

* ``copy`` ``[layers, slots, HV, V, K]`` bf16, or e4m3 with ``scales`` fp32 ``[layers, slots, HV, V]``
  (:mod:`sglang_replayssm.kernels.read_copy_format`);
* ``d`` ``[layers, slots, HV, L, V]`` in the io dtype: the copy-based deltas ``d~`` of the non-flush
  steps (read only by later non-flush folds of the same window);
* ``v`` ``[layers, slots, HV, L, V]`` (io dtype) and ``beta`` ``[layers, slots, HV, L]`` fp32: the raw
  inputs the exact flush replays (with SGLang's ``replayssm_k`` / ``replayssm_g``, fp32 with an fp32
  checkpoint);
* ``stale`` ``[layers, slots]`` bool.

SGLang's own ``replayssm_d`` ring (``[layers, slots, HV, L, V]`` in the checkpoint dtype) is dead while
the read copy is on: the decode step is ours (the CPU hooks, ``kernel_binding``; SGLang's ReplaySSM decode
kernels are never called with a copy: the KDA safe gate and the Helion decode backend are refused), the
spec paths are refused, and no mover copies it (``MambaPool.copy_from`` / ``get_cpu_copy`` /
``load_cpu_copy`` move conv + temporal only, memory_pool.py:1163-1243; HiCache's host pool and PD
transfers skip every ``replayssm_*`` field, memory_pool.py:1247-1258). With a 2-byte io dtype and an
fp32 ring (every real model) its bytes are exactly ``d`` + ``v``: fix ``read_copy_d_ring`` carves them out
of it (:func:`records_in_d_ring`): per slot ``[2, HV, L, V]`` of the io dtype, ``d = [:, :, 0]``,
``v = [:, :, 1]``, each contiguous within a slot, slot stride ``2 * HV * L * V`` (the CUDA passes take
the slot strides; the torch paths index). Otherwise (fp32 io, the switch off) they are allocated.

Invariants:

* The copy is read only by non-flush decode steps. The fp32 checkpoint (``temporal``) is the only
  state that moves: every mover (copy-on-write, HiCache, retraction, materialize, records) reads and
  writes it, never the copy, and nothing writes the checkpoint from the copy.
* ``copy[l, s]`` equals ``quantize(temporal[l, s])`` whenever ``stale[l, s]`` is False and slot ``s``
  has an empty ring: the flush rewrites the copy with the checkpoint it writes, and every other
  writer of a checkpoint marks the slot stale (:func:`mark_stale`: slot handed out by the allocator,
  ``copy_from`` destination, ``load_cpu_copy``, a fold, any extend forward's rows); the next decode
  step of each layer refreshes its stale rows before it reads them (:func:`decode_step`).
* A slot's full state is ``temporal`` replayed exactly over its pending records (``k``, ``g``, ``v``,
  ``beta``: :func:`replay_into`), not ``temporal`` folded with ``d~``.
"""

from __future__ import annotations

import dataclasses
import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from sglang_replayssm.kernels.read_copy_format import COPY_DTYPES, alloc_read_copy
from sglang_replayssm.kernels.read_copy_ref import replay_exact
from sglang_replayssm.kernels.read_copy_refresh import refresh_stale
from sglang_replayssm.radix import config
from sglang_replayssm.state import peek, state_of

__all__ = [
    "ReadCopyLayer", "ReadCopyPool", "attach", "bytes_per_slot", "copy_of", "decode_step", "exact_fold",
    "gathered", "layer_of", "mark_stale", "read_copy_of", "records_in_d_ring", "refusal", "replay_into",
]  # fmt: skip

logger = logging.getLogger(__name__)
_FP32 = 4


def refusal(mode: str, *, ssm_dtype: Any, decode_ring: bool, spec_ring: bool, speculative: bool,
            decode_backend: str | None = None) -> str | None:  # fmt: skip
    """One line saying why ``SGLANG_REPLAYSSM_READ_COPY=mode`` cannot run exactly here, or None.

    ``ssm_dtype``: the checkpoint dtype (a torch dtype or SGLang's ``--mamba-ssm-dtype`` string;
    None: not known yet, not refused here). Exact flushes need an fp32 checkpoint, the copy lives
    beside the decode ring, and the spec-verify ring / speculative decoding have their own cursors.
    ``decode_backend``: the linear-attention decode backend (``--linear-attn-decode-backend``, else
    ``--linear-attn-backend``; None: SGLang's default). The copy's step replaces ``TritonGDNKernel`` /
    ``TritonKDAKernel.packed_decode`` only, so ``helion`` (KDA; kda_helion.py:83-102 runs its own
    ReplaySSM kernel on ``replayssm_d``, leaving the copy and its records stale) is refused; SGLang
    itself refuses the ring with any backend but triton and helion (attention_hook.py:410).
    """
    if mode == "off":
        return None
    pre = f"sglang-replayssm: {config.READ_COPY_ENV}={mode}"
    if spec_ring or speculative:
        return f"{pre} is unsupported with speculative decoding (--enable-linear-replayssm-spec / --speculative-*)."
    if not decode_ring:
        return f"{pre} needs the decode ring: add --enable-linear-replayssm."
    if decode_backend == "helion":
        return f"{pre} runs on the Triton linear-attention decode backend only (got helion)."
    if ssm_dtype is not None and ssm_dtype not in (torch.float32, "float32"):
        name = str(ssm_dtype).replace("torch.", "")
        return f"{pre} needs an fp32 checkpoint for an exact flush: --mamba-ssm-dtype float32 (got {name})."
    return None


def records_in_d_ring(ring_itemsize: int, io_itemsize: int, record_elems: int) -> bool:
    """Whether the ``d~`` / ``v`` records live in SGLang's ``replayssm_d`` (fix ``read_copy_d_ring``):
    one slot's ring, ``record_elems = HV * L * V`` elements of ``ring_itemsize`` bytes, is exactly the two
    records' ``2 * HV * L * V`` of ``io_itemsize`` (an fp32 ring, a bf16 / fp16 io dtype), and ``v`` (the
    second half) starts 16-byte aligned for the CUDA passes' vector loads. The one test :func:`attach`
    and the budget (:func:`bytes_per_slot`) share."""
    return (config.enabled("read_copy_d_ring") and 2 * io_itemsize == ring_itemsize
            and (record_elems * io_itemsize) % 16 == 0)  # fmt: skip


def bytes_per_slot(cache_params: Any, record_len: int, fmt: str, io_itemsize: int) -> int:
    """Bytes of one slot's read copy and records over all layers that :func:`attach` allocates: the
    ``d~`` / ``v`` records only when they are not carved out of SGLang's decode ring (whose dtype is the
    checkpoint's, ``cache_params.dtype.temporal``; :func:`records_in_d_ring`)."""
    hv, v_dim, k_dim = cache_params.shape.temporal
    copy = hv * v_dim * k_dim * COPY_DTYPES[fmt].itemsize + (hv * v_dim * _FP32 if fmt == "fp8" else 0)
    carved = records_in_d_ring(cache_params.dtype.temporal.itemsize, io_itemsize, hv * record_len * v_dim)
    records = (0 if carved else 2 * hv * record_len * v_dim * io_itemsize) + hv * record_len * _FP32
    return (copy + records + 1) * len(cache_params.layers)


@dataclass(frozen=True)
class ReadCopyLayer:
    """One layer's read copy (shapes as :class:`ReadCopyPool` without the layer dim)."""

    copy: torch.Tensor
    scales: torch.Tensor | None
    d: torch.Tensor
    v: torch.Tensor
    beta: torch.Tensor
    stale: torch.Tensor


@dataclass(frozen=True)
class ReadCopyPool(ReadCopyLayer):
    """A pool's read copy and records (module docstring): :class:`ReadCopyLayer`'s fields with the layer
    dim first, format ``fmt`` (``"bf16"`` / ``"fp8"``); ``records_carved``: ``d`` and ``v`` are views of
    SGLang's ``replayssm_d`` (not counted in :attr:`nbytes`); ``temporal``: the pool's fp32 checkpoints
    ``[layers, slots, HV, V, K]`` it copies (how :meth:`layer_for` finds a layer)."""

    fmt: str = "bf16"
    records_carved: bool = False
    temporal: torch.Tensor | None = None

    def layer(self, i: int) -> ReadCopyLayer:
        return ReadCopyLayer(self.copy[i], None if self.scales is None else self.scales[i], self.d[i], self.v[i],
                             self.beta[i], self.stale[i])  # fmt: skip

    def layer_for(self, ssm_states: torch.Tensor) -> ReadCopyLayer | None:
        """The copy of the pool layer ``ssm_states`` is (``temporal[i]``, the view SGLang's decode passes),
        or None when it is no layer of this pool. O(1): the layer index is the view's offset in
        ``temporal``'s storage over the layer stride, then checked to be exactly ``temporal[i]``."""
        temporal = self.temporal
        if temporal is None or ssm_states.dim() != temporal.dim() - 1 or temporal.stride(0) == 0:
            return None
        i, rest = divmod(int(ssm_states.storage_offset()) - int(temporal.storage_offset()), int(temporal.stride(0)))
        if rest or not 0 <= i < temporal.shape[0] or not ssm_states.is_set_to(temporal[i]):
            return None
        return self.layer(i)

    @property
    def records_nbytes(self) -> int:
        """Bytes of the ``d~`` and ``v`` records (SGLang's when carved)."""
        return sum(t.numel() * t.element_size() for t in (self.d, self.v))

    @property
    def nbytes(self) -> int:
        """Bytes allocated for this read copy (carved records are SGLang's ring, not counted)."""
        ts = [self.copy, self.beta, self.stale] + ([] if self.scales is None else [self.scales])
        own = sum(t.numel() * t.element_size() for t in ts)
        return own + (0 if self.records_carved else self.records_nbytes)


def read_copy_of(mamba_pool: Any) -> ReadCopyPool | None:
    """The read copy :func:`attach` gave ``mamba_pool``, or None."""
    state = peek(mamba_pool)
    return None if state is None else state.read_copy


def _carved_records(d_ring: torch.Tensor | None, shape: tuple[int, ...],
                    io_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor] | None:  # fmt: skip
    """``(d, v)`` ``[layers, slots, HV, L, V]`` of ``io_dtype`` as views of SGLang's ``replayssm_d``
    (module docstring), or None when it cannot hold them: not :func:`records_in_d_ring`, not a contiguous
    ``shape`` (SGLang's decode ring always is, memory_pool.py:793), or an unaligned base."""
    layers, slots, hv, L, v_dim = shape
    if d_ring is None or not records_in_d_ring(d_ring.element_size(), io_dtype.itemsize, hv * L * v_dim):
        return None
    if tuple(d_ring.shape) != shape or not d_ring.is_contiguous() or d_ring.data_ptr() % 16:
        return None
    pair = d_ring.view(io_dtype).view(layers, slots, 2, hv, L, v_dim)
    return pair[:, :, 0], pair[:, :, 1]


def attach(mamba_pool: Any, fmt: str, io_dtype: torch.dtype) -> ReadCopyPool:
    """Allocate the read copy of a decode-ring pool (every slot stale), remember its layers, log its bytes.

    The ``d~`` / ``v`` records are views of SGLang's ``replayssm_d`` where it holds them exactly
    (:func:`_carved_records`), else allocated.

    Refuses (``ValueError``, one line) a checkpoint that is not fp32 and, on CUDA, shapes the CUDA
    passes are not compiled for (no silent torch fallback on a GPU).
    """
    cache = mamba_pool.mamba_cache
    temporal, g = cache.temporal, cache.replayssm_g
    layers, slots, hv, v_dim, k_dim = temporal.shape
    L = g.shape[3]
    why = refusal(fmt, ssm_dtype=temporal.dtype, decode_ring=True, spec_ring=False, speculative=False)
    if why is None and temporal.is_cuda and not config.enabled("ring_kernels"):
        why = f"sglang-replayssm: {config.READ_COPY_ENV}={fmt} on CUDA needs the ring_kernels fix (our decode binding)."
    if why is None and temporal.is_cuda and ((k_dim, v_dim) != (128, 128) or L > 16):
        why = (f"sglang-replayssm: {config.READ_COPY_ENV}={fmt}: the CUDA read-copy passes are compiled for "
               f"K = V = 128 and ring length <= 16 (got K={k_dim}, V={v_dim}, L={L}).")  # fmt: skip
    if why is not None:
        raise ValueError(why)
    dev = temporal.device
    copy, scales = alloc_read_copy(layers * slots, hv, v_dim, k_dim, fmt, False, dev)  # type: ignore[arg-type]
    shape = (layers, slots, hv, L, v_dim)
    carved = _carved_records(getattr(cache, "replayssm_d", None), shape, io_dtype)
    d, v = carved if carved is not None else (torch.zeros(shape, dtype=io_dtype, device=dev),
                                              torch.zeros(shape, dtype=io_dtype, device=dev))
    rc = ReadCopyPool(
        copy=copy.view(layers, slots, hv, v_dim, k_dim),
        scales=None if scales is None else scales.view(layers, slots, hv, v_dim),
        d=d,
        v=v,
        beta=torch.zeros(layers, slots, hv, L, dtype=torch.float32, device=dev),
        stale=torch.ones(layers, slots, dtype=torch.bool, device=dev),
        fmt=fmt,
        records_carved=carved is not None,
        temporal=temporal,
    )
    state_of(mamba_pool).read_copy = rc
    from sglang_replayssm.radix.ring.pool import use_checkpoint_copies

    use_checkpoint_copies(sys.modules[__name__])  # this module is the ring's copies
    where = "carved out of SGLang's replayssm_d" if rc.records_carved else "allocated"
    logger.info("sglang-replayssm read copy (%s): %d layers x %d slots, %.1f MiB beside the decode ring; "
                "d~ / v records (%s) %.1f MiB %s", fmt, layers, slots, rc.nbytes / (1 << 20), io_dtype,
                rc.records_nbytes / (1 << 20), where)  # fmt: skip
    return rc


def layer_of(kernel: Any, ssm_states: torch.Tensor) -> ReadCopyLayer | None:
    """The read copy of the pool layer ``ssm_states`` is, reached through the decode ``kernel`` SGLang
    called: its state's ``mamba_pool`` (linked when the backend was built, :mod:`.hooks`), that pool's
    read copy (:func:`read_copy_of`), its layer (:meth:`ReadCopyPool.layer_for`); None anywhere along the
    way (no link, no read copy, not a layer of that pool): the ring decode without a copy."""
    state = peek(kernel)
    rc = None if state is None else read_copy_of(state.mamba_pool)
    return None if rc is None else rc.layer_for(ssm_states)


def mark_stale(rc: ReadCopyPool | None, slots: Any) -> None:
    """``stale[:, slots] = True`` (any shape; entries < 0 are padding and skipped; no host sync)."""
    if rc is None or slots is None:
        return
    flat = torch.as_tensor(slots).reshape(-1).to(device=rc.stale.device, dtype=torch.long)
    if flat.numel():
        rc.stale.index_fill_(1, flat.clamp(min=0), True)  # -1 -> the padding slot 0, never live


def _refresh_stale(layer: ReadCopyLayer, ssm_states: torch.Tensor, cache_indices: torch.Tensor) -> None:
    """Rewrite this layer's copy of every stale row of the batch from its fp32 checkpoint and clear
    their flags (:func:`sglang_replayssm.kernels.read_copy_refresh.refresh_stale`: one Triton launch
    with no host sync on CUDA, so the step stays capturable in a CUDA graph; torch on CPU)."""
    refresh_stale(ssm_states, layer.copy, layer.scales, layer.stale, cache_indices.reshape(-1))


def decode_step(decode: Callable[..., Any], layer: ReadCopyLayer, mixed_qkv: torch.Tensor, a: torch.Tensor,
                b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor, scale: float, ssm_states: torch.Tensor,
                k_ring: torch.Tensor, g_ring: torch.Tensor, out: torch.Tensor, cache_indices: torch.Tensor,
                write_pos: torch.Tensor, force_flush: torch.Tensor | None, is_kda: bool) -> None:  # fmt: skip
    """One read-copy decode step of one layer: stale rows refreshed, then ``decode`` (the torch reference
    or the CUDA passes, :func:`sglang_replayssm.kernels.read_copy_ref.read_copy_decode_torch`'s arguments)."""
    if config.enabled("read_copy_refresh"):
        _refresh_stale(layer, ssm_states, cache_indices)
    decode(mixed_qkv, a, b, A_log, dt_bias, scale, ssm_states, layer.copy, layer.scales, layer.d, k_ring, g_ring,
           layer.v, layer.beta, out, cache_indices, write_pos, force_flush, use_qk_l2norm_in_kernel=True,
           is_kda=is_kda)  # fmt: skip


def replay_into(rc: ReadCopyPool, temporal: torch.Tensor, k: torch.Tensor, g: torch.Tensor, src: torch.Tensor,
                dst: torch.Tensor, counts: torch.Tensor, *, is_kda: bool, layers: slice | None = None) -> None:  # fmt: skip
    """``temporal[:, dst[i]] = temporal[:, src[i]]`` replayed exactly over its first ``counts[i]`` records.

    The exact fold of a read-copy pool (``k``, ``g``: SGLang's rings; ``v``, ``beta``: ours), the same
    recurrence the flush runs, so a moved state equals fp32 decode. Rows with ``src < 0``, ``dst < 0``
    or ``counts <= 0`` are skipped (the caller marks ``dst`` stale). On CUDA one Triton launch per layer
    with no host read (capturable: SGLang tracks decode states inside its decode graph); on CPU the torch
    reference, with one host read of the row mask.
    """
    src, dst, counts = (t.reshape(-1).to(device=temporal.device, dtype=torch.long) for t in (src, dst, counts))
    v, beta = rc.v, rc.beta
    if layers is not None:
        v, beta = v[layers], beta[layers]
    if temporal.is_cuda:
        from sglang_replayssm.kernels.replay_exact_triton import replay_exact_triton

        for li in range(temporal.shape[0]):
            replay_exact_triton(temporal[li], k[li], g[li], v[li], beta[li], src, dst, counts, is_kda=is_kda)
        return
    live = torch.nonzero((src >= 0) & (dst >= 0) & (counts > 0)).flatten()
    if live.numel():
        s, d_, m = src[live], dst[live], counts[live]
        G = temporal.shape[2] // k.shape[2]
        for li in range(temporal.shape[0]):
            temporal[li, d_] = replay_exact(temporal[li], k[li], g[li], v[li], beta[li], s, m, G, is_kda)


# ---- the ring's CheckpointCopies (radix/ring/pool.py), installed by :func:`attach` -----------------


def copy_of(mamba_pool: Any) -> ReadCopyPool | None:
    """The pool's read copy (:func:`read_copy_of`)."""
    return read_copy_of(mamba_pool)


def exact_fold() -> bool:
    """Folds replay the raw records (the ``read_copy_exact_fold`` fix), else they fold ``d~``."""
    return config.enabled("read_copy_exact_fold")


def gathered(rc: ReadCopyPool, idx: torch.Tensor) -> ReadCopyPool:
    """``rc`` with the records (``v``, ``beta``) of slots ``idx`` only and nothing stale: a private copy
    a fold replays into (the live slots untouched)."""
    return dataclasses.replace(rc, v=rc.v[:, idx], beta=rc.beta[:, idx], stale=torch.zeros_like(rc.stale))
