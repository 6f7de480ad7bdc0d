"""Every hook the radix adapter installs into SGLang 0.5.23: the core's own, then each room's table.

Each hook is a :class:`~sglang_replayssm.hook_table.Hook` record naming its target, its SGLang
file:line and its fix switch (:mod:`config`) once (checked against the installed source by
``tests/test_hook_table.py``), built by :func:`~sglang_replayssm.radix.gated.gated_hook`, and calls the
adapter logic in its room, imported on first use. A hook runs behind its switch: with the fix off it is
SGLang's function (AROUND: the original with the same arguments; AFTER: no change). Where several hooks
share a target, SGLang sees one composed hook that runs them in the order written in
:mod:`sglang_replayssm.hook_order`. None mutates SGLang's dicts or class attributes
(``MambaComponent`` is hooked on the class ``COMPONENT_REGISTRY`` holds); :func:`register` is idempotent.

This module is the one place that knows every room: it assembles their tables (:data:`ROOMS`) and
installs each room's parts of core behaviours (``install()``) before any hook is registered.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sglang_replayssm import hook_table
from sglang_replayssm.hook_table import Hook
from sglang_replayssm.radix import config
from sglang_replayssm.radix.eviction import hooks as eviction_hooks
from sglang_replayssm.radix.gated import gated_hook
from sglang_replayssm.radix.pd import hooks as pd_hooks
from sglang_replayssm.radix.read_copy import hooks as read_copy_hooks
from sglang_replayssm.radix.records import hooks as records_hooks
from sglang_replayssm.radix.records.hicache import hooks as hicache_hooks
from sglang_replayssm.radix.ring import hooks as ring_hooks
from sglang_replayssm.radix.spec import hooks as spec_hooks

__all__ = [
    "CORE_HOOKS", "HOOKS", "ROOMS", "Hook", "applied_hooks", "hook_fn", "install", "install_rooms", "register",
]  # fmt: skip

_REPORTER = "sglang.srt.managers.scheduler_components.metrics_reporter"


def admit_linear_attn(original: Callable[..., Any], server_args: Any) -> Any:
    """Admit extra_buffer with the decode ring; refuse what the adapter cannot make exact."""
    from sglang_replayssm.radix.admission import admit_linear_attn_args

    return admit_linear_attn_args(original, server_args)


def record_lost_hit(result: Any, component: Any, params: Any, match_result: Any) -> None:
    """Count the prompt tokens whose KV hit was dropped for lack of a mamba state."""
    from sglang_replayssm.radix.metrics import record_match

    record_match(params, result if result is not None else match_result)


def collect_lost_hit(stats: Any, cls: Any, adder: Any, *args: Any, **kwargs: Any) -> None:
    """Carry the lost-hit count into the prefill stats."""
    from sglang_replayssm.radix.metrics import collect_for_prefill

    collect_for_prefill(stats, getattr(adder, "can_run_list", ()))


def report_lost_hit(original: Callable[..., Any], reporter: Any, *args: Any, **kwargs: Any) -> Any:
    """Report the lost-hit count with the prefill stats."""
    from sglang_replayssm.radix.metrics import report_prefill

    return report_prefill(original, reporter, *args, **kwargs)


def report_gauges(result: Any, reporter: Any, *args: Any, **kwargs: Any) -> None:
    """Refresh the leak-accounting gauges where SGLang reports its own (rate-limited, radix/metrics.py)."""
    from sglang_replayssm.radix.metrics import maybe_update_gauges

    maybe_update_gauges(reporter)


def charge_ring_budget(original: Callable[..., Any], configurator: Any, total_rest_memory: float) -> Any:
    """Charge the decode ring to the mamba memory budget."""
    from sglang_replayssm.radix.budget import charge_decode_ring

    return charge_decode_ring(original, configurator, total_rest_memory)


def session_state_depth(original: Callable[..., Any], session: Any, req: Any) -> Any:
    """A finished streaming turn keeps its record at its state's depth (or releases the slot)."""
    from sglang_replayssm.radix.session_depth import finish_at_state_depth
    return finish_at_state_depth(original, session, req)


