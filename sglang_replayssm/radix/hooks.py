"""Every hook the radix adapter installs into SGLang 0.5.23, in one place, each naming its target.

The hooks are thin: each checks its fix switch (:mod:`config`) and either calls SGLang's original
unchanged (fix off = SGLang's behaviour) or the adapter logic in a sibling module:

==============================  ======  =====================================================
hook function                   type    target (file:line in SGLang 0.5.23)
==============================  ======  =====================================================
``admit_linear_attn``           AROUND  ``attention_hook.handle_linear_attn_backend``
                                        (sglang/srt/arg_groups/attention_hook.py:281)
``kda_flush_forward_metadata``  AROUND  ``MambaAttnBackendBase._forward_metadata``
                                        (sglang/srt/layers/attention/hybrid_linear_attn_backend.py:166)
``kda_flush_replay_metadata``   AROUND  ``MambaAttnBackendBase._replay_metadata``
                                        (sglang/srt/layers/attention/hybrid_linear_attn_backend.py:747)
``device_cursor_eager``         AROUND  ``MambaAttnBackendBase._forward_metadata``
                                        (sglang/srt/layers/attention/hybrid_linear_attn_backend.py:166)
``device_cursor_graph``         AROUND  ``MambaAttnBackendBase.init_forward_metadata_out_graph``
                                        (sglang/srt/layers/attention/hybrid_linear_attn_backend.py:368)
``exact_track_decode``          AROUND  ``MambaAttnBackendBase._track_mamba_state_decode``
                                        (sglang/srt/layers/attention/hybrid_linear_attn_backend.py:975)
``exact_copy_from``             AROUND  ``MambaPool.copy_from``
                                        (sglang/srt/mem_cache/memory_pool.py:1163)
``link_slot_allocator``         AFTER   ``HybridReqToTokenPool._init_mamba_pool``
                                        (sglang/srt/mem_cache/memory_pool.py:1426)
``empty_ring_on_alloc``         AFTER   ``MambaSlotAllocator.alloc``
                                        (sglang/srt/mem_cache/allocator/mamba.py:65)
``empty_ring_on_int8_load``     AFTER   ``MambaCheckpointPool.load_to_active``
                                        (sglang/srt/mem_cache/mamba_checkpoint_pool.py:254)
``exact_finish_donation``       AROUND  ``MambaComponent.prepare_for_caching_req``
                                        (sglang/srt/mem_cache/unified_cache/components/mamba.py:604)
``record_lost_hit``             AFTER   ``MambaComponent.finalize_match_result_in_cache``
                                        (sglang/srt/mem_cache/unified_cache/components/mamba.py:196)
``collect_lost_hit``            AFTER   ``PrefillStats.from_adder`` (classmethod)
                                        (sglang/srt/managers/scheduler_components/metrics_reporter.py:136)
``report_lost_hit``             AROUND  ``SchedulerMetricsReporter.report_prefill_stats``
                                        (sglang/srt/managers/scheduler_components/metrics_reporter.py:719)
``charge_ring_budget``          AROUND  ``KVCacheConfigurator._handle_max_mamba_cache``
                                        (sglang/srt/mem_cache/kv_cache_configurator.py:3229)
``gdn_ring_kernel``             AROUND  ``TritonGDNKernel.packed_decode``
                                        (sglang/srt/layers/attention/linear/kernels/gdn_triton.py:46)
``kda_ring_kernel``             AROUND  ``TritonKDAKernel.packed_decode``
                                        (sglang/srt/layers/attention/linear/kernels/kda_triton.py:37)
``fold_rows_before_extend``     AROUND  ``ModelRunner._maybe_execute_deferred_mamba_cow_and_clear``
                                        (sglang/srt/model_executor/model_runner.py:1915)
``exact_cpu_copy``              AROUND  ``MambaPool.get_cpu_copy``
                                        (sglang/srt/mem_cache/memory_pool.py:1208)
``empty_ring_on_cpu_load``      AFTER   ``MambaPool.load_cpu_copy``
                                        (sglang/srt/mem_cache/memory_pool.py:1223)
==============================  ======  =====================================================

All hooks are method/function hooks through ``sglang.srt.plugins.hook_registry.HookRegistry``;
none mutates SGLang's dicts or class attributes (``MambaComponent`` is hooked on the class that
``COMPONENT_REGISTRY`` already holds). :func:`register` is idempotent and cheap: it registers each
hook of an enabled fix once per process, skipping hooks already pending in the registry or
already applied (also across ``HookRegistry.reset()``, which forgets registrations but does not
undo patches).
"""

