"""The records room's hooks: prefix hits at any depth (fix ``record_hits``). The record pool built with
SGLang's memory pools, record slots for every batch's new tokens, none for a freshly allocated KV index,
the layer inputs captured in every forward, the kept per-chunk states, the planted state of a
records-only match and its rebuild before the next forward. :func:`install` puts the records' parts of core behaviours in place (memory budget, lost-hit
metric, extra_buffer end-state donation)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sglang_replayssm.hook_table import Hook
from sglang_replayssm.radix import config
from sglang_replayssm.radix.gated import gated_hook

__all__ = ["RECORD_HOOKS", "install"]

_GDN_BACKEND = "sglang.srt.layers.attention.linear.gdn_backend.GDNAttnBackend"
_KDA_BACKEND = "sglang.srt.layers.attention.linear.kda_backend.KDAAttnBackend"
_LINEAR_AT = "sglang/srt/layers/attention/linear"
_SCHEDULE_BATCH = "sglang.srt.managers.schedule_batch.ScheduleBatch"
_ALLOC = "sglang.srt.mem_cache.allocator"


def assign_extend_records(result: Any, batch: Any, *args: Any, **kwargs: Any) -> None:
    """The prefill batch's new tokens get record slots."""
    from sglang_replayssm.radix.records.capture import assign_batch

    assign_batch(batch, decode=False)


def assign_decode_records(result: Any, batch: Any, *args: Any, **kwargs: Any) -> None:
    """The decode batch's new tokens get record slots."""
    from sglang_replayssm.radix.records.capture import assign_batch

    assign_batch(batch, decode=True)


def _no_record_on_alloc(name: str) -> Callable[..., None]:
    def hook(result: Any, allocator: Any, *args: Any, **kwargs: Any) -> None:
        """Every KV index the allocator hands out starts without a record."""
        from sglang_replayssm.radix.records.capture import invalidate_allocated

        invalidate_allocated(allocator, result)

    hook.__name__ = hook.__qualname__ = name
    return hook


def _capture_records(name: str, what: str) -> Callable[..., Any]:
    def hook(original: Callable[..., Any], backend: Any, layer: Any, forward_batch: Any,
             mixed_qkv: Any, a: Any, b: Any, **kwargs: Any) -> Any:
        from sglang_replayssm.radix.records.capture import capture

        plan = capture(backend, layer, forward_batch, mixed_qkv, a, b)
        if what not in ("extend", "KDA extend"):
            return original(backend, layer, forward_batch, mixed_qkv, a, b, **kwargs)
        from sglang_replayssm.radix.records.capture import extending

        with extending(backend, layer, forward_batch, plan):
            return original(backend, layer, forward_batch, mixed_qkv, a, b, **kwargs)

    hook.__name__ = hook.__qualname__ = name
    hook.__doc__ = f"Store the layer's {what} inputs for the batch's new tokens, then SGLang's {what}."
    return hook


def _keep_interval_states(name: str, what: str, h_at: int) -> Callable[..., Any]:
    def hook(original: Callable[..., Any], dispatcher: Any, *args: Any, **kwargs: Any) -> Any:
        from sglang_replayssm.radix.records.capture import keep_chunk_states

        result = original(dispatcher, *args, **kwargs)
        keep_chunk_states(result, dispatcher, kwargs.get("ssm_states"), h_at=h_at)
        return result

    hook.__name__ = hook.__qualname__ = name
    hook.__doc__ = f"A forward's own {what} extend: keep its per-chunk states (``h``, {what}'s result[{h_at}]) at the interval."
    return hook


#: GDN's extend returns ``(o, final, h)``; KDA's ``(o, h)``, and only while SGLang tracks a request of the batch.
keep_interval_states = _keep_interval_states("keep_interval_states", "GDN", 2)
keep_kda_interval_states = _keep_interval_states("keep_kda_interval_states", "KDA", 1)


def drop_graph_replayed_records(result: Any, backend: Any, meta: Any, forward_batch: Any, *args: Any,
                                **kwargs: Any) -> None:
    """A breakable prefill CUDA graph is about to replay KDA's extend inside the graph: its tokens keep no
    records (nothing of ours runs in a replay)."""
    from sglang_replayssm.radix.records.capture import drop_graph_replayed

    drop_graph_replayed(backend, forward_batch)


