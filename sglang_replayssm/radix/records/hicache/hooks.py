"""The hooks of records with HiCache: :data:`HICACHE_HOOKS` (:mod:`host_records`, behind
``record_hicache``), :data:`HOST_HIT_HOOKS` (:mod:`host_hits`, behind ``record_host_hits``),
:data:`STORAGE_HOOKS` (:mod:`storage` and :mod:`store_integrity`, behind ``record_storage``). Each body lives in its module,
imported on first use (:func:`sglang_replayssm.radix.gated.lazy`); each ``at`` is checked against SGLang
by ``tests/test_hook_table.py``. Their order on a shared target is in :mod:`sglang_replayssm.hook_order`."""

from __future__ import annotations

from sglang_replayssm.hook_table import Hook, HookKind
from sglang_replayssm.radix.gated import gated_hook, lazy

__all__ = ["HICACHE_HOOKS", "HOST_HIT_HOOKS", "PLANT_BUDGET_HOOKS", "STORAGE_HOOKS"]

_MEM = "sglang.srt.mem_cache"
_HC = f"{_MEM}.hybrid_cache.hybrid_cache_controller.HybridCacheController"
_AT = "sglang/srt/mem_cache"

_HICACHE_ROWS: tuple[tuple[str, str, str, HookKind, str, str], ...] = (
    ("back_records_up", "write_hook", f"{_HC}.write", "AROUND",
     f"{_AT}/hybrid_cache/hybrid_cache_controller.py:555",
     "A device->host KV write takes the tokens' records to host under the host KV indices."),
    ("load_records_back", "load_hook", f"{_HC}.load", "AROUND",
     f"{_AT}/hybrid_cache/hybrid_cache_controller.py:1008",
     "A host->device KV load brings the tokens' host records back under the new device KV indices."),
    ("no_record_on_host_alloc", "host_alloc_hook", f"{_MEM}.pool_host.base.HostKVCache.alloc", "AFTER",
     f"{_AT}/pool_host/base.py:543",
     "Every host KV index the host pool hands out starts without a host record."),
    ("unbuilt_state_not_backed_up", "build_backup_spec",
     f"{_MEM}.unified_cache.unified_tree_core.UnifiedTreeCore.build_backup_spec", "AROUND",
     f"{_AT}/unified_cache/unified_tree_core.py:2491",
     "A planted node whose rebuild has not run is backed up without its mamba state."),
    ("unbuilt_state_not_backed_up_rust", "build_backup_spec",
     f"{_MEM}.rust_tree_core.adapter.RustUnifiedTreeCore.build_backup_spec", "AROUND",
     f"{_AT}/rust_tree_core/adapter.py:962",
     "The same on the Rust tree core."),
    ("lock_planted_state", "lock_planted",
     f"{_MEM}.unified_cache.components.mamba.MambaComponent.finalize_match_result_in_cache", "AROUND",
     f"{_AT}/unified_cache/components/mamba.py:196",
     "A planted state and the state its rebuild starts from stay locked until the rebuild is issued."),
    # BEFORE the rebuild hook (sglang_replayssm/hook_order.py): loads and rebuilds in queue order.
    ("run_record_transfers", "forward_hook", "sglang.srt.model_executor.model_runner.ModelRunner.forward",
     "BEFORE", "sglang/srt/model_executor/model_runner.py:1813",
     "Before a forward: the queued record loads and rebuilds in queue order, then the planted locks go."),
)

_BUDGET_ROWS: tuple[tuple[str, str, str, HookKind, str, str], ...] = (
    ("note_prefill_adder", "note_adder", "sglang.srt.managers.schedule_policy.PrefillAdder.__init__", "AFTER",
     "sglang/srt/managers/schedule_policy.py:608",
     "The round's adder, so a plant after an admission does not lock tokens its budget counted as evictable."),
)