from __future__ import annotations

import pkgutil
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sglang_replayssm.radix import config

__all__ = ["HOOKS", "Hook", "applied_hooks", "install", "register"]


# ---- arguments -------------------------------------------------------------------------------


def admit_linear_attn(original: Callable[..., Any], server_args: Any) -> Any:
    """AROUND sglang/srt/arg_groups/attention_hook.py:281 ``handle_linear_attn_backend``."""
    if not config.enabled("admission"):
        return original(server_args)
    from sglang_replayssm.radix.admission import admit_linear_attn_args

    return admit_linear_attn_args(original, server_args)


# ---- decode kernels ----------------------------------------------------------------------------


def gdn_ring_kernel(original: Callable[..., Any], kernel: Any, *args: Any, **kwargs: Any) -> Any:
    """AROUND sglang/srt/layers/attention/linear/kernels/gdn_triton.py:46 ``packed_decode``."""
    if not config.enabled("ring_kernels"):
        return original(kernel, *args, **kwargs)
    from sglang_replayssm.radix.kernel_binding import ring_packed_decode

    return ring_packed_decode(original, kernel, *args, is_kda=False, **kwargs)


def kda_ring_kernel(original: Callable[..., Any], kernel: Any, *args: Any, **kwargs: Any) -> Any:
    """AROUND sglang/srt/layers/attention/linear/kernels/kda_triton.py:37 ``packed_decode``."""
    if not config.enabled("ring_kernels"):
        return original(kernel, *args, **kwargs)
    from sglang_replayssm.radix.kernel_binding import ring_packed_decode

    return ring_packed_decode(original, kernel, *args, is_kda=True, **kwargs)


# ---- decode metadata and track snapshot ------------------------------------------------------


def kda_flush_forward_metadata(original: Callable[..., Any], backend: Any, *args: Any, **kwargs: Any) -> Any:
    """AROUND sglang/srt/layers/attention/hybrid_linear_attn_backend.py:166 ``_forward_metadata``."""
    if not config.enabled("kda_force_flush"):
        return original(backend, *args, **kwargs)
    from sglang_replayssm.radix.flush import with_kda_force_flush

    return with_kda_force_flush(original, backend, *args, **kwargs)


def kda_flush_replay_metadata(original: Callable[..., Any], backend: Any, *args: Any, **kwargs: Any) -> Any:
    """AROUND sglang/srt/layers/attention/hybrid_linear_attn_backend.py:747 ``_replay_metadata``."""
    if not config.enabled("kda_force_flush"):
        return original(backend, *args, **kwargs)
    from sglang_replayssm.radix.flush import with_kda_force_flush

    return with_kda_force_flush(original, backend, *args, **kwargs)


def device_cursor_eager(original: Callable[..., Any], backend: Any, *args: Any, **kwargs: Any) -> Any:
    """AROUND sglang/srt/layers/attention/hybrid_linear_attn_backend.py:166 ``_forward_metadata``."""
    if not config.enabled("device_cursor"):
        return original(backend, *args, **kwargs)
    from sglang_replayssm.radix.device_cursor import device_forward_metadata

    return device_forward_metadata(original, backend, *args, **kwargs)


