"""A plant's HiCache lock inside the prefill round's budget (fix ``planted_lock_budget``), on SGLang 0.5.23's real
UnifiedRadixCache with HiCache, HybridReqToTokenPool and MambaPool (CPU tensors).

SGLang matches each waiting request between ``PrefillAdder.add_one_req`` calls; a plant locks its node until its
rebuild runs at the next forward. Once the round's adder has admitted a request (its budget counted the tree's
evictable tokens), a later request's plant must not turn evictable tokens into locked ones: that is the scheduler
OOM the 640-token soak hit (``prepare_for_extend`` found every tree token locked). The adder is a stand-in with the
two attributes the hook reads (``tree_cache``, ``can_run_list``), recorded through the hook's own body.
"""

from __future__ import annotations

import pytest

from sglang_replayssm.radix import config, metrics
from sglang_replayssm.radix.records.hicache.plant_budget import note_adder
from tests.support import simulate_records
from tests.test_radix_records_hicache import PROMPT, SPLIT, _plant_without_forward, _sim

pytestmark = pytest.mark.usefixtures("radix_adapter", "hicache_on_cpu")  # tests/conftest.py


class _Adder:
    """The two attributes of ``PrefillAdder`` the hook reads."""

    def __init__(self, tree_cache, can_run_list) -> None:
        self.tree_cache, self.can_run_list = tree_cache, can_run_list


def _planted(sim) -> int:
    return metrics.gauge_counts(sim.req_pool, sim.allocator, sim.cache)["planted_states"]


def _skipped() -> float:
    """``sglang:replayssm_skipped_plants_total`` as this process's Prometheus registry holds it."""
    import prometheus_client

    value = prometheus_client.REGISTRY.get_sample_value(metrics.SKIPPED_PLANTS_PROMETHEUS_NAME)
    return 0.0 if value is None else value


@pytest.mark.parametrize("guard", ["on", "off"])
def test_a_plant_after_an_admission_locks_no_promised_token(guard):
    with config.override(True, planted_lock_budget=guard == "on"):
        sim = _sim(state_interval=4)
        try:
            sim.admit(PROMPT, [4])  # finished: its node is unlocked, its tokens evictable, its records kept
            admitted = _Adder(sim.cache, [object()])
            note_adder(None, admitted)  # the round's adder has admitted a request
            promised = int(sim.cache.evictable_size())
            skipped = _skipped()
            _plant_without_forward(sim, PROMPT[:SPLIT] + [0, 0])
            left = int(sim.cache.evictable_size())
            if guard == "on":
                assert (_planted(sim), left) == (0, promised)  # SGLang's result stands: nothing locked
                assert _skipped() == skipped + 1  # and the skip is counted
            else:
                assert _planted(sim) == 1 and left < promised  # the OOM's lock: promised tokens now locked
                assert _skipped() == skipped
            simulate_records.run_pending(sim)
        finally:
            sim.cache.release_host_resources()


def test_the_first_admission_of_a_round_still_plants():
    """No request admitted yet: the adder's live budget sees the lock, so the hit is kept."""
    with config.override(True):
        sim = _sim(state_interval=4)
        try:
            sim.admit(PROMPT, [4])
            note_adder(None, _Adder(sim.cache, []))
            req = _plant_without_forward(sim, PROMPT[:SPLIT] + [0, 0])
            assert _planted(sim) == 1 and req.prefix_len == SPLIT  # hit at the KV depth, past any state
            simulate_records.run_pending(sim)
            assert _planted(sim) == 0
        finally:
            sim.cache.release_host_resources()
