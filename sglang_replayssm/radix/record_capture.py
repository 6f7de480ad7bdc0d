"""Record capture: every token a forward computes gets its layer inputs stored (:mod:`records`).

Scheduler side (the thread that allocates KV and matches prefixes):

* every KV index the token allocator hands out starts without a record (:func:`invalidate_allocated`);
* ``ScheduleBatch.prepare_for_extend`` / ``prepare_for_decode`` give the batch's new tokens
  (``out_cache_loc``) record slots (:func:`assign_batch`), so a later match sees them at once.

Forward side: ``GDNAttnBackend.forward_extend`` / ``forward_decode`` write each layer's pre-conv
``mixed_qkv`` and ``a``, ``b`` rows to the slots of ``out_cache_loc`` (:func:`capture`). A forward
that cannot capture (a fused decode path passing a tuple, a target-verify forward) drops the slots
of its tokens instead, so an assigned slot always holds its token's inputs before any rebuild reads
it (rebuilds run at the start of the next forward, :mod:`record_rebuild`).

The pool exists only with the ReplaySSM decode ring on and a radix cache; it is created by the first
GDN forward, which also assigns its own tokens. On CUDA only prefill tokens are captured (a decode
step replayed from a CUDA graph could not be captured); decode tokens keep the deepest state.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from sglang_replayssm.radix.records import (
    CAPACITY_ENV,
    RecordPool,
    attach,
    capacity_from_env,
    detach,
    pool_of,
)
from sglang_replayssm.radix.records import OFF_ATTR as _OFF_ATTR
from sglang_replayssm.radix.ring_pool import ring_pool

__all__ = ["assign_batch", "capture", "invalidate_allocated"]

logger = logging.getLogger(__name__)
_ALLOCATOR_ATTR = "_replayssm_record_pool"
#: Token allocators whose allocations :func:`invalidate_allocated` sees (``radix/hooks.py``).
_HOOKED_ALLOCATORS = frozenset({"TokenToKVPoolAllocator", "PagedTokenToKVPoolAllocator"})


def invalidate_allocated(allocator: Any, kv: Any) -> None:
    """After a KV allocation: the handed-out indices carry no record."""
    pool: RecordPool | None = getattr(allocator, _ALLOCATOR_ATTR, None)
    if pool is not None and isinstance(kv, torch.Tensor):
        pool.invalidate(kv)


def assign_batch(batch: Any, *, decode: bool) -> None:
    """After ``prepare_for_extend`` / ``prepare_for_decode``: record slots for the new tokens."""
    pool = pool_of(getattr(batch, "req_to_token_pool", None))
    if pool is None:
        return
    allocator = getattr(batch, "token_to_kv_pool_allocator", None)
    if allocator is not None and getattr(allocator, _ALLOCATOR_ATTR, None) is not pool:
        if type(allocator).__name__ not in _HOOKED_ALLOCATORS:  # its allocations would keep stale records
            detach(batch.req_to_token_pool)
            return
        setattr(allocator, _ALLOCATOR_ATTR, pool)
    if decode and not pool.capture_decode:
        return
    pool.assign(getattr(batch, "out_cache_loc", None))


def _wanted(backend: Any, forward_batch: Any) -> bool:
    mode = forward_batch.forward_mode
    if mode.is_target_verify() or mode.is_draft_extend_v2() or getattr(forward_batch, "spec_info", None) is not None:
        return False
    req_pool = backend.req_to_token_pool
    if getattr(req_pool, "mamba_ckpt_pool", None) is not None:  # int8 checkpoints: not supported
        return False
    return ring_pool(getattr(req_pool, "mamba_pool", None)) is not None


def _graph_capturing() -> bool:
    """A CUDA graph is being captured (startup): no pool is created inside a graph's memory."""
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def _new_pool(backend: Any, forward_batch: Any) -> RecordPool | None:
    kv_pool = getattr(backend, "token_to_kv_pool", None)
    if kv_pool is None or not hasattr(kv_pool, "size"):
        return None
    kv_size = int(kv_pool.size) + int(getattr(kv_pool, "page_size", 1)) + 1  # KV rows: size + page
    capacity = capacity_from_env(kv_size)
    if capacity <= 0:
        return None
    device = forward_batch.out_cache_loc.device
    pool = RecordPool(kv_size=kv_size, capacity=capacity, device=device)
    pool.capture_decode = device.type == "cpu"
    attach(backend.req_to_token_pool, pool)
    logger.info("sglang-replayssm records: %d tokens of layer inputs (first in, first out; %s=N to change)",
                capacity, CAPACITY_ENV)
    pool.assign(forward_batch.out_cache_loc)  # the first forward's own tokens
    return pool


def capture(backend: Any, layer: Any, forward_batch: Any, mixed_qkv: Any, a: Any, b: Any) -> None:
    """Before a GDN layer's extend/decode: store its inputs for the forward's new tokens."""
    req_pool = backend.req_to_token_pool
    pool = pool_of(req_pool)
    loc = getattr(forward_batch, "out_cache_loc", None)
    if loc is None or loc.numel() == 0:
        return
    if not _wanted(backend, forward_batch):
        if pool is not None:
            pool.invalidate(loc)
        return
    if pool is None:
        if getattr(req_pool, _OFF_ATTR, False) or _graph_capturing():
            return
        pool = _new_pool(backend, forward_batch)
        if pool is None:
            detach(req_pool)
            return
    if not pool.capture_decode and forward_batch.forward_mode.is_decode():
        return  # decode tokens were never assigned a slot (CUDA): nothing to write on the hot path
    n = loc.numel()
    if not isinstance(mixed_qkv, torch.Tensor) or mixed_qkv.shape[0] < n or a.shape[0] < n:
        pool.invalidate(loc)
        return
    pool.write(layer, backend, loc, mixed_qkv[:n], a[:n], b[:n])
