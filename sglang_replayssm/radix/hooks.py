"""Every hook the radix adapter installs into SGLang 0.5.23, and the table naming their targets.

The hooks are thin: each checks its fix switch (:mod:`config`) and either calls SGLang's original
unchanged (fix off = SGLang's behaviour) or the adapter logic in a sibling module. :data:`HOOKS`
names each target once, with its SGLang file:line (checked by ``tests/test_hook_table.py``).

All hooks are method/function hooks through ``sglang.srt.plugins.hook_registry.HookRegistry``;
none mutates SGLang's dicts or class attributes (``MambaComponent`` is hooked on the class that
``COMPONENT_REGISTRY`` already holds). :func:`register` is idempotent and cheap
(:func:`sglang_replayssm.hook_table.register`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sglang_replayssm import hook_table
from sglang_replayssm.hook_table import Hook
from sglang_replayssm.radix import config

__all__ = ["HOOKS", "Hook", "applied_hooks", "install", "register"]


# ---- arguments -------------------------------------------------------------------------------


def admit_linear_attn(original: Callable[..., Any], server_args: Any) -> Any:
    """AROUND ``handle_linear_attn_backend``."""
    if not config.enabled("admission"):
        return original(server_args)
    from sglang_replayssm.radix.admission import admit_linear_attn_args

    return admit_linear_attn_args(original, server_args)


# ---- decode kernels ----------------------------------------------------------------------------


def gdn_ring_kernel(original: Callable[..., Any], kernel: Any, *args: Any, **kwargs: Any) -> Any:
    """AROUND ``packed_decode``."""
    if not config.enabled("ring_kernels"):
        return original(kernel, *args, **kwargs)
    from sglang_replayssm.radix.kernel_binding import ring_packed_decode

    return ring_packed_decode(original, kernel, *args, is_kda=False, **kwargs)


def kda_ring_kernel(original: Callable[..., Any], kernel: Any, *args: Any, **kwargs: Any) -> Any:
    """AROUND ``packed_decode``."""
    if not config.enabled("ring_kernels"):
        return original(kernel, *args, **kwargs)
    from sglang_replayssm.radix.kernel_binding import ring_packed_decode

    return ring_packed_decode(original, kernel, *args, is_kda=True, **kwargs)


# ---- decode metadata and track snapshot ------------------------------------------------------


def kda_flush_forward_metadata(original: Callable[..., Any], backend: Any, *args: Any, **kwargs: Any) -> Any:
    """AROUND ``_forward_metadata``."""
    if not config.enabled("kda_force_flush"):
        return original(backend, *args, **kwargs)
    from sglang_replayssm.radix.flush import with_kda_force_flush

    return with_kda_force_flush(original, backend, *args, **kwargs)


def kda_flush_replay_metadata(original: Callable[..., Any], backend: Any, *args: Any, **kwargs: Any) -> Any:
    """AROUND ``_replay_metadata``."""
    if not config.enabled("kda_force_flush"):
        return original(backend, *args, **kwargs)
    from sglang_replayssm.radix.flush import with_kda_force_flush

    return with_kda_force_flush(original, backend, *args, **kwargs)


def device_cursor_eager(original: Callable[..., Any], backend: Any, *args: Any, **kwargs: Any) -> Any:
    """AROUND ``_forward_metadata``."""
    if not config.enabled("device_cursor"):
        return original(backend, *args, **kwargs)
    from sglang_replayssm.radix.device_cursor import device_forward_metadata

    return device_forward_metadata(original, backend, *args, **kwargs)


def device_cursor_graph(original: Callable[..., Any], backend: Any, *args: Any, **kwargs: Any) -> Any:
    """AROUND ``init_forward_metadata_out_graph``
    (it calls ``_replay_metadata``, :747, and alone holds the device ``seq_lens``)."""
    if not config.enabled("device_cursor"):
        return original(backend, *args, **kwargs)
    from sglang_replayssm.radix.device_cursor import device_out_graph_metadata

    return device_out_graph_metadata(original, backend, *args, **kwargs)


def exact_track_decode(
    original: Callable[..., Any],
    backend: Any,
    forward_batch: Any,
    conv_states: Any,
    ssm_states: Any,
    cache_indices: Any,
    layer_id: int | None = None,
) -> Any:
    """AROUND ``_track_mamba_state_decode``."""
    if not config.enabled("materialize_track"):
        return original(backend, forward_batch, conv_states, ssm_states, cache_indices, layer_id)
    from sglang_replayssm.radix.snapshot import track_decode_exact

    return track_decode_exact(
        original, backend, forward_batch, conv_states, ssm_states, cache_indices, layer_id
    )


# ---- slot movers and the cursor choke point --------------------------------------------------


def exact_copy_from(original: Callable[..., Any], mamba_pool: Any, src_indices: Any, dst_indices: Any) -> Any:
    """AROUND ``MambaPool.copy_from``."""
    if not (config.enabled("materialize_copy") and config.enabled("cursor_reset")):
        return original(mamba_pool, src_indices, dst_indices)
    from sglang_replayssm.radix.snapshot import copy_from_exact

    return copy_from_exact(original, mamba_pool, src_indices, dst_indices)


def link_slot_allocator(result: Any, req_to_token_pool: Any, *args: Any, **kwargs: Any) -> None:
    """AFTER ``HybridReqToTokenPool._init_mamba_pool``."""
    from sglang_replayssm.radix.cursor import link_allocator

    link_allocator(req_to_token_pool)


def empty_ring_on_alloc(result: Any, allocator: Any, *args: Any, **kwargs: Any) -> None:
    """AFTER ``MambaSlotAllocator.alloc``."""
    if result is None or not config.enabled("cursor_reset"):
        return
    from sglang_replayssm.radix.cursor import linked_write_pos, reset_cursors

    reset_cursors(linked_write_pos(allocator), result)


def empty_ring_on_int8_load(
    result: Any, ckpt_pool: Any, active_mamba_pool: Any, ckpt_slots: Any, active_slots: Any
) -> None:
    """AFTER ``MambaCheckpointPool.load_to_active``."""
    if not config.enabled("cursor_reset") or not getattr(active_mamba_pool, "enable_linear_replayssm", False):
        return
    from sglang_replayssm.radix.cursor import reset_cursors

    reset_cursors(getattr(active_mamba_pool, "replayssm_write_pos", None), active_slots)


# ---- extend over pending records, CPU retraction backup --------------------------------------


def fold_rows_before_extend(original: Callable[..., Any], runner: Any, forward_batch: Any) -> Any:
    """AROUND ``_maybe_execute_deferred_mamba_cow_and_clear``."""
    if not config.enabled("extend_fold"):
        return original(runner, forward_batch)
    from sglang_replayssm.radix.movers import fold_before_extend

    return fold_before_extend(original, runner, forward_batch)


def exact_cpu_copy(original: Callable[..., Any], mamba_pool: Any, indices: Any) -> Any:
    """AROUND ``MambaPool.get_cpu_copy``."""
    if not config.enabled("retract_backup"):
        return original(mamba_pool, indices)
    from sglang_replayssm.radix.movers import cpu_copy_exact

    return cpu_copy_exact(original, mamba_pool, indices)


def empty_ring_on_cpu_load(result: Any, mamba_pool: Any, mamba_cache_cpu: Any, indices: Any) -> None:
    """AFTER ``MambaPool.load_cpu_copy``."""
    if not config.enabled("retract_backup"):
        return
    from sglang_replayssm.radix.movers import empty_ring_after_cpu_load

    empty_ring_after_cpu_load(mamba_pool, indices)


# ---- radix tree ------------------------------------------------------------------------------


def exact_finish_donation(
    original: Callable[..., Any],
    component: Any,
    req: Any,
    insert_params: Any,
    token_ids_len: int,
    is_finished: bool,
) -> Any:
    """AROUND ``prepare_for_caching_req``."""
    if config.enabled("finish_donation"):
        from sglang_replayssm.radix.donation import materialize_before_finish_donation

        materialize_before_finish_donation(component, req, is_finished)
    return original(component, req, insert_params, token_ids_len, is_finished)


def record_lost_hit(result: Any, component: Any, params: Any, match_result: Any) -> None:
    """AFTER ``finalize_match_result_in_cache``."""
    if not config.enabled("lost_hit_metric"):
        return
    from sglang_replayssm.radix.metrics import record_match

    record_match(params, result if result is not None else match_result)


# ---- metrics and memory budget ---------------------------------------------------------------


def collect_lost_hit(stats: Any, cls: Any, adder: Any, *args: Any, **kwargs: Any) -> None:
    """AFTER ``PrefillStats.from_adder``."""
    if not config.enabled("lost_hit_metric"):
        return
    from sglang_replayssm.radix.metrics import collect_for_prefill

    collect_for_prefill(stats, getattr(adder, "can_run_list", ()))


def report_lost_hit(original: Callable[..., Any], reporter: Any, *args: Any, **kwargs: Any) -> Any:
    """AROUND ``report_prefill_stats``."""
    if not config.enabled("lost_hit_metric"):
        return original(reporter, *args, **kwargs)
    from sglang_replayssm.radix.metrics import report_prefill

    return report_prefill(original, reporter, *args, **kwargs)


def charge_ring_budget(original: Callable[..., Any], configurator: Any, total_rest_memory: float) -> Any:
    """AROUND ``_handle_max_mamba_cache``."""
    if not config.enabled("ring_budget"):
        return original(configurator, total_rest_memory)
    from sglang_replayssm.radix.budget import charge_decode_ring

    return charge_decode_ring(original, configurator, total_rest_memory)


# ---- the table and registration --------------------------------------------------------------

_BACKEND = "sglang.srt.layers.attention.hybrid_linear_attn_backend.MambaAttnBackendBase"
_MAMBA_COMPONENT = "sglang.srt.mem_cache.unified_cache.components.mamba.MambaComponent"
_REPORTER = "sglang.srt.managers.scheduler_components.metrics_reporter"

#: Every hook of the radix adapter: (target, kind, function, SGLang def line, name, fix switch).
HOOKS: tuple[Hook, ...] = (
    Hook("sglang.srt.arg_groups.attention_hook.handle_linear_attn_backend", "AROUND", admit_linear_attn,
         "sglang/srt/arg_groups/attention_hook.py:281", "admit_linear_attn", "admission"),
    Hook(f"{_BACKEND}._forward_metadata", "AROUND", kda_flush_forward_metadata,
         "sglang/srt/layers/attention/hybrid_linear_attn_backend.py:166", "kda_flush_forward_metadata", "kda_force_flush"),
    Hook(f"{_BACKEND}._replay_metadata", "AROUND", kda_flush_replay_metadata,
         "sglang/srt/layers/attention/hybrid_linear_attn_backend.py:747", "kda_flush_replay_metadata", "kda_force_flush"),
    Hook(f"{_BACKEND}._forward_metadata", "AROUND", device_cursor_eager,
         "sglang/srt/layers/attention/hybrid_linear_attn_backend.py:166", "device_cursor_eager", "device_cursor"),
    Hook(f"{_BACKEND}.init_forward_metadata_out_graph", "AROUND", device_cursor_graph,
         "sglang/srt/layers/attention/hybrid_linear_attn_backend.py:368", "device_cursor_graph", "device_cursor"),
    Hook(f"{_BACKEND}._track_mamba_state_decode", "AROUND", exact_track_decode,
         "sglang/srt/layers/attention/hybrid_linear_attn_backend.py:975", "exact_track_decode", "materialize_track"),
    Hook("sglang.srt.mem_cache.memory_pool.MambaPool.copy_from", "AROUND", exact_copy_from,
         "sglang/srt/mem_cache/memory_pool.py:1163", "exact_copy_from", "materialize_copy"),
    Hook("sglang.srt.mem_cache.memory_pool.HybridReqToTokenPool._init_mamba_pool", "AFTER", link_slot_allocator,
         "sglang/srt/mem_cache/memory_pool.py:1426", "link_slot_allocator", "cursor_reset"),
    Hook("sglang.srt.mem_cache.allocator.mamba.MambaSlotAllocator.alloc", "AFTER", empty_ring_on_alloc,
         "sglang/srt/mem_cache/allocator/mamba.py:65", "empty_ring_on_alloc", "cursor_reset"),
    Hook("sglang.srt.mem_cache.mamba_checkpoint_pool.MambaCheckpointPool.load_to_active", "AFTER", empty_ring_on_int8_load,
         "sglang/srt/mem_cache/mamba_checkpoint_pool.py:254", "empty_ring_on_int8_load", "cursor_reset"),
    Hook(f"{_MAMBA_COMPONENT}.prepare_for_caching_req", "AROUND", exact_finish_donation,
         "sglang/srt/mem_cache/unified_cache/components/mamba.py:604", "exact_finish_donation", "finish_donation"),
    Hook(f"{_MAMBA_COMPONENT}.finalize_match_result_in_cache", "AFTER", record_lost_hit,
         "sglang/srt/mem_cache/unified_cache/components/mamba.py:196", "record_lost_hit", "lost_hit_metric"),
    Hook(f"{_REPORTER}.PrefillStats.from_adder", "AFTER", collect_lost_hit,
         "sglang/srt/managers/scheduler_components/metrics_reporter.py:136", "collect_lost_hit", "lost_hit_metric"),
    Hook(f"{_REPORTER}.SchedulerMetricsReporter.report_prefill_stats", "AROUND", report_lost_hit,
         "sglang/srt/managers/scheduler_components/metrics_reporter.py:719", "report_lost_hit", "lost_hit_metric"),
    Hook("sglang.srt.mem_cache.kv_cache_configurator.KVCacheConfigurator._handle_max_mamba_cache", "AROUND", charge_ring_budget,
         "sglang/srt/mem_cache/kv_cache_configurator.py:3229", "charge_ring_budget", "ring_budget"),
    Hook("sglang.srt.layers.attention.linear.kernels.gdn_triton.TritonGDNKernel.packed_decode", "AROUND", gdn_ring_kernel,
         "sglang/srt/layers/attention/linear/kernels/gdn_triton.py:46", "gdn_ring_kernel", "ring_kernels"),
    Hook("sglang.srt.layers.attention.linear.kernels.kda_triton.TritonKDAKernel.packed_decode", "AROUND", kda_ring_kernel,
         "sglang/srt/layers/attention/linear/kernels/kda_triton.py:37", "kda_ring_kernel", "ring_kernels"),
    Hook("sglang.srt.model_executor.model_runner.ModelRunner._maybe_execute_deferred_mamba_cow_and_clear", "AROUND", fold_rows_before_extend,
         "sglang/srt/model_executor/model_runner.py:1915", "fold_rows_before_extend", "extend_fold"),
    Hook("sglang.srt.mem_cache.memory_pool.MambaPool.get_cpu_copy", "AROUND", exact_cpu_copy,
         "sglang/srt/mem_cache/memory_pool.py:1208", "exact_cpu_copy", "retract_backup"),
    Hook("sglang.srt.mem_cache.memory_pool.MambaPool.load_cpu_copy", "AFTER", empty_ring_on_cpu_load,
         "sglang/srt/mem_cache/memory_pool.py:1223", "empty_ring_on_cpu_load", "retract_backup"),
)


def applied_hooks(*, import_modules: bool = True) -> list[Hook]:
    """The hooks of :data:`HOOKS` that are currently patched into SGLang in this process."""
    return hook_table.applied(HOOKS, import_modules=import_modules)


def register() -> str:
    """Register the hooks of the enabled fixes with SGLang's HookRegistry; say what was enabled.

    Idempotent (:func:`hook_table.register`). SGLang applies the registry after its plugins have
    registered (``load_plugins``); tests call :func:`install`.
    """
    if not config.adapter_enabled():
        return f"nothing ({config.ADAPTER_ENV}=0)"
    fixes = config.enabled_fixes()
    hook_table.register(HOOKS, fixes)
    if not fixes:
        return "radix adapter with every fix disabled"
    return f"radix adapter ({len(fixes)}/{len(config.FIXES)} fixes: {', '.join(fixes)})"


def install() -> list[Hook]:
    """Register and apply the hooks now, then clear the registry; returns the applied hooks.

    For tests and scripts, where no ``load_plugins`` runs: applying is permanent for the process,
    so hooks are switched at run time with :func:`config.override`. Idempotent.
    """
    if config.adapter_enabled():
        return hook_table.install(HOOKS, config.enabled_fixes())
    return applied_hooks()
