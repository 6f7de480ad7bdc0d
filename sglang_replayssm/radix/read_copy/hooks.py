"""The read copy room's hooks (:mod:`store`), registered by :mod:`sglang_replayssm.radix.hooks` (``HOOKS``;
each ``at`` checked against SGLang by ``tests/test_hook_table.py``).

* ``attach_read_copy`` (always registered; a no-op while ``SGLANG_REPLAYSSM_READ_COPY=off``): after
  ``HybridReqToTokenPool._init_mamba_pool`` allocated the decode ring, allocate the read copy beside it
  and link the slot allocator to it. A pool without the decode ring is refused in one line.
* The packed-decode hooks reach the read copy of the layer they run through the kernel SGLang calls them
  with (:func:`store.layer_of`), linked to its pool by the ring room (``link_decode_kernel``), with no registry.
* The stale marks (fix ``read_copy_refresh``), at every writer of a checkpoint other than the flush:
  a slot handed out by ``MambaSlotAllocator.alloc`` (copy-on-write destinations, HiCache load-back,
  int8 / CPU loads, PD transfers and record rebuilds all write into an allocated slot before its first
  decode), ``MambaPool.copy_from`` destinations, ``MambaPool.load_cpu_copy`` slots, and every row of an
  extend / MIXED forward (prefill chunks, streaming-session turns, mixed-chunk decode rows). Folds
  mark their destinations in :meth:`ring_pool.RingPool.materialize`.
"""

from __future__ import annotations

from typing import Any

from sglang_replayssm.hook_table import Hook
from sglang_replayssm.radix import config
from sglang_replayssm.state import peek, state_of

__all__ = ["READ_COPY_HOOKS", "install"]


def attach_read_copy(result: Any, req_to_token_pool: Any, *args: Any, **kwargs: Any) -> None:
    """AFTER ``HybridReqToTokenPool._init_mamba_pool``: the read copy of its decode-ring pool."""
    mode = config.read_copy_mode()
    if mode == "off":
        return
    from sglang_replayssm.radix.read_copy.store import attach, refusal
    from sglang_replayssm.radix.ring.pool import ring_pool

    mamba_pool = getattr(req_to_token_pool, "mamba_pool", None)
    if mamba_pool is None:
        return
    if ring_pool(mamba_pool) is None:
        spec = bool(getattr(mamba_pool, "enable_linear_replayssm_spec", False))
        why = refusal(mode, ssm_dtype=None, decode_ring=False, spec_ring=spec, speculative=spec)
        raise ValueError(why)
    conv = mamba_pool.mamba_cache.conv
    rc = attach(mamba_pool, mode, conv[0].dtype if conv else mamba_pool.mamba_cache.temporal.dtype)
    allocator = getattr(req_to_token_pool, "mamba_allocator", None)
    if allocator is not None:
        state_of(allocator).read_copy = rc


def stale_on_alloc(result: Any, allocator: Any, *args: Any, **kwargs: Any) -> None:
    """AFTER ``MambaSlotAllocator.alloc``: the handed-out slots' copies are stale."""
    from sglang_replayssm.radix.read_copy.store import mark_stale

    if result is not None and config.enabled("read_copy_refresh"):
        linked = peek(allocator)
        mark_stale(None if linked is None else linked.read_copy, result)


def stale_on_copy(result: Any, mamba_pool: Any, src_indices: Any, dst_indices: Any) -> None:
    """AFTER ``MambaPool.copy_from``: the destinations' copies are stale."""
    from sglang_replayssm.radix.read_copy.store import mark_stale, read_copy_of

    if config.enabled("read_copy_refresh"):
        mark_stale(read_copy_of(mamba_pool), dst_indices)


def stale_on_cpu_load(result: Any, mamba_pool: Any, mamba_cache_cpu: Any, indices: Any) -> None:
    """AFTER ``MambaPool.load_cpu_copy``: the loaded slots' copies are stale."""
    from sglang_replayssm.radix.read_copy.store import mark_stale, read_copy_of

    if config.enabled("read_copy_refresh"):
        mark_stale(read_copy_of(mamba_pool), indices)


def stale_on_extend(result: Any, runner: Any, forward_batch: Any) -> None:
    """AFTER ``ModelRunner._maybe_execute_deferred_mamba_cow_and_clear`` (it runs before every forward
    reads the pool): on an extend / MIXED forward every row's slot is stale (the extend writes it)."""
    if not config.enabled("read_copy_refresh"):
        return
    from sglang_replayssm.radix.read_copy.store import mark_stale, read_copy_of
    from sglang_replayssm.radix.ring.movers import _reads_extend_state

    pool: Any = getattr(runner, "req_to_token_pool", None)
    rc = read_copy_of(getattr(pool, "mamba_pool", None))
    indices = getattr(forward_batch, "req_pool_indices", None)
    if rc is None or indices is None or not hasattr(pool, "get_mamba_indices") or not _reads_extend_state(
        runner, forward_batch
    ):
        return
    mark_stale(rc, pool.translate_mamba_indices(pool.get_mamba_indices(indices)))


def install() -> None:
    """Install the read copy's startup parts (idempotent): its admission check and its bytes per slot
    beside the decode ring (:mod:`startup`). Its folds and decode step are installed into the ring when
    it attaches to a pool (:func:`store.attach`)."""
    from sglang_replayssm.radix import admission, budget
    from sglang_replayssm.radix.read_copy import startup

    admission.add_check("read_copy", startup.check_read_copy)
    budget.add_slot_charge("read_copy", startup.bytes_per_slot_charged)


_MP = "sglang.srt.mem_cache.memory_pool"
_AT = "sglang/srt/mem_cache/memory_pool.py"

#: The read copy's hooks (module docstring).
READ_COPY_HOOKS: tuple[Hook, ...] = (
    Hook(f"{_MP}.HybridReqToTokenPool._init_mamba_pool", "AFTER", attach_read_copy, f"{_AT}:1426",
         "attach_read_copy"),
    Hook("sglang.srt.mem_cache.allocator.mamba.MambaSlotAllocator.alloc", "AFTER", stale_on_alloc,
         "sglang/srt/mem_cache/allocator/mamba.py:65", "read_copy_stale_on_alloc", "read_copy_refresh"),
    Hook(f"{_MP}.MambaPool.copy_from", "AFTER", stale_on_copy, f"{_AT}:1163", "read_copy_stale_on_copy",
         "read_copy_refresh"),
    Hook(f"{_MP}.MambaPool.load_cpu_copy", "AFTER", stale_on_cpu_load, f"{_AT}:1223",
         "read_copy_stale_on_cpu_load", "read_copy_refresh"),
    Hook("sglang.srt.model_executor.model_runner.ModelRunner._maybe_execute_deferred_mamba_cow_and_clear", "AFTER",
         stale_on_extend, "sglang/srt/model_executor/model_runner.py:1915", "read_copy_stale_on_extend",
         "read_copy_refresh"),
)