def eager_kda_extend(original: Callable[..., Any], backend: Any) -> bool:
    """Breakable prefill CUDA graphs run KDA's extend between segments where records capture it."""
    from sglang_replayssm.radix.records.capture import graph_extend_unless_captured

    return graph_extend_unless_captured(original, backend)


def drop_full_graph_records(runner: Any, forward_batch: Any, *args: Any, **kwargs: Any) -> None:
    """A full prefill CUDA graph is about to replay the whole forward, every linear layer inside it: its
    tokens keep no records (nothing of ours runs in a replay)."""
    if config.enabled("record_hits") and getattr(runner, "_is_full_backend", False):
        from sglang_replayssm.radix.records.capture import drop_graph_replayed

        drop_graph_replayed(runner.model_runner, forward_batch)


def plant_rebuilt_state(original: Callable[..., Any], component: Any, params: Any, result: Any) -> Any:
    """A records-only best match gets a planted state, rebuilt before the copy-on-write reads it."""
    from sglang_replayssm.radix.records.match import plant_and_match

    return plant_and_match(original, component, params, result)


def branch_point_on_prefix_grid(original: Callable[..., Any], component: Any, params: Any, result: Any) -> Any:
    """SGLang's branch point on the grid of the depth the request resumes from (its prefill can track it)."""
    from sglang_replayssm.radix.records.branch_grid import branch_on_prefix_grid

    return branch_on_prefix_grid(original, component, params, result)


def build_record_pool(result: Any, configurator: Any, *args: Any, **kwargs: Any) -> None:
    """SGLang's memory pools exist: the record pool is built beside them, once."""
    from sglang_replayssm.radix.records.startup import build_pool

    build_pool(configurator, result)


def rebuild_planted_states(runner: Any, *args: Any, **kwargs: Any) -> None:
    """Before a forward writes anything: rebuild the states planted since the last one."""
    if config.enabled("record_hits"):
        from sglang_replayssm.radix.records.rebuild import run_pending

        run_pending(runner)


def _end_state(component: Any, req: Any, token_ids_len: int, is_finished: bool) -> None:
    from sglang_replayssm.radix.records.donation import end_state_before_finish_donation

    end_state_before_finish_donation(component, req, token_ids_len, is_finished)


def _reservation_gib(configurator: Any, rest_gib: float, *, spec_ring: bool) -> float:
    from sglang_replayssm.radix.records.budget import reservation_gib

    return reservation_gib(configurator, rest_gib, spec_ring=spec_ring)


def _rebuild_of(req: Any) -> tuple[int, int]:
    from sglang_replayssm.radix.records.match import rebuild_of

    return rebuild_of(req)


def _pool_of(req_to_token_pool: Any) -> Any:
    from sglang_replayssm.radix.records.pool import pool_of

    return pool_of(req_to_token_pool)


def install() -> None:
    """Install the records' parts of core behaviours (idempotent): the record pool's reservation out of
    the KV budget, the rebuilt-hit counts of the lost-hit metric, the extra_buffer end-state donation."""
    from sglang_replayssm.radix import budget, metrics
    from sglang_replayssm.radix.ring import donation

    budget.add_reservation("records", _reservation_gib)
    metrics.use_records(_rebuild_of, _pool_of)
    donation.use_end_state(_end_state)