def device_cursor_graph(original: Callable[..., Any], backend: Any, *args: Any, **kwargs: Any) -> Any:
    """AROUND sglang/srt/layers/attention/hybrid_linear_attn_backend.py:368 ``init_forward_metadata_out_graph``
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
    """AROUND sglang/srt/layers/attention/hybrid_linear_attn_backend.py:975 ``_track_mamba_state_decode``."""
    if not config.enabled("materialize_track"):
        return original(backend, forward_batch, conv_states, ssm_states, cache_indices, layer_id)
    from sglang_replayssm.radix.snapshot import track_decode_exact

    return track_decode_exact(
        original, backend, forward_batch, conv_states, ssm_states, cache_indices, layer_id
    )


# ---- slot movers and the cursor choke point --------------------------------------------------


def exact_copy_from(original: Callable[..., Any], mamba_pool: Any, src_indices: Any, dst_indices: Any) -> Any:
    """AROUND sglang/srt/mem_cache/memory_pool.py:1163 ``MambaPool.copy_from``."""
    if not (config.enabled("materialize_copy") and config.enabled("cursor_reset")):
        return original(mamba_pool, src_indices, dst_indices)
    from sglang_replayssm.radix.snapshot import copy_from_exact

    return copy_from_exact(original, mamba_pool, src_indices, dst_indices)


def link_slot_allocator(result: Any, req_to_token_pool: Any, *args: Any, **kwargs: Any) -> None:
    """AFTER sglang/srt/mem_cache/memory_pool.py:1426 ``HybridReqToTokenPool._init_mamba_pool``."""
    from sglang_replayssm.radix.cursor import link_allocator

    link_allocator(req_to_token_pool)


def empty_ring_on_alloc(result: Any, allocator: Any, *args: Any, **kwargs: Any) -> None:
    """AFTER sglang/srt/mem_cache/allocator/mamba.py:65 ``MambaSlotAllocator.alloc``."""
    if result is None or not config.enabled("cursor_reset"):
        return
    from sglang_replayssm.radix.cursor import linked_write_pos, reset_cursors

    reset_cursors(linked_write_pos(allocator), result)


def empty_ring_on_int8_load(
    result: Any, ckpt_pool: Any, active_mamba_pool: Any, ckpt_slots: Any, active_slots: Any
) -> None:
    """AFTER sglang/srt/mem_cache/mamba_checkpoint_pool.py:254 ``MambaCheckpointPool.load_to_active``."""
    if not config.enabled("cursor_reset") or not getattr(active_mamba_pool, "enable_linear_replayssm", False):
        return
    from sglang_replayssm.radix.cursor import reset_cursors

    reset_cursors(getattr(active_mamba_pool, "replayssm_write_pos", None), active_slots)


# ---- extend over pending records, CPU retraction backup --------------------------------------


def fold_rows_before_extend(original: Callable[..., Any], runner: Any, forward_batch: Any) -> Any:
    """AROUND sglang/srt/model_executor/model_runner.py:1915 ``_maybe_execute_deferred_mamba_cow_and_clear``."""
    if not config.enabled("extend_fold"):
        return original(runner, forward_batch)
    from sglang_replayssm.radix.movers import fold_before_extend

    return fold_before_extend(original, runner, forward_batch)


def exact_cpu_copy(original: Callable[..., Any], mamba_pool: Any, indices: Any) -> Any:
    """AROUND sglang/srt/mem_cache/memory_pool.py:1208 ``MambaPool.get_cpu_copy``."""
    if not config.enabled("retract_backup"):
        return original(mamba_pool, indices)
    from sglang_replayssm.radix.movers import cpu_copy_exact

    return cpu_copy_exact(original, mamba_pool, indices)


def empty_ring_on_cpu_load(result: Any, mamba_pool: Any, mamba_cache_cpu: Any, indices: Any) -> None:
    """AFTER sglang/srt/mem_cache/memory_pool.py:1223 ``MambaPool.load_cpu_copy``."""
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
    """AROUND sglang/srt/mem_cache/unified_cache/components/mamba.py:604 ``prepare_for_caching_req``."""
    if config.enabled("finish_donation"):
        from sglang_replayssm.radix.donation import materialize_before_finish_donation

        materialize_before_finish_donation(component, req, is_finished)
    return original(component, req, insert_params, token_ids_len, is_finished)


def record_lost_hit(result: Any, component: Any, params: Any, match_result: Any) -> None:
    """AFTER sglang/srt/mem_cache/unified_cache/components/mamba.py:196 ``finalize_match_result_in_cache``."""
    if not config.enabled("lost_hit_metric"):
        return
    from sglang_replayssm.radix.metrics import record_match

    record_match(params, result if result is not None else match_result)


# ---- metrics and memory budget ---------------------------------------------------------------


def collect_lost_hit(stats: Any, cls: Any, adder: Any, *args: Any, **kwargs: Any) -> None:
    """AFTER sglang/srt/managers/scheduler_components/metrics_reporter.py:136 ``PrefillStats.from_adder``."""
    if not config.enabled("lost_hit_metric"):
        return
    from sglang_replayssm.radix.metrics import collect_for_prefill

    collect_for_prefill(stats, getattr(adder, "can_run_list", ()))


def report_lost_hit(original: Callable[..., Any], reporter: Any, *args: Any, **kwargs: Any) -> Any:
    """AROUND sglang/srt/managers/scheduler_components/metrics_reporter.py:719 ``report_prefill_stats``."""
    if not config.enabled("lost_hit_metric"):
        return original(reporter, *args, **kwargs)
    from sglang_replayssm.radix.metrics import report_prefill

    return report_prefill(original, reporter, *args, **kwargs)


def charge_ring_budget(original: Callable[..., Any], configurator: Any, total_rest_memory: float) -> Any:
    """AROUND sglang/srt/mem_cache/kv_cache_configurator.py:3229 ``_handle_max_mamba_cache``."""
    if not config.enabled("ring_budget"):
        return original(configurator, total_rest_memory)
    from sglang_replayssm.radix.budget import charge_decode_ring

    return charge_decode_ring(original, configurator, total_rest_memory)


# ---- the table and registration --------------------------------------------------------------


@dataclass(frozen=True)
class Hook:
    """One hook: the SGLang target (dotted path), how it wraps, the adapter function, its fix."""

    target: str
    kind: str  # a HookType member name: BEFORE / AFTER / AROUND / REPLACE
    fn: Callable[..., Any]
    fix: str
    sglang_file: str


_BACKEND = "sglang.srt.layers.attention.hybrid_linear_attn_backend.MambaAttnBackendBase"
_MAMBA_COMPONENT = "sglang.srt.mem_cache.unified_cache.components.mamba.MambaComponent"
_REPORTER = "sglang.srt.managers.scheduler_components.metrics_reporter"

HOOKS: tuple[Hook, ...] = (
    Hook(
        "sglang.srt.arg_groups.attention_hook.handle_linear_attn_backend",
        "AROUND",
        admit_linear_attn,
        "admission",
        "sglang/srt/arg_groups/attention_hook.py:281",
    ),
    Hook(
        f"{_BACKEND}._forward_metadata",
        "AROUND",
        kda_flush_forward_metadata,
        "kda_force_flush",
        "sglang/srt/layers/attention/hybrid_linear_attn_backend.py:166",
    ),
    Hook(
        f"{_BACKEND}._replay_metadata",
        "AROUND",
        kda_flush_replay_metadata,
        "kda_force_flush",
        "sglang/srt/layers/attention/hybrid_linear_attn_backend.py:747",
    ),
    Hook(
        f"{_BACKEND}._forward_metadata",
        "AROUND",
        device_cursor_eager,
        "device_cursor",
        "sglang/srt/layers/attention/hybrid_linear_attn_backend.py:166",
    ),
    Hook(
        f"{_BACKEND}.init_forward_metadata_out_graph",
        "AROUND",
        device_cursor_graph,
        "device_cursor",
        "sglang/srt/layers/attention/hybrid_linear_attn_backend.py:368",
    ),
    Hook(
        f"{_BACKEND}._track_mamba_state_decode",
        "AROUND",
        exact_track_decode,
        "materialize_track",
        "sglang/srt/layers/attention/hybrid_linear_attn_backend.py:975",
    ),
    Hook(
        "sglang.srt.mem_cache.memory_pool.MambaPool.copy_from",
        "AROUND",
        exact_copy_from,
        "materialize_copy",
        "sglang/srt/mem_cache/memory_pool.py:1163",
    ),
    Hook(
        "sglang.srt.mem_cache.memory_pool.HybridReqToTokenPool._init_mamba_pool",
        "AFTER",
        link_slot_allocator,
        "cursor_reset",
        "sglang/srt/mem_cache/memory_pool.py:1426",
    ),
    Hook(
        "sglang.srt.mem_cache.allocator.mamba.MambaSlotAllocator.alloc",
        "AFTER",
        empty_ring_on_alloc,
        "cursor_reset",
        "sglang/srt/mem_cache/allocator/mamba.py:65",
    ),
    Hook(
        "sglang.srt.mem_cache.mamba_checkpoint_pool.MambaCheckpointPool.load_to_active",
        "AFTER",
        empty_ring_on_int8_load,
        "cursor_reset",
        "sglang/srt/mem_cache/mamba_checkpoint_pool.py:254",
    ),
    Hook(
        f"{_MAMBA_COMPONENT}.prepare_for_caching_req",
        "AROUND",
        exact_finish_donation,
        "finish_donation",
        "sglang/srt/mem_cache/unified_cache/components/mamba.py:604",
    ),
    Hook(
        f"{_MAMBA_COMPONENT}.finalize_match_result_in_cache",
        "AFTER",
        record_lost_hit,
        "lost_hit_metric",
        "sglang/srt/mem_cache/unified_cache/components/mamba.py:196",
    ),
    Hook(
        f"{_REPORTER}.PrefillStats.from_adder",
        "AFTER",
        collect_lost_hit,
        "lost_hit_metric",
        "sglang/srt/managers/scheduler_components/metrics_reporter.py:136",
    ),
    Hook(
        f"{_REPORTER}.SchedulerMetricsReporter.report_prefill_stats",
        "AROUND",
        report_lost_hit,
        "lost_hit_metric",
        "sglang/srt/managers/scheduler_components/metrics_reporter.py:719",
    ),
    Hook(
        "sglang.srt.mem_cache.kv_cache_configurator.KVCacheConfigurator._handle_max_mamba_cache",
        "AROUND",
        charge_ring_budget,
        "ring_budget",
        "sglang/srt/mem_cache/kv_cache_configurator.py:3229",
    ),
    Hook(
        "sglang.srt.layers.attention.linear.kernels.gdn_triton.TritonGDNKernel.packed_decode",
        "AROUND",
        gdn_ring_kernel,
        "ring_kernels",
        "sglang/srt/layers/attention/linear/kernels/gdn_triton.py:46",
    ),
    Hook(
        "sglang.srt.layers.attention.linear.kernels.kda_triton.TritonKDAKernel.packed_decode",
        "AROUND",
        kda_ring_kernel,
        "ring_kernels",
        "sglang/srt/layers/attention/linear/kernels/kda_triton.py:37",
    ),
    Hook(
        "sglang.srt.model_executor.model_runner.ModelRunner._maybe_execute_deferred_mamba_cow_and_clear",
        "AROUND",
        fold_rows_before_extend,
        "extend_fold",
        "sglang/srt/model_executor/model_runner.py:1915",
    ),
    Hook(
        "sglang.srt.mem_cache.memory_pool.MambaPool.get_cpu_copy",
        "AROUND",
        exact_cpu_copy,
        "retract_backup",
        "sglang/srt/mem_cache/memory_pool.py:1208",
    ),
    Hook(
        "sglang.srt.mem_cache.memory_pool.MambaPool.load_cpu_copy",
        "AFTER",
        empty_ring_on_cpu_load,
        "retract_backup",
        "sglang/srt/mem_cache/memory_pool.py:1223",
    ),
)


def _live_attr(target: str, *, import_modules: bool = True) -> Any:
    """The object currently at ``target`` (classmethod/staticmethod unwrapped).

    With ``import_modules=False`` nothing is imported: a target whose module is not imported yet
    cannot have been patched, and None is returned (keeps :func:`register` cheap in processes
    that never import the runtime, e.g. the detokenizer).
    """
    owner_path, name = target.rsplit(".", 1)
    if import_modules:
        owner = pkgutil.resolve_name(owner_path)
    else:
        parts = owner_path.split(".")
        for i in range(len(parts), 0, -1):
            module = sys.modules.get(".".join(parts[:i]))
            if module is not None:
                break
        else:
            return None
        owner = module
        for attr in parts[i:]:
            owner = getattr(owner, attr, None)
            if owner is None:
                return None
    raw = owner.__dict__.get(name) if isinstance(owner, type) else None
    if isinstance(raw, (classmethod, staticmethod)):
        return raw.__func__
    return getattr(owner, name, None)


def _wraps_hook(live: Any, hook_fn: Callable[..., Any]) -> bool:
    """Whether ``hook_fn`` is in the wrapper chain HookRegistry built at ``live``."""
    fn, depth = live, 0
    while fn is not None and depth < 64:
        for cell in getattr(fn, "__closure__", None) or ():
            try:
                if cell.cell_contents is hook_fn:
                    return True
            except ValueError:  # empty cell
                continue
        fn, depth = getattr(fn, "__wrapped__", None), depth + 1
    return False


def applied_hooks(*, import_modules: bool = True) -> list[Hook]:
    """The hooks of :data:`HOOKS` that are currently patched into SGLang in this process
    (``import_modules=False``: looking only at modules already imported)."""
    out = []
    for hook in HOOKS:
        try:
            live = _live_attr(hook.target, import_modules=import_modules)
        except (ImportError, AttributeError, ValueError):
            continue
        if live is not None and _wraps_hook(live, hook.fn):
            out.append(hook)
    return out


def register() -> str:
    """Register the hooks of the enabled fixes with SGLang's HookRegistry; say what was enabled.

    Idempotent: a hook already pending in the registry, or already applied in this process, is
    not registered again. SGLang applies the registry after its plugins have registered
    (``load_plugins``); tests call ``HookRegistry.apply_hooks()`` themselves.
    """
    if not config.adapter_enabled():
        return f"nothing ({config.ADAPTER_ENV}=0)"
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    fixes = config.enabled_fixes()
    applied = {id(h) for h in applied_hooks(import_modules=False)}
    for hook in HOOKS:
        if hook.fix not in fixes or id(hook) in applied:
            continue
        pending = HookRegistry._hooks.get(hook.target, ())
        if any(fn is hook.fn for _, fn, _ in pending):
            continue
        HookRegistry.register(hook.target, hook.fn, HookType[hook.kind])
    if not fixes:
        return "radix adapter with every fix disabled"
    return f"radix adapter ({len(fixes)}/{len(config.FIXES)} fixes: {', '.join(fixes)})"


def install() -> list[Hook]:
    """Register and apply the hooks now, then clear the registry; returns the applied hooks.

    For tests and scripts, where no ``load_plugins`` runs: applying is permanent for the process
    (``HookRegistry.reset()`` forgets registrations, not patches), so hooks are switched at run time
    with :func:`config.override`. Idempotent: a second call applies nothing twice.
    """
    from sglang.srt.plugins.hook_registry import HookRegistry

    register()
    HookRegistry.apply_hooks()
    HookRegistry.reset()
    return applied_hooks()
