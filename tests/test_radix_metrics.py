"""Deliverable 7: the "mamba-lost hit" counter, in SGLang's prefill log line and in Prometheus.

A request whose prompt shares a KV prefix with a cached path, but finds no mamba state at that
depth, recomputes the prefix: under no_buffer SGLang keeps states only at prompt / request ends.
The adapter records ``full_kv_hit_length - device_prefix_len`` at the admission match (SGLang's
real ``MambaComponent.finalize_match_result_in_cache``), moves it into the batch's real
``PrefillStats.from_adder``, and ``SchedulerMetricsReporter.report_prefill_stats`` prints it next to
``#cached-token`` and adds it to ``sglang:replayssm_mamba_lost_hit_tokens_total``.
"""

from __future__ import annotations

import logging
import time
from types import SimpleNamespace

import pytest

from sglang_replayssm.radix import config, hooks, metrics
from sglang_replayssm.state import ReplaySSMState, peek
from tests.support.simulate import Sim, SimConfig


@pytest.fixture(scope="module", autouse=True)
def _adapter_installed(radix_adapter):
    return radix_adapter


def _adder(reqs, hit_tokens: int):
    """The fields ``PrefillStats.from_adder`` reads off a PrefillAdder."""
    return SimpleNamespace(
        log_input_tokens=sum(len(r.origin_input_ids) for r in reqs) - hit_tokens,
        log_replay_tokens=0,
        log_hit_tokens=hit_tokens,
        reprocessed_log_input_tokens=0,
        reprocessed_log_hit_tokens=0,
        log_device_hit_tokens=hit_tokens,
        log_host_hit_tokens=0,
        log_storage_hit_tokens=0,
        new_token_ratio=0.5,
        can_run_list=list(reqs),
    )


def _shared_prefix_requests(sim: Sim):
    """A finishes and caches its path; B shares A's first 5 prompt tokens, where no state exists."""
    sim.admit([1, 2, 3, 4, 5, 6, 7, 8], [9, 1, 2])
    while sim.running:
        sim.decode()
    return sim.admit([1, 2, 3, 4, 5, 7, 7, 7], [3])


@pytest.mark.parametrize("adapter_on", [True, False], ids=["adapter-on", "adapter-off"])
def test_lost_hit_is_recorded_at_admission_and_counted_once(adapter_on):
    from sglang.srt.managers.scheduler_components.metrics_reporter import PrefillStats

    with config.override(adapter_on):
        sim = Sim(SimConfig(kind="gdn", strategy="no_buffer"))
        probe = sim.match([1, 2, 3, 4, 5, 7, 7])
        b = _shared_prefix_requests(sim)
        assert probe.full_kv_hit_length == 0  # nothing cached yet
        probe = sim.match([1, 2, 3, 4, 5, 6])
        assert probe.full_kv_hit_length == 6 and probe.device_prefix_len == 0
        assert metrics.lost_hit_tokens(probe) == 6
        assert b.matched == 0  # SGLang discarded B's 5-token KV hit (no mamba state at depth 5)
        stats = PrefillStats.from_adder(_adder([b.req], 0), [])
        again = PrefillStats.from_adder(_adder([b.req], 0), [])
        if adapter_on:
            assert peek(stats).lost_hit_tokens == 5
            assert peek(again).lost_hit_tokens == 0  # a request is counted once
        else:
            assert peek(stats) is None


def _reporter(metrics_enabled: bool, collector=None):
    """SGLang's SchedulerMetricsReporter with the state its prefill report reads (no scheduler)."""
    from sglang.srt.disaggregation.utils import DisaggregationMode
    from sglang.srt.managers.scheduler_components.metrics_reporter import SchedulerMetricsReporter

    usage = SimpleNamespace(get_prefill_usage_msg_parts=lambda: ["token usage: 0.01"])
    reporter = object.__new__(SchedulerMetricsReporter)
    reporter.is_stats_logging_rank = True
    reporter.current_scheduler_metrics_enabled = metrics_enabled
    reporter.metrics_collector = collector
    reporter.last_prefill_stats_tic = time.perf_counter()
    reporter.stats = SimpleNamespace()
    reporter._graph_backend_label = "cuda graph"
    reporter.enable_mfu_metrics = False
    reporter.scheduler = SimpleNamespace(
        pool_stats_observer=SimpleNamespace(get_pool_stats=lambda: usage),
        forward_ct=7,
        waiting_queue=[],
        disaggregation_mode=DisaggregationMode.NULL,
        kv_events_publisher=SimpleNamespace(publish_kv_events=lambda: None),
    )
    return reporter


