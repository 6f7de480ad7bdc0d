"""Leak accounting (``radix/metrics.py``'s gauges) on SGLang 0.5.23's real objects (UnifiedRadixCache with HiCache,
HybridReqToTokenPool, MambaPool; CPU tensors): every count of what the plugin holds rises with traffic
(records, kept states, a non-empty decode ring, a planted state with its locks and queued rebuild, host
record rows) and returns to 0 once the requests finished and the tree was evicted, device and host.
"""

from __future__ import annotations

import pytest

from sglang_replayssm.radix import config, metrics
from tests.support import simulate_records
from tests.test_radix_records_hicache import PROMPT, SPLIT, _backup_tree, _plant_without_forward, _sim

IDLE = dict.fromkeys(metrics.GAUGES, 0)


pytestmark = pytest.mark.usefixtures("radix_adapter", "hicache_on_cpu")  # tests/conftest.py


def _counts(sim) -> dict[str, int]:
    return metrics.gauge_counts(sim.req_pool, sim.allocator, sim.cache)


def test_counts_rise_with_traffic_and_return_to_idle_after_eviction():
    from sglang.srt.mem_cache.unified_cache.components.base import ComponentType

    with config.override(True):
        sim = _sim(state_interval=4)
        try:
            assert _counts(sim) == IDLE
            sim.admit(PROMPT, [4])  # finishes at prefill: its node keeps records and kept states
            live = sim.admit([7, 7, 1, 2, 3, 4, 5, 6, 1], [1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2, 3])
            sim.decode_until_pending(live)
            busy = _counts(sim)
            assert busy["record_slots_used"] >= len(PROMPT) + 9, busy
            assert busy["interval_states_used"] > 0 and busy["ring_slots_used"] >= 1, busy
            _plant_without_forward(sim, PROMPT[:SPLIT] + [0, 0])
            planted = _counts(sim)
            assert planted["planted_states"] == 1 and planted["planted_locks"] >= 1, planted
            assert planted["pending_record_jobs"] == 1, planted
            _backup_tree(sim)
            backed = _counts(sim)
            assert backed["host_record_entries"] >= len(PROMPT) and backed["host_record_pool_bytes"] > 0, backed
            simulate_records.run_pending(sim)  # the next forward: the rebuild runs, the locks go
            after = _counts(sim)
            assert (after["planted_states"], after["planted_locks"], after["pending_record_jobs"]) == (0, 0, 0)
            while live.req.finished() is False and sim.running:
                sim.decode()
            sim.evict(num_tokens=1 << 20, mamba_num=1 << 10)
            sim.cache.evict_host(1 << 20, ComponentType.MAMBA)
            sim.cache.evict_host(1 << 20)
            idle = _counts(sim)
            assert idle == {**IDLE, "host_record_pool_bytes": backed["host_record_pool_bytes"]}, idle
        finally:
            sim.cache.release_host_resources()
