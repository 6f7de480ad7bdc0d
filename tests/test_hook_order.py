"""One hook per SGLang target: where hooks share a target, SGLang sees one composed AROUND hook that runs
them in the order written in ``sglang_replayssm/hook_order.py``, with HookRegistry's own semantics."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest
from sglang.srt.plugins.hook_registry import HookType

from sglang_replayssm import hook_table
from sglang_replayssm.hook_order import ORDER
from sglang_replayssm.hook_table import ComposedHook, Hook
from sglang_replayssm.radix import config
from sglang_replayssm.radix import hooks as radix_hooks
from tests.test_hook_table import ALL_HOOKS

_MAMBA = "sglang.srt.mem_cache.unified_cache.components.mamba.MambaComponent"
_RUNNER = "sglang.srt.model_executor.model_runner.ModelRunner"
_MP = "sglang.srt.mem_cache.memory_pool"

#: The effective order before composition (outermost first): HookRegistry stacked each target's hooks in
#: registration order (the CPU runtime's entry point before the radix adapter's; within the radix
#: adapter, its single table in definition order, the read copy's rows last; later registered = outer).
INTENDED: dict[str, tuple[str, ...]] = {
    "sglang.srt.arg_groups.attention_hook.handle_linear_attn_backend": ("check_spec_ring", "admit_linear_attn"),
    "sglang.srt.layers.attention.linear.kernels.gdn_triton.TritonGDNKernel.packed_decode": (
        "gdn_ring_kernel", "gdn-ring-decode"),
    "sglang.srt.layers.attention.linear.kernels.kda_triton.TritonKDAKernel.packed_decode": (
        "kda_ring_kernel", "kda-ring-decode"),
    f"{_MP}.MambaPool.copy_from": ("read_copy_stale_on_copy", "exact_copy_from"),
    f"{_MP}.HybridReqToTokenPool._init_mamba_pool": ("attach_read_copy", "decode_pool_ring", "link_slot_allocator",
                                                     "ring_rows_pool"),
    "sglang.srt.mem_cache.allocator.mamba.MambaSlotAllocator.alloc": ("read_copy_stale_on_alloc",
                                                                      "empty_ring_on_alloc"),
    f"{_RUNNER}._maybe_execute_deferred_mamba_cow_and_clear": (
        "read_copy_stale_on_extend", "spec_fold_before_extend", "fold_rows_before_extend"),
    f"{_MP}.MambaPool.load_cpu_copy": ("read_copy_stale_on_cpu_load", "empty_ring_on_cpu_load"),
    f"{_MAMBA}.prepare_for_caching_req": ("spec_finish_donation", "exact_finish_donation"),
    f"{_MAMBA}.finalize_match_result_in_cache": (
        "host_hit_through_records", "lock_planted_state", "plant_rebuilt_state", "branch_point_on_prefix_grid",
        "record_lost_hit"),
    f"{_RUNNER}.forward": ("run_record_transfers", "rebuild_planted_states"),
    "sglang.srt.server_args.ServerArgs.resolve_once": ("engine-defaults", "conv-dtype-refusal"),
}


def test_the_written_order_is_the_intended_order():
    assert ORDER == INTENDED


def test_every_shared_target_has_a_written_order_naming_exactly_its_hooks():
    by_target: dict[str, list[str]] = defaultdict(list)
    for hook in ALL_HOOKS:
        by_target[hook.target].append(hook.name)
    shared = {target: sorted(names) for target, names in by_target.items() if len(names) > 1}
    assert {target: sorted(names) for target, names in ORDER.items()} == shared


def _trace_hooks(trace: list[str]) -> list[Hook]:
    """One hook of each kind on a toy target, each leaving its mark (the BEFORE one changes the argument,
    the AFTER one the result), so any change of order or semantics changes the trace or the result."""

    def before(x: int) -> tuple[tuple[int], dict[str, int]]:
        trace.append("before")
        return (x + 1,), {}

    def outer(original, x):  # type: ignore[no-untyped-def]
        trace.append("outer>")
        result = original(x * 10)
        trace.append("<outer")
        return result

    def after(result: int, x: int) -> int:
        trace.append(f"after({x})")
        return result + 1000

    def inner(original, x):  # type: ignore[no-untyped-def]
        trace.append("inner>")
        return original(x) + 5

    target = "toy.fn"
    return [Hook(target, "AROUND", outer, "", "outer"), Hook(target, "BEFORE", before, "", "before"),
            Hook(target, "AFTER", after, "", "after"), Hook(target, "AROUND", inner, "", "inner")]


def test_a_composed_hook_runs_like_hookregistrys_stack():
    """HookRegistry's own wrappers (hooks registered innermost first) against the composed hook."""
    from sglang.srt.plugins import hook_registry

    def original(x: int) -> int:
        trace.append(f"original({x})")
        return x

    trace: list[str] = []
    hooks = _trace_hooks(trace)
    stacked = original
    for hook in reversed(hooks):
        stacked = hook_registry._wrap_fn(stacked, hook.fn, HookType[hook.kind])
    expected_result, expected_trace = stacked(1), list(trace)
    trace.clear()
    composed = ComposedHook("toy.fn", [h.name for h in hooks])
    for hook in (hooks[2], hooks[0], hooks[3], hooks[1]):  # joining order does not matter
        composed.add(hook)
    assert composed(original, 1) == expected_result
    assert trace == expected_trace


def test_installed_targets_carry_one_composed_hook_in_the_written_order():
    radix_hooks.install()
    enabled = set(config.enabled_fixes())
    radix_names = {h.name for h in radix_hooks.HOOKS if h.fix is None or h.fix in enabled}
    for target, order in ORDER.items():
        want = [name for name in order if name in radix_names]
        if not want:
            continue
        chain = hook_table.wrapped_hooks(hook_table.live_attr(target))
        composed = [fn for fn in chain if isinstance(fn, ComposedHook)]
        assert len(composed) == 1, target
        assert [m.name for m in composed[0].members if m.name in radix_names] == want, target
        assert [fn for fn in chain if not isinstance(fn, ComposedHook) and fn not in
                {m.fn for m in composed[0].members}] == [], target


_REGISTER_ALL = """
import logging, sys
from sglang.srt.plugins.hook_registry import HookRegistry
from sglang_replayssm.cpu import activate
from sglang_replayssm.radix.hooks import register
logging.basicConfig(level=logging.INFO, stream=sys.stdout)
print(activate())
print(register())
counts = {t: len(h) for t, h in HookRegistry._hooks.items()}
HookRegistry.apply_hooks()
print("MAX_HOOKS_PER_TARGET", max(counts.values()))
"""


@pytest.mark.timeout(600)
def test_sglang_sees_one_hook_per_target_and_warns_of_no_stacked_around_hook():
    """Both entry points register in a fresh process, as at a server start (the CPU runtime's hooks too
    where no CUDA driver loads); SGLang logs no "Multiple AROUND hooks" line."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(__file__).parent.parent), *sys.path]))
    done = subprocess.run([sys.executable, "-c", _REGISTER_ALL], capture_output=True, text=True, env=env,
                          timeout=600)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-3000:]
    assert "MAX_HOOKS_PER_TARGET 1" in out, out[-3000:]
    assert "Multiple AROUND" not in out