#: The core's own hooks: admission, lost-hit metric, leak gauges, memory budget, streaming-session depth.
CORE_HOOKS: tuple[Hook, ...] = (
    gated_hook("sglang.srt.arg_groups.attention_hook.handle_linear_attn_backend", "AROUND", admit_linear_attn,
               at="sglang/srt/arg_groups/attention_hook.py:281", fix="admission"),
    gated_hook("sglang.srt.mem_cache.unified_cache.components.mamba.MambaComponent.finalize_match_result_in_cache",
               "AFTER", record_lost_hit, at="sglang/srt/mem_cache/unified_cache/components/mamba.py:196",
               fix="lost_hit_metric"),
    gated_hook(f"{_REPORTER}.PrefillStats.from_adder", "AFTER", collect_lost_hit,
               at="sglang/srt/managers/scheduler_components/metrics_reporter.py:136", fix="lost_hit_metric"),
    gated_hook(f"{_REPORTER}.SchedulerMetricsReporter.report_prefill_stats", "AROUND", report_lost_hit,
               at="sglang/srt/managers/scheduler_components/metrics_reporter.py:719", fix="lost_hit_metric"),
    gated_hook(f"{_REPORTER}.SchedulerMetricsReporter.report_decode_stats", "AFTER", report_gauges,
               at="sglang/srt/managers/scheduler_components/metrics_reporter.py:901", fix="leak_gauges"),
    gated_hook(f"{_REPORTER}.SchedulerMetricsReporter._maybe_log_idle_metrics", "AFTER", report_gauges,
               at="sglang/srt/managers/scheduler_components/metrics_reporter.py:1476", fix="leak_gauges",
               name="report_gauges_idle"),
    gated_hook("sglang.srt.mem_cache.kv_cache_configurator.KVCacheConfigurator._handle_max_mamba_cache", "AROUND",
               charge_ring_budget, at="sglang/srt/mem_cache/kv_cache_configurator.py:3229", fix="ring_budget"),
    gated_hook("sglang.srt.session.streaming_session.StreamingSession.try_cache_finished_req", "AROUND",
               session_state_depth, at="sglang/srt/session/streaming_session.py:156", fix="session_state_depth"),
)

#: Each room's hooks table, and its ``install`` of its parts of core behaviours (None: nothing to install).
ROOMS: dict[str, tuple[tuple[Hook, ...], Callable[[], None] | None]] = {
    "ring": (ring_hooks.RING_HOOKS, ring_hooks.install),
    "records": (records_hooks.RECORD_HOOKS, records_hooks.install),
    "records.hicache": (hicache_hooks.HICACHE_HOOKS + hicache_hooks.HOST_HIT_HOOKS + hicache_hooks.STORAGE_HOOKS
                         + hicache_hooks.PLANT_BUDGET_HOOKS,
                        None),
    "spec": (spec_hooks.SPEC_HOOKS, None),
    "pd": (pd_hooks.PD_HOOKS, pd_hooks.install),
    "read_copy": (read_copy_hooks.READ_COPY_HOOKS, read_copy_hooks.install),
    "eviction": (eviction_hooks.EVICTION_HOOKS, None),
}

#: Every hook of the radix adapter: the core's, then each room's.
HOOKS: tuple[Hook, ...] = CORE_HOOKS + tuple(hook for table, _ in ROOMS.values() for hook in table)


def hook_fn(name: str) -> Callable[..., Any]:
    """The function registered for the hook named ``name`` (behind its fix switch where it is gated)."""
    return next(hook.fn for hook in HOOKS if hook.name == name)


def install_rooms() -> None:
    """Install every room's parts of core behaviours (budget shares, admission checks, metrics, the
    end-state donation); idempotent. Run by :func:`register` and :func:`install`."""
    for _, room_install in ROOMS.values():
        if room_install is not None:
            room_install()


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
    install_rooms()
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
        install_rooms()
        return hook_table.install(HOOKS, config.enabled_fixes())
    return applied_hooks()
