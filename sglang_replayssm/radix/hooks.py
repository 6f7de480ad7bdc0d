"""Every hook the radix adapter installs into SGLang 0.5.23, each with its target beside it.

The hooks are thin: each names its target, its SGLang file:line and its fix switch (:mod:`config`)
once, in its ``@_hook`` line (collected into :data:`HOOKS`, checked against the installed source by
``tests/test_hook_table.py``), and calls the adapter logic in a sibling module, imported on first
use. A hook runs behind its switch: with the fix off it is SGLang's function (AROUND: the original
with the same arguments; AFTER: no change). The two decode-metadata hooks carry two fixes and
switch each part themselves (:mod:`decode_metadata`). All are method/function hooks through
``HookRegistry``; none mutates SGLang's dicts or class attributes (``MambaComponent`` is hooked on
the class ``COMPONENT_REGISTRY`` holds); :func:`register` is idempotent.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from sglang_replayssm import hook_table
from sglang_replayssm.hook_table import Hook, HookKind
from sglang_replayssm.radix import config
from sglang_replayssm.radix.pd.hits import PD_HIT_HOOKS
from sglang_replayssm.radix.read_copy.hooks import READ_COPY_HOOKS
from sglang_replayssm.radix.records.hicache.hooks import HICACHE_HOOKS, HOST_HIT_HOOKS, STORAGE_HOOKS

__all__ = ["HOOKS", "Hook", "applied_hooks", "install", "register"]

_BACKEND = "sglang.srt.layers.attention.hybrid_linear_attn_backend.MambaAttnBackendBase"
_MAMBA_COMPONENT = "sglang.srt.mem_cache.unified_cache.components.mamba.MambaComponent"
_REPORTER = "sglang.srt.managers.scheduler_components.metrics_reporter"
_TABLE: list[Hook] = []


def _gated(body: Callable[..., Any], kind: HookKind, fix: str) -> Callable[..., Any]:
    """``body`` behind its fix switch: while ``fix`` is off an AROUND hook calls SGLang's function
    with the same arguments and an AFTER hook changes nothing (SGLang's behaviour)."""
    if kind == "AROUND":

        @functools.wraps(body)
        def around(original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
            if not config.enabled(fix):
                return original(*args, **kwargs)
            return body(original, *args, **kwargs)

        return around
    if kind != "AFTER":
        raise ValueError(f"no switch for a {kind} hook")

    @functools.wraps(body)
    def after(result: Any, *args: Any, **kwargs: Any) -> Any:
        return body(result, *args, **kwargs) if config.enabled(fix) else None

    return after


def _hook(
    target: str, kind: HookKind, *, at: str, fix: str | None = None, gate: bool = True
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator: record the function in :data:`HOOKS` (registered only while ``fix`` is on) and,
    with ``gate``, run it behind that switch (:func:`_gated`); returns what is registered."""

    def add(body: Callable[..., Any]) -> Callable[..., Any]:
        fn = _gated(body, kind, fix) if fix is not None and gate else body
        _TABLE.append(Hook(target, kind, fn, at, body.__name__, fix))
        return fn

    return add


# ---- arguments -------------------------------------------------------------------------------


@_hook("sglang.srt.arg_groups.attention_hook.handle_linear_attn_backend", "AROUND",
       at="sglang/srt/arg_groups/attention_hook.py:281", fix="admission")
def admit_linear_attn(original: Callable[..., Any], server_args: Any) -> Any:
    """Admit extra_buffer with the decode ring; refuse what the adapter cannot make exact."""
    from sglang_replayssm.radix.admission import admit_linear_attn_args

    return admit_linear_attn_args(original, server_args)


# ---- decode kernels ----------------------------------------------------------------------------


@_hook("sglang.srt.layers.attention.linear.kernels.gdn_triton.TritonGDNKernel.packed_decode", "AROUND",
       at="sglang/srt/layers/attention/linear/kernels/gdn_triton.py:46", fix="ring_kernels")
def gdn_ring_kernel(original: Callable[..., Any], kernel: Any, *args: Any, **kwargs: Any) -> Any:
    """GDN packed decode on CUDA: sglang-replayssm's ring decode kernel."""
    from sglang_replayssm.radix.ring.kernel_binding import ring_packed_decode

    return ring_packed_decode(original, kernel, *args, is_kda=False, **kwargs)


@_hook("sglang.srt.layers.attention.linear.kernels.kda_triton.TritonKDAKernel.packed_decode", "AROUND",
       at="sglang/srt/layers/attention/linear/kernels/kda_triton.py:37", fix="ring_kernels")
def kda_ring_kernel(original: Callable[..., Any], kernel: Any, *args: Any, **kwargs: Any) -> Any:
    """KDA packed decode on CUDA: sglang-replayssm's ring decode kernel."""
    from sglang_replayssm.radix.ring.kernel_binding import ring_packed_decode

    return ring_packed_decode(original, kernel, *args, is_kda=True, **kwargs)


# ---- decode metadata and track snapshot ------------------------------------------------------


@_hook(f"{_BACKEND}._forward_metadata", "AROUND",
       at="sglang/srt/layers/attention/hybrid_linear_attn_backend.py:166")
def decode_metadata_eager(original: Callable[..., Any], backend: Any, *args: Any, **kwargs: Any) -> Any:
    """Eager decode metadata: KDA force flush, then the device cursor (each behind its own fix)."""
    if not (config.enabled("kda_force_flush") or config.enabled("device_cursor")):
        return original(backend, *args, **kwargs)
    from sglang_replayssm.radix.ring.decode_metadata import forward_metadata

    return forward_metadata(original, backend, *args, **kwargs)


@_hook(f"{_BACKEND}.init_forward_metadata_out_graph", "AROUND",
       at="sglang/srt/layers/attention/hybrid_linear_attn_backend.py:368")
def decode_metadata_graph(original: Callable[..., Any], backend: Any, *args: Any, **kwargs: Any) -> Any:
    """CUDA-graph decode metadata (it calls ``_replay_metadata`` and alone holds the device
    ``seq_lens``): KDA force flush, then the device cursor (each behind its own fix)."""
    if not (config.enabled("kda_force_flush") or config.enabled("device_cursor")):
        return original(backend, *args, **kwargs)
    from sglang_replayssm.radix.ring.decode_metadata import out_graph_metadata

    return out_graph_metadata(original, backend, *args, **kwargs)


@_hook(f"{_BACKEND}._track_mamba_state_decode", "AROUND",
       at="sglang/srt/layers/attention/hybrid_linear_attn_backend.py:975", fix="materialize_track")
def exact_track_decode(original: Callable[..., Any], backend: Any, forward_batch: Any, conv_states: Any,
                       ssm_states: Any, cache_indices: Any, layer_id: int | None = None) -> Any:
    """The decode track snapshot folds the working slot's pending records."""
    from sglang_replayssm.radix.ring.snapshot import track_decode_exact

    return track_decode_exact(
        original, backend, forward_batch, conv_states, ssm_states, cache_indices, layer_id
    )


# ---- slot movers and the cursor choke point --------------------------------------------------


@_hook("sglang.srt.mem_cache.memory_pool.MambaPool.copy_from", "AROUND",
       at="sglang/srt/mem_cache/memory_pool.py:1163", fix="materialize_copy")
def exact_copy_from(original: Callable[..., Any], mamba_pool: Any, src_indices: Any, dst_indices: Any) -> Any:
    """A slot copy folds the source's pending records into the destination."""
    if not config.enabled("cursor_reset"):  # a record count is trusted only if every slot starts empty
        return original(mamba_pool, src_indices, dst_indices)
    from sglang_replayssm.radix.ring.snapshot import copy_from_exact

    return copy_from_exact(original, mamba_pool, src_indices, dst_indices)


@_hook("sglang.srt.mem_cache.memory_pool.HybridReqToTokenPool._init_mamba_pool", "AFTER",
       at="sglang/srt/mem_cache/memory_pool.py:1426", fix="cursor_reset", gate=False)
def link_slot_allocator(result: Any, req_to_token_pool: Any, *args: Any, **kwargs: Any) -> None:
    """Link the new slot allocator to the pool's cursor (whatever the fixes: a link does nothing)."""
    from sglang_replayssm.radix.ring.alloc_reset import link_allocator

    link_allocator(req_to_token_pool)


@_hook("sglang.srt.mem_cache.memory_pool.HybridReqToTokenPool._init_mamba_pool", "AROUND",
       at="sglang/srt/mem_cache/memory_pool.py:1426", fix="pd_decode_ring")
def decode_pool_ring(original: Callable[..., Any], req_to_token_pool: Any, *args: Any, **kwargs: Any) -> Any:
    """The PD decode server's mamba pool gets the decode ring (radix/pd/decode_pool.py)."""
    from sglang_replayssm.radix.pd.decode_pool import ring_on_decode_pool

    return ring_on_decode_pool(original, req_to_token_pool, *args, **kwargs)


@_hook("sglang.srt.mem_cache.allocator.mamba.MambaSlotAllocator.alloc", "AFTER",
       at="sglang/srt/mem_cache/allocator/mamba.py:65", fix="cursor_reset")
def empty_ring_on_alloc(result: Any, allocator: Any, *args: Any, **kwargs: Any) -> None:
    """Every slot the allocator hands out starts with an empty ring."""
    if result is None:
        return
    from sglang_replayssm.radix.ring.alloc_reset import empty_allocated

    empty_allocated(allocator, result)


@_hook("sglang.srt.mem_cache.mamba_checkpoint_pool.MambaCheckpointPool.load_to_active", "AFTER",
       at="sglang/srt/mem_cache/mamba_checkpoint_pool.py:254", fix="cursor_reset")
def empty_ring_on_int8_load(
    result: Any, ckpt_pool: Any, active_mamba_pool: Any, ckpt_slots: Any, active_slots: Any
) -> None:
    """A slot an int8 checkpoint is loaded into starts with an empty ring."""
    from sglang_replayssm.radix.ring.alloc_reset import empty_loaded

    empty_loaded(active_mamba_pool, active_slots)


# ---- extend over pending records, CPU retraction backup --------------------------------------


@_hook("sglang.srt.model_executor.model_runner.ModelRunner._maybe_execute_deferred_mamba_cow_and_clear", "AROUND",
       at="sglang/srt/model_executor/model_runner.py:1915", fix="extend_fold")
def fold_rows_before_extend(original: Callable[..., Any], runner: Any, forward_batch: Any) -> Any:
    """Before an extend forward reads the pool, fold every row's pending records."""
    from sglang_replayssm.radix.ring.movers import fold_before_extend

    return fold_before_extend(original, runner, forward_batch)


@_hook("sglang.srt.mem_cache.memory_pool.MambaPool.get_cpu_copy", "AROUND",
       at="sglang/srt/mem_cache/memory_pool.py:1208", fix="retract_backup")
def exact_cpu_copy(original: Callable[..., Any], mamba_pool: Any, indices: Any) -> Any:
    """The CPU retraction backup carries the full state."""
    from sglang_replayssm.radix.ring.movers import cpu_copy_exact

    return cpu_copy_exact(original, mamba_pool, indices)


@_hook("sglang.srt.mem_cache.memory_pool.MambaPool.load_cpu_copy", "AFTER",
       at="sglang/srt/mem_cache/memory_pool.py:1223", fix="retract_backup")
def empty_ring_on_cpu_load(result: Any, mamba_pool: Any, mamba_cache_cpu: Any, indices: Any) -> None:
    """A slot a CPU backup is loaded into starts with an empty ring."""
    from sglang_replayssm.radix.ring.alloc_reset import empty_loaded

    empty_loaded(mamba_pool, indices)


# ---- radix tree ------------------------------------------------------------------------------


@_hook(f"{_MAMBA_COMPONENT}.prepare_for_caching_req", "AROUND",
       at="sglang/srt/mem_cache/unified_cache/components/mamba.py:604", fix="finish_donation")
def exact_finish_donation(
    original: Callable[..., Any], component: Any, req: Any, insert_params: Any, token_ids_len: int, is_finished: bool
) -> Any:
    """Finish donation: no_buffer folds the slot first (real depth); extra_buffer donates the exact
    end state (``end_state``)."""
    from sglang_replayssm.radix.ring import donation as donation

    donation.materialize_before_finish_donation(component, req, is_finished)
    if config.enabled("end_state"):
        donation.end_state_before_finish_donation(component, req, token_ids_len, is_finished)
    return original(component, req, insert_params, token_ids_len, is_finished)


@_hook(f"{_MAMBA_COMPONENT}.finalize_match_result_in_cache", "AFTER",
       at="sglang/srt/mem_cache/unified_cache/components/mamba.py:196", fix="lost_hit_metric")
def record_lost_hit(result: Any, component: Any, params: Any, match_result: Any) -> None:
    """Count the prompt tokens whose KV hit was dropped for lack of a mamba state."""
    from sglang_replayssm.radix.metrics import record_match

    record_match(params, result if result is not None else match_result)


# ---- records: prefix hits at any depth ---------------------------------------------------------

_GDN_BACKEND = "sglang.srt.layers.attention.linear.gdn_backend.GDNAttnBackend"
_SCHEDULE_BATCH = "sglang.srt.managers.schedule_batch.ScheduleBatch"
_ALLOC = "sglang.srt.mem_cache.allocator"


@_hook(f"{_SCHEDULE_BATCH}.prepare_for_extend", "AFTER",
       at="sglang/srt/managers/schedule_batch.py:2847", fix="record_hits")
def assign_extend_records(result: Any, batch: Any, *args: Any, **kwargs: Any) -> None:
    """The prefill batch's new tokens get record slots."""
    from sglang_replayssm.radix.records.capture import assign_batch

    assign_batch(batch, decode=False)


@_hook(f"{_SCHEDULE_BATCH}.prepare_for_decode", "AFTER",
       at="sglang/srt/managers/schedule_batch.py:3736", fix="record_hits")
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


for _name, _target, _at in (
    ("no_record_on_token_alloc", f"{_ALLOC}.token.TokenToKVPoolAllocator.alloc",
     "sglang/srt/mem_cache/allocator/token.py:54"),
    ("no_record_on_page_alloc", f"{_ALLOC}.paged.PagedTokenToKVPoolAllocator.alloc",
     "sglang/srt/mem_cache/allocator/paged.py:181"),
    ("no_record_on_extend_alloc", f"{_ALLOC}.paged.PagedTokenToKVPoolAllocator.alloc_extend",
     "sglang/srt/mem_cache/allocator/paged.py:204"),
    ("no_record_on_decode_alloc", f"{_ALLOC}.paged.PagedTokenToKVPoolAllocator.alloc_decode",
     "sglang/srt/mem_cache/allocator/paged.py:279"),
):
    _hook(_target, "AFTER", at=_at, fix="record_hits")(_no_record_on_alloc(_name))


def _capture_records(name: str, what: str) -> Callable[..., Any]:
    def hook(original: Callable[..., Any], backend: Any, layer: Any, forward_batch: Any,
             mixed_qkv: Any, a: Any, b: Any, **kwargs: Any) -> Any:
        from sglang_replayssm.radix.records.capture import capture

        capture(backend, layer, forward_batch, mixed_qkv, a, b)
        if what != "extend":
            return original(backend, layer, forward_batch, mixed_qkv, a, b, **kwargs)
        from sglang_replayssm.radix.records.capture import extending

        with extending(backend, layer, forward_batch):
            return original(backend, layer, forward_batch, mixed_qkv, a, b, **kwargs)

    hook.__name__ = hook.__qualname__ = name
    hook.__doc__ = f"Store the layer's {what} inputs for the batch's new tokens, then SGLang's {what}."
    return hook


_KDA_BACKEND = "sglang.srt.layers.attention.linear.kda_backend.KDAAttnBackend"
for _name, _target, _at, _what in (
    ("capture_extend_records", f"{_GDN_BACKEND}.forward_extend", "sglang/srt/layers/attention/linear/gdn_backend.py:948",
     "extend"),
    ("capture_decode_records", f"{_GDN_BACKEND}.forward_decode", "sglang/srt/layers/attention/linear/gdn_backend.py:678",
     "decode"),
    ("capture_kda_extend_records", f"{_KDA_BACKEND}.forward_extend",
     "sglang/srt/layers/attention/linear/kda_backend.py:1043", "KDA extend"),
    ("capture_kda_decode_records", f"{_KDA_BACKEND}.forward_decode",
     "sglang/srt/layers/attention/linear/kda_backend.py:770", "KDA decode"),
):
    _hook(_target, "AROUND", at=_at, fix="record_hits")(_capture_records(_name, _what))


@_hook("sglang.srt.layers.attention.linear.gdn_backend.GDNKernelDispatcher.extend", "AROUND",
       at="sglang/srt/layers/attention/linear/gdn_backend.py:441", fix="record_hits")
def keep_interval_states(original: Callable[..., Any], dispatcher: Any, *args: Any, **kwargs: Any) -> Any:
    """A forward's own GDN extend: keep its per-chunk states at the state interval."""
    from sglang_replayssm.radix.records.capture import keep_chunk_states

    result = original(dispatcher, *args, **kwargs)
    keep_chunk_states(result, kwargs.get("ssm_states"))
    return result


@_hook(f"{_MAMBA_COMPONENT}.finalize_match_result_in_cache", "AROUND",
       at="sglang/srt/mem_cache/unified_cache/components/mamba.py:196", fix="record_hits")
def plant_rebuilt_state(original: Callable[..., Any], component: Any, params: Any, result: Any) -> Any:
    """A records-only best match gets a planted state, rebuilt before the copy-on-write reads it."""
    from sglang_replayssm.radix.records.match import plant_and_match

    return plant_and_match(original, component, params, result)


@_hook("sglang.srt.model_executor.model_runner.ModelRunner.forward", "BEFORE",
       at="sglang/srt/model_executor/model_runner.py:1813", fix="record_hits", gate=False)
def rebuild_planted_states(runner: Any, *args: Any, **kwargs: Any) -> None:
    """Before a forward writes anything: rebuild the states planted since the last one."""
    if config.enabled("record_hits"):
        from sglang_replayssm.radix.records.rebuild import run_pending

        run_pending(runner)


# ---- metrics and memory budget ---------------------------------------------------------------


@_hook(f"{_REPORTER}.PrefillStats.from_adder", "AFTER",
       at="sglang/srt/managers/scheduler_components/metrics_reporter.py:136", fix="lost_hit_metric")
def collect_lost_hit(stats: Any, cls: Any, adder: Any, *args: Any, **kwargs: Any) -> None:
    """Carry the lost-hit count into the prefill stats."""
    from sglang_replayssm.radix.metrics import collect_for_prefill

    collect_for_prefill(stats, getattr(adder, "can_run_list", ()))


@_hook(f"{_REPORTER}.SchedulerMetricsReporter.report_prefill_stats", "AROUND",
       at="sglang/srt/managers/scheduler_components/metrics_reporter.py:719", fix="lost_hit_metric")
def report_lost_hit(original: Callable[..., Any], reporter: Any, *args: Any, **kwargs: Any) -> Any:
    """Report the lost-hit count with the prefill stats."""
    from sglang_replayssm.radix.metrics import report_prefill

    return report_prefill(original, reporter, *args, **kwargs)


@_hook("sglang.srt.mem_cache.kv_cache_configurator.KVCacheConfigurator._handle_max_mamba_cache", "AROUND",
       at="sglang/srt/mem_cache/kv_cache_configurator.py:3229", fix="ring_budget")
def charge_ring_budget(original: Callable[..., Any], configurator: Any, total_rest_memory: float) -> Any:
    """Charge the decode ring to the mamba memory budget."""
    from sglang_replayssm.radix.budget import charge_decode_ring

    return charge_decode_ring(original, configurator, total_rest_memory)


# ---- the spec-verify ring (radix/spec/ring.py) -------------------------------------------------


@_hook("sglang.srt.arg_groups.attention_hook.handle_linear_attn_backend", "AROUND",
       at="sglang/srt/arg_groups/attention_hook.py:281", fix="spec_ring_check")
def check_spec_ring(original: Callable[..., Any], server_args: Any) -> Any:
    """D5: refuse a GDN spec ring length SGLang checks only in a kernel assert."""
    from sglang_replayssm.radix.spec.ring import check_spec_ring_args
    result = original(server_args)
    check_spec_ring_args(server_args)
    return result


@_hook(f"{_MAMBA_COMPONENT}.prepare_for_caching_req", "AROUND",
       at="sglang/srt/mem_cache/unified_cache/components/mamba.py:604", fix="spec_finish_donation")
def spec_finish_donation(
    original: Callable[..., Any], component: Any, req: Any, insert_params: Any, token_ids_len: int, is_finished: bool
) -> Any:
    """D1: fold the spec row before SGLang donates a finishing no_buffer slot."""
    from sglang_replayssm.radix.spec.ring import fold_before_finish
    fold_before_finish(component, req, is_finished)
    return original(component, req, insert_params, token_ids_len, is_finished)


@_hook("sglang.srt.managers.schedule_batch.Req.offload_kv_cache", "AROUND",
       at="sglang/srt/managers/schedule_batch.py:2109", fix="spec_retract_backup")
def spec_offload_backup(original: Callable[..., Any], req: Any, req_to_token_pool: Any, *args: Any) -> Any:
    """D2: fold the spec row before its CPU retraction backup."""
    from sglang_replayssm.radix.spec.ring import fold_before_offload
    fold_before_offload(req, req_to_token_pool)
    return original(req, req_to_token_pool, *args)


@_hook("sglang.srt.model_executor.model_runner.ModelRunner._maybe_execute_deferred_mamba_cow_and_clear", "AROUND",
       at="sglang/srt/model_executor/model_runner.py:1915", fix="spec_extend_fold")
def spec_fold_before_extend(original: Callable[..., Any], runner: Any, forward_batch: Any) -> Any:
    """D3 / D4: fold every spec row before an extend forward reads the pool."""
    from sglang_replayssm.radix.spec.ring import fold_before_extend
    fold_before_extend(runner, forward_batch)
    return original(runner, forward_batch)


@_hook("sglang.srt.session.streaming_session.StreamingSession.try_cache_finished_req", "AROUND",
       at="sglang/srt/session/streaming_session.py:156", fix="session_state_depth")
def session_state_depth(original: Callable[..., Any], session: Any, req: Any) -> Any:
    """A finished streaming turn keeps its record at its state's depth (or releases the slot)."""
    from sglang_replayssm.radix.session_depth import finish_at_state_depth
    return finish_at_state_depth(original, session, req)

# ---- records with HiCache: host backup, load-back, planted states (radix/records/hicache/host_records.py) ------


def _hicache_hook(name: str, body: str, doc: str, module: str = "records.hicache.host_records") -> Callable[..., Any]:
    def hook(*args: Any, **kwargs: Any) -> Any:
        import importlib
        return getattr(importlib.import_module(f"sglang_replayssm.radix.{module}"), body)(*args, **kwargs)
    hook.__name__, hook.__qualname__, hook.__doc__ = name, name, doc
    return hook


for _name, _body, _target, _kind, _at, _doc in HICACHE_HOOKS:  # one row per hook: target, SGLang file:line
    _hook(_target, _kind, at=_at, fix="record_hicache", gate=_kind != "BEFORE")(_hicache_hook(_name, _body, _doc))
for _rows, _fix, _module in ((HOST_HIT_HOOKS, "record_host_hits", "records.hicache.host_hits"),
                             (STORAGE_HOOKS, "record_storage", "records.hicache.storage"),
                             (PD_HIT_HOOKS, "pd_hits", "pd.hits")):
    for _name, _body, _target, _kind, _at, _doc in _rows:  # radix/<_module>.py
        _hook(_target, _kind, at=_at, fix=_fix)(_hicache_hook(_name, _body, _doc, _module))


# ---- registration ---------------------------------------------------------------------------------

#: Every hook of the radix adapter, in definition order (the read copy's last: radix/read_copy/hooks.py).
HOOKS: tuple[Hook, ...] = tuple(_TABLE) + READ_COPY_HOOKS


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