# The match hook wraps lock_planted and the plant (sglang_replayssm/hook_order.py).
_HOST_HIT_ROWS: tuple[tuple[str, str, str, HookKind, str, str], ...] = (
    ("host_hit_through_records", "match_hook",
     f"{_MEM}.unified_cache.components.mamba.MambaComponent.finalize_match_result_in_cache", "AROUND",
     f"{_AT}/unified_cache/components/mamba.py:196",
     "A match whose KV runs on into host-only nodes covered by records is a host hit to the KV depth."),
    ("plant_after_host_load", "load_back_hook", f"{_MEM}.unified_radix_cache.UnifiedRadixCache.init_load_back",
     "AROUND", f"{_AT}/unified_radix_cache.py:3586",
     "After the host hit's KV load-back: plant the state at the KV depth, rebuilt from the records."),
)

_STORAGE_ROWS: tuple[tuple[str, str, str, HookKind, str, str], ...] = (
    ("stage_records_for_storage", "write_storage_hook", f"{_HC}.write_storage", "AROUND",
     f"{_AT}/hybrid_cache/hybrid_cache_controller.py:1401",
     "A host->storage backup copies the pages' host records out (scheduler thread)."),
    ("store_records_beside_pages", "backup_hook", f"{_HC}._page_backup", "AROUND",
     f"{_AT}/hybrid_cache/hybrid_cache_controller.py:1690",
     "After SGLang's pages (backup thread): each written page's records under its page hash."),
    ("read_records_with_pages", "transfer_hook", f"{_HC}._page_transfer", "AROUND",
     f"{_AT}/hybrid_cache/hybrid_cache_controller.py:1604",
     "After a prefetch's pages (prefetch I/O thread): the pages' records onto the operation."),
    ("prefetched_records_to_host", "prefetch_result_hook",
     f"{_MEM}.unified_radix_cache.UnifiedRadixCache._handle_prefetch_result", "AROUND",
     f"{_AT}/unified_radix_cache.py:2422",
     "A completed prefetch: the fetched pages' records become host records of its host KV."),
)

_HF = f"{_MEM}.hicache_storage.HiCacheFile"
_INTEGRITY_ROWS: tuple[tuple[str, str, str, HookKind, str, str], ...] = (
    ("checksum_twin_beside_page", "set_hook", f"{_HF}.set", "AROUND", f"{_AT}/hicache_storage.py:883",
     "A page SGLang stores in the file backend gets a twin file: header with its length and crc32."),
    ("damaged_pages_end_the_hit", "exists_hook", f"{_HF}.batch_exists_v2", "AROUND",
     f"{_AT}/hicache_storage.py:981",
     "A prefetch's storage query ends the KV prefix before the first damaged page and drops the "
     "restorable prefixes whose state file is damaged (counted, warned, never served)."),
)


def _hooks(rows: tuple[tuple[str, str, str, HookKind, str, str], ...], module: str, fix: str) -> tuple[Hook, ...]:
    """One gated :class:`Hook` per row ``(name, body in module, target, kind, SGLang file:line, doc)``
    (a BEFORE hook is registered as it is: its body checks the switch)."""
    return tuple(
        gated_hook(target, kind, lazy(f"sglang_replayssm.radix.records.hicache.{module}", body, name, doc),
                   at=at, fix=fix, gate=kind != "BEFORE")
        for name, body, target, kind, at, doc in rows
    )


#: Records with HiCache: host backup and load-back, planted-state locks and transfers.
HICACHE_HOOKS: tuple[Hook, ...] = _hooks(_HICACHE_ROWS, "host_records", "record_hicache")
#: Hits on host-only nodes covered by records.
HOST_HIT_HOOKS: tuple[Hook, ...] = _hooks(_HOST_HIT_ROWS, "host_hits", "record_host_hits")
#: Records beside L3 pages.
#: Planted locks inside the prefill round's budget.
PLANT_BUDGET_HOOKS: tuple[Hook, ...] = _hooks(_BUDGET_ROWS, "plant_budget", "planted_lock_budget")
STORAGE_HOOKS: tuple[Hook, ...] = (_hooks(_STORAGE_ROWS, "storage", "record_storage")
                                   + _hooks(_INTEGRITY_ROWS, "store_integrity", "record_storage"))