@pytest.mark.parametrize("adapter_on", [True, False], ids=["adapter-on", "adapter-off"])
def test_prefill_log_line_shows_lost_hit_tokens(adapter_on, caplog):
    from sglang.srt.managers.scheduler_components.metrics_reporter import PrefillStats

    with config.override(adapter_on):
        sim = Sim(SimConfig(kind="kda", strategy="no_buffer"))
        b = _shared_prefix_requests(sim)
        stats = PrefillStats.from_adder(_adder([b.req], 0), [])
        with caplog.at_level(logging.INFO):
            _reporter(False).report_prefill_stats(None, stats, False)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Prefill batch")]
    assert len(lines) == 1
    if adapter_on:
        assert "#cached-token: 0, #mamba-lost-hit-token: 5, " in lines[0]
    else:
        assert "mamba-lost-hit" not in lines[0]


def test_prometheus_counter_counts_lost_hit_tokens():
    from prometheus_client import REGISTRY

    labels = {"model_name": "replayssm-test", "engine_type": "unified"}
    collector = SimpleNamespace(labels=labels)

    def value():
        return REGISTRY.get_sample_value(metrics.PROMETHEUS_NAME, labels) or 0.0

    before, total = value(), metrics.process_total()
    for n in (5, 0, 3):
        stats = SimpleNamespace(_replayssm_state=ReplaySSMState(lost_hit_tokens=n))
        with config.override(True):
            hooks.report_lost_hit(lambda *a, **k: None, _reporter(True, collector), None, stats, False)
    assert value() - before == 8
    assert metrics.process_total() - total == 8
    assert metrics.PROMETHEUS_NAME == "sglang:replayssm_mamba_lost_hit_tokens_total"


def test_the_counters_are_exported_at_zero_from_the_first_prefill():
    """A server that lost no hit shows the lost-hit counter at 0 (a missing series reads as "unknown" in the bench),
    like the other counters of a prefill report."""
    from prometheus_client import REGISTRY

    labels = {"model_name": "replayssm-zero", "engine_type": "unified"}
    assert REGISTRY.get_sample_value(metrics.PROMETHEUS_NAME, labels) is None
    stats = SimpleNamespace(_replayssm_state=ReplaySSMState(lost_hit_tokens=0))
    with config.override(True):
        hooks.report_lost_hit(lambda *a, **k: None, _reporter(True, SimpleNamespace(labels=labels)), None, stats, False)
    assert REGISTRY.get_sample_value(metrics.PROMETHEUS_NAME, labels) == 0.0
    assert REGISTRY.get_sample_value(metrics.REBUILT_PROMETHEUS_NAME, labels) == 0.0


def test_record_metrics_count_rebuilds_folds_and_the_pool():
    """Rebuilt hits, their folded records, the record pool's bytes and its evictions, in SGLang's
    Prometheus registry (labels of the collector) and the prefill log line."""
    import torch
    from prometheus_client import REGISTRY

    from sglang_replayssm.radix.records.pool import RecordPool, attach

    labels = {"model_name": "replayssm-records-test", "engine_type": "unified"}
    reporter = _reporter(True, SimpleNamespace(labels=labels))
    pool = RecordPool(kv_size=50, capacity=4, device=torch.device("cpu"))
    reporter.scheduler.req_to_token_pool = SimpleNamespace()
    attach(reporter.scheduler.req_to_token_pool, pool)

    def value(name):
        return REGISTRY.get_sample_value(name, labels) or 0.0

    names = (metrics.REBUILT_PROMETHEUS_NAME, metrics.HITS_PROMETHEUS_NAME, metrics.FOLDED_PROMETHEUS_NAME,
             metrics.EVICTED_PROMETHEUS_NAME)
    before = [value(n) for n in names]
    pool.assign(torch.arange(3))
    pool.assign(torch.arange(3, 6))  # 6 tokens into 4 slots: the 2 oldest records are dropped
    reqs = [SimpleNamespace(_replayssm_state=ReplaySSMState(rebuilt_tokens=(100, 7))),
            SimpleNamespace(_replayssm_state=ReplaySSMState(rebuilt_tokens=(30, 30))), SimpleNamespace()]
    stats = SimpleNamespace()
    metrics.collect_for_prefill(stats, reqs)
    seen = []
    with config.override(True):
        hooks.report_lost_hit(lambda *a, **k: seen.append(metrics._pending.get()), reporter, None, stats, False)
    assert seen == [(0, 130, 37)]
    assert [value(n) - b for n, b in zip(names, before)] == [130, 2, 37, 2]
    assert value(metrics.POOL_BYTES_PROMETHEUS_NAME) == pool.nbytes > 0
    pool.assign(torch.arange(6, 8))
    with config.override(True):
        hooks.report_lost_hit(lambda *a, **k: None, reporter, None, SimpleNamespace(), False)
    assert value(metrics.EVICTED_PROMETHEUS_NAME) - before[3] == 4  # counted once each
