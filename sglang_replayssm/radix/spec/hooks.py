"""The spec room's hooks: the spec-verify ring (:mod:`ring`) folded before SGLang donates, backs up or
extends a spec row, and its ring length checked at startup."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sglang_replayssm.hook_table import Hook
from sglang_replayssm.radix.gated import gated_hook

__all__ = ["SPEC_HOOKS"]


def check_spec_ring(original: Callable[..., Any], server_args: Any) -> Any:
    """D5: refuse a GDN spec ring length SGLang checks only in a kernel assert."""
    from sglang_replayssm.radix.spec.ring import check_spec_ring_args
    result = original(server_args)
    check_spec_ring_args(server_args)
    return result


def spec_finish_donation(
    original: Callable[..., Any], component: Any, req: Any, insert_params: Any, token_ids_len: int, is_finished: bool
) -> Any:
    """D1: fold the spec row before SGLang donates a finishing no_buffer slot."""
    from sglang_replayssm.radix.spec.ring import fold_before_finish
    fold_before_finish(component, req, is_finished)
    return original(component, req, insert_params, token_ids_len, is_finished)


def spec_offload_backup(original: Callable[..., Any], req: Any, req_to_token_pool: Any, *args: Any) -> Any:
    """D2: fold the spec row before its CPU retraction backup."""
    from sglang_replayssm.radix.spec.ring import fold_before_offload
    fold_before_offload(req, req_to_token_pool)
    return original(req, req_to_token_pool, *args)


def spec_fold_before_extend(original: Callable[..., Any], runner: Any, forward_batch: Any) -> Any:
    """D3 / D4: fold every spec row before an extend forward reads the pool."""
    from sglang_replayssm.radix.spec.ring import fold_before_extend
    fold_before_extend(runner, forward_batch)
    return original(runner, forward_batch)


#: The spec room's hooks.
SPEC_HOOKS: tuple[Hook, ...] = (
    gated_hook("sglang.srt.arg_groups.attention_hook.handle_linear_attn_backend", "AROUND", check_spec_ring,
               at="sglang/srt/arg_groups/attention_hook.py:281", fix="spec_ring_check"),
    gated_hook("sglang.srt.mem_cache.unified_cache.components.mamba.MambaComponent.prepare_for_caching_req",
               "AROUND", spec_finish_donation, at="sglang/srt/mem_cache/unified_cache/components/mamba.py:604",
               fix="spec_finish_donation"),
    gated_hook("sglang.srt.managers.schedule_batch.Req.offload_kv_cache", "AROUND", spec_offload_backup,
               at="sglang/srt/managers/schedule_batch.py:2109", fix="spec_retract_backup"),
    gated_hook("sglang.srt.model_executor.model_runner.ModelRunner._maybe_execute_deferred_mamba_cow_and_clear",
               "AROUND", spec_fold_before_extend, at="sglang/srt/model_executor/model_runner.py:1915",
               fix="spec_extend_fold"),
)