_MATCH = "sglang.srt.mem_cache.unified_cache.components.mamba.MambaComponent.finalize_match_result_in_cache"
_ALLOC_HOOKS = (
    ("no_record_on_token_alloc", f"{_ALLOC}.token.TokenToKVPoolAllocator.alloc",
     "sglang/srt/mem_cache/allocator/token.py:54"),
    ("no_record_on_page_alloc", f"{_ALLOC}.paged.PagedTokenToKVPoolAllocator.alloc",
     "sglang/srt/mem_cache/allocator/paged.py:181"),
    ("no_record_on_extend_alloc", f"{_ALLOC}.paged.PagedTokenToKVPoolAllocator.alloc_extend",
     "sglang/srt/mem_cache/allocator/paged.py:204"),
    ("no_record_on_decode_alloc", f"{_ALLOC}.paged.PagedTokenToKVPoolAllocator.alloc_decode",
     "sglang/srt/mem_cache/allocator/paged.py:279"),
)
_CAPTURE_HOOKS = (
    ("capture_extend_records", f"{_GDN_BACKEND}.forward_extend", f"{_LINEAR_AT}/gdn_backend.py:948", "extend"),
    ("capture_decode_records", f"{_GDN_BACKEND}.forward_decode", f"{_LINEAR_AT}/gdn_backend.py:678", "decode"),
    ("capture_kda_extend_records", f"{_KDA_BACKEND}.forward_extend", f"{_LINEAR_AT}/kda_backend.py:1043",
     "KDA extend"),
    ("capture_kda_decode_records", f"{_KDA_BACKEND}.forward_decode", f"{_LINEAR_AT}/kda_backend.py:770",
     "KDA decode"),
)

#: The records room's hooks, behind ``record_hits`` (KDA's graph extend: ``record_kda_graph_eager``).
RECORD_HOOKS: tuple[Hook, ...] = (
    gated_hook("sglang.srt.mem_cache.kv_cache_configurator.KVCacheConfigurator.configure", "AFTER",
               build_record_pool, at="sglang/srt/mem_cache/kv_cache_configurator.py:457", fix="record_hits"),
    gated_hook(f"{_SCHEDULE_BATCH}.prepare_for_extend", "AFTER", assign_extend_records,
               at="sglang/srt/managers/schedule_batch.py:2847", fix="record_hits"),
    gated_hook(f"{_SCHEDULE_BATCH}.prepare_for_decode", "AFTER", assign_decode_records,
               at="sglang/srt/managers/schedule_batch.py:3736", fix="record_hits"),
    *(gated_hook(target, "AFTER", _no_record_on_alloc(name), at=at, fix="record_hits")
      for name, target, at in _ALLOC_HOOKS),
    *(gated_hook(target, "AROUND", _capture_records(name, what), at=at, fix="record_hits")
      for name, target, at, what in _CAPTURE_HOOKS),
    gated_hook("sglang.srt.layers.attention.linear.gdn_backend.GDNKernelDispatcher.extend", "AROUND",
               keep_interval_states, at=f"{_LINEAR_AT}/gdn_backend.py:441", fix="record_hits"),
    gated_hook("sglang.srt.layers.attention.linear.kda_backend.KDAKernelDispatcher.extend", "AROUND",
               keep_kda_interval_states, at=f"{_LINEAR_AT}/kda_backend.py:420", fix="record_hits"),
    gated_hook(f"{_KDA_BACKEND}.supports_prefill_graph_extend", "AROUND", eager_kda_extend,
               at=f"{_LINEAR_AT}/kda_backend.py:624", fix="record_kda_graph_eager"),
    gated_hook(f"{_KDA_BACKEND}.refresh_prefill_graph_metadata", "AFTER", drop_graph_replayed_records,
               at=f"{_LINEAR_AT}/kda_backend.py:665", fix="record_hits"),
    gated_hook("sglang.srt.model_executor.runner.prefill_cuda_graph_runner.PrefillCudaGraphRunner.execute",
               "BEFORE", drop_full_graph_records,
               at="sglang/srt/model_executor/runner/prefill_cuda_graph_runner.py:2347", fix="record_hits", gate=False),
    gated_hook(_MATCH, "AROUND", plant_rebuilt_state,
               at="sglang/srt/mem_cache/unified_cache/components/mamba.py:196", fix="record_hits"),
    gated_hook(_MATCH, "AROUND", branch_point_on_prefix_grid,
               at="sglang/srt/mem_cache/unified_cache/components/mamba.py:196", fix="branch_on_prefix_grid"),
    gated_hook("sglang.srt.model_executor.model_runner.ModelRunner.forward", "BEFORE", rebuild_planted_states,
               at="sglang/srt/model_executor/model_runner.py:1813", fix="record_hits", gate=False),
)
