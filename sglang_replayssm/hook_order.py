"""The order of the hooks that share one SGLang target, written once.

SGLang's ``HookRegistry`` wraps a target's hooks in registration order (the last registered runs
first) and warns at every start when two AROUND hooks share a target. The package registers one
composed AROUND hook per target listed here instead (:class:`hook_table.ComposedHook`): it runs the
listed hooks with HookRegistry's own BEFORE / AFTER / AROUND semantics, in this order.

Each entry: the SGLang target, then the names of its hooks (``Hook.name``), outermost first (the first
runs first: a BEFORE hook before the later ones, an AROUND hook around them, an AFTER hook after
them). A hook whose fix is off is left out of its stack. ``tests/test_hook_order.py`` checks that every
target with more than one hook (``cpu/`` and ``radix/`` together) is listed, with exactly its hooks.
"""

from __future__ import annotations

__all__ = ["ORDER"]

_MP = "sglang.srt.mem_cache.memory_pool"
_MAMBA_COMPONENT = "sglang.srt.mem_cache.unified_cache.components.mamba.MambaComponent"
_RUNNER = "sglang.srt.model_executor.model_runner.ModelRunner"
_KERNELS = "sglang.srt.layers.attention.linear.kernels"

#: SGLang target -> its hooks' names, outermost (first to run) first.
ORDER: dict[str, tuple[str, ...]] = {
    # The spec-ring length check runs on what the admission (and SGLang) leaves.
    "sglang.srt.arg_groups.attention_hook.handle_linear_attn_backend": ("check_spec_ring", "admit_linear_attn"),
    # The radix ring kernel on CUDA; on the CPU runtime its fallback is the CPU ring decode.
    f"{_KERNELS}.gdn_triton.TritonGDNKernel.packed_decode": ("gdn_ring_kernel", "gdn-ring-decode"),
    f"{_KERNELS}.kda_triton.TritonKDAKernel.packed_decode": ("kda_ring_kernel", "kda-ring-decode"),
    # The read copy marks a destination stale after the exact (folded) copy wrote it.
    f"{_MP}.MambaPool.copy_from": ("read_copy_stale_on_copy", "exact_copy_from"),
    # The read copy attaches to the pool the PD decode ring built and the allocator was linked to; the
    # allocator links to the cursor the request-row rings allocated.
    f"{_MP}.HybridReqToTokenPool._init_mamba_pool": (
        "attach_read_copy", "decode_pool_ring", "link_slot_allocator", "ring_rows_pool"),
    "sglang.srt.mem_cache.allocator.mamba.MambaSlotAllocator.alloc": (
        "read_copy_stale_on_alloc", "empty_ring_on_alloc"),
    # Spec rows fold, then decode-ring rows, then SGLang's copy-on-write; then extend rows' copies go stale.
    f"{_RUNNER}._maybe_execute_deferred_mamba_cow_and_clear": (
        "read_copy_stale_on_extend", "spec_fold_before_extend", "fold_rows_before_extend"),
    f"{_MP}.MambaPool.load_cpu_copy": ("read_copy_stale_on_cpu_load", "empty_ring_on_cpu_load"),
    # The spec row folds before the decode ring's finish donation.
    f"{_MAMBA_COMPONENT}.prepare_for_caching_req": ("spec_finish_donation", "exact_finish_donation"),
    # Host hits wrap the HiCache locks, which wrap the records' plant; a match left without a plant gets its
    # branch point on its own prefix's grid; the lost-hit count sees the result.
    f"{_MAMBA_COMPONENT}.finalize_match_result_in_cache": (
        "host_hit_through_records", "lock_planted_state", "plant_rebuilt_state", "branch_point_on_prefix_grid",
        "record_lost_hit"),
    # Record loads and rebuilds queued by HiCache run before the planted states' rebuild.
    f"{_RUNNER}.forward": ("run_record_transfers", "rebuild_planted_states"),
    # CPU runtime: the engine defaults are filled in before SGLang resolves, the dtype check after.
    "sglang.srt.server_args.ServerArgs.resolve_once": ("engine-defaults", "conv-dtype-refusal"),
}
