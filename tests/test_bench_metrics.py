"""Metric arithmetic on known synthetic records: percentiles, hit rate, agreement, server counters."""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang_replayssm.bench.metrics import agreement, hit_rate, mean, percentile, summarize
from sglang_replayssm.bench.records import RequestRecord
from sglang_replayssm.bench.server_metrics import CacheCounters, metric_sum, metric_sums, server_hit_rate


def rec(rid: str, prompt: int = 10, cached: int = 0, out: list[int] | None = None, ttft: float | None = 0.1,
        e2e: float | None = 0.5, error: str | None = None) -> RequestRecord:
    out = [1, 2, 3] if out is None else out
    conv, turn = (int(x) for x in rid.split("."))
    return RequestRecord(rid, conv, turn, 0, prompt_tokens=prompt, cached_tokens=cached,
                         completion_tokens=len(out), ttft_s=ttft, e2e_s=e2e, output_ids=list(out), error=error)


@given(st.lists(st.floats(-1e6, 1e6), min_size=1, max_size=50), st.floats(0, 100))
@settings(max_examples=100, deadline=None)
def test_percentile_matches_numpy_linear(values: list[float], q: float) -> None:
    assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)), rel=1e-9, abs=1e-6)


def test_percentile_known_values_and_edges() -> None:
    data = [float(x) for x in range(1, 101)]
    random.Random(0).shuffle(data)
    assert percentile(data, 50) == pytest.approx(50.5)
    assert percentile(data, 0) == 1.0
    assert percentile(data, 100) == 100.0
    assert percentile(data, 99) == pytest.approx(99.01)
    assert percentile([3.0], 90) == 3.0
    assert percentile([], 50) is None
    with pytest.raises(ValueError):
        percentile(data, 101)
    assert mean([1.0, 2.0, 6.0]) == 3.0
    assert mean([]) is None


def test_hit_rate_is_token_weighted_and_skips_failed_requests() -> None:
    records = [rec("0.0", prompt=100, cached=0), rec("1.0", prompt=100, cached=90),
               rec("2.0", prompt=200, cached=150), rec("3.0", prompt=1000, cached=1000, error="boom")]
    assert hit_rate(records) == pytest.approx(240 / 400)
    assert hit_rate([]) is None


def test_agreement_identical_outputs() -> None:
    ref = [rec("0.0", out=[1, 2, 3]), rec("1.0", out=[4, 5])]
    a = agreement("baseline", ref, [rec("1.0", out=[4, 5]), rec("0.0", out=[1, 2, 3])])
    assert a.reference == "baseline"
    assert (a.requests, a.requests_equal, a.tokens, a.tokens_matched) == (2, 2, 5, 5)
    assert a.token_fraction == 1.0 and a.request_fraction == 1.0
    assert a.first_diff_rid is None and a.first_diff_token is None


def test_agreement_counts_tokens_up_to_first_difference_and_names_first_request() -> None:
    ref = [rec("0.0", out=[1, 2, 3, 4]), rec("1.0", out=[5, 6, 7, 8]), rec("2.0", out=[9, 9, 9, 9])]
    arm = [rec("0.0", out=[1, 2, 3, 4]), rec("1.0", out=[5, 6, 0, 8]), rec("2.0", out=[0, 9, 9, 9])]
    a = agreement("baseline", ref, arm)
    assert (a.requests, a.requests_equal, a.tokens, a.tokens_matched) == (3, 1, 12, 4 + 2 + 0)
    assert a.token_fraction == pytest.approx(6 / 12)
    assert a.request_fraction == pytest.approx(1 / 3)
    assert (a.first_diff_rid, a.first_diff_token) == ("1.0", 2)
    assert a.to_json()["token_fraction"] == pytest.approx(0.5)


def test_agreement_length_mismatch_and_failed_or_missing_requests() -> None:
    ref = [rec("0.0", out=[1, 2, 3]), rec("1.0", out=[1]), rec("2.0", out=[7], error="x")]
    arm = [rec("0.0", out=[1, 2]), rec("1.0", out=[1], error="timeout"), rec("2.0", out=[7]), rec("3.0")]
    a = agreement("ref", ref, arm)
    assert (a.requests, a.requests_equal, a.tokens, a.tokens_matched) == (1, 0, 3, 2)
    assert (a.first_diff_rid, a.first_diff_token) == ("0.0", 2)
    empty = agreement("ref", [], arm)
    assert empty.token_fraction is None and empty.request_fraction is None


def test_summarize_known_records() -> None:
    records = [rec("0.0", prompt=100, cached=0, out=[1] * 10, ttft=0.4, e2e=1.0),
               rec("1.0", prompt=100, cached=80, out=[1] * 10, ttft=0.1, e2e=0.5),
               rec("2.0", prompt=100, cached=80, out=[1] * 20, ttft=0.1, e2e=0.7),
               rec("3.0", error="HTTP 500", ttft=None, e2e=None)]
    s = summarize(records, wall_s=2.0)
    assert (s["requests_total"], s["requests_ok"], s["requests_failed"]) == (4, 3, 1)
    assert s["hit_rate"] == pytest.approx(160 / 300)
    assert s["ttft_mean_s"] == pytest.approx(0.2)
    assert s["ttft_p50_s"] == pytest.approx(0.1)
    assert s["ttft_p90_s"] == pytest.approx(0.1 + 0.8 * 0.3)
    assert s["e2e_mean_s"] == pytest.approx(2.2 / 3)
    assert s["output_tokens"] == 40
    assert s["output_tok_s"] == pytest.approx(20.0)


METRICS_PAGE = """\
# HELP sglang:prompt_tokens_total Number of prefill tokens processed.
# TYPE sglang:prompt_tokens_total counter
sglang:prompt_tokens_total{model_name="m",is_streaming="true"} 1500.0
sglang:prompt_tokens_total{model_name="m",is_streaming="false"} 500.0
sglang:prompt_tokens_created{model_name="m",is_streaming="true"} 1.7e9
sglang:cached_tokens_total{model_name="m",cache_source="device"} 700.0
sglang:cached_tokens_total{model_name="m",cache_source="host"} 100.0
sglang:cache_hit_rate{model_name="m"} 0.25
garbage line without value
"""


def test_metric_sums_adds_label_sets() -> None:
    sums = metric_sums(METRICS_PAGE)
    assert sums["sglang:prompt_tokens_total"] == 2000.0
    assert sums["sglang:cached_tokens_total"] == 800.0
    assert sums["sglang:cache_hit_rate"] == 0.25


def test_server_hit_rate_is_the_delta_between_snapshots() -> None:
    before = CacheCounters(cached_tokens=100.0, prompt_tokens=400.0)
    after = CacheCounters.parse(METRICS_PAGE)
    out = server_hit_rate(before, after)
    assert out == {"cached_tokens": 700.0, "prompt_tokens": 1600.0, "hit_rate": pytest.approx(700 / 1600),
                   "lost_hit_tokens": None, "lost_hit_rate": None}


def test_server_counters_absent_or_without_hits() -> None:
    no_hits = CacheCounters.parse('sglang:prompt_tokens_total{a="b"} 10\n')
    assert no_hits == CacheCounters(cached_tokens=0.0, prompt_tokens=10.0)
    assert CacheCounters.parse("") == CacheCounters(None, None)
    assert server_hit_rate(None, no_hits)["hit_rate"] is None
    assert server_hit_rate(no_hits, no_hits)["hit_rate"] is None  # no prompt tokens in between


def test_lost_hit_tokens_are_the_plugins_counter_between_snapshots() -> None:
    """The plugin's lost-hit counter (summed over label sets) rides beside SGLang's: its delta and its share of the
    prompt tokens; a series that first appears after the first snapshot started at 0; no series after: unknown."""
    lost = "sglang:replayssm_mamba_lost_hit_tokens_total"
    after = CacheCounters.parse(METRICS_PAGE + f'{lost}{{model_name="m",tp_rank="0"}} 250.0\n'
                                f'{lost}{{model_name="m",tp_rank="1"}} 50.0\n')
    assert after.lost_hit_tokens == 300.0 and CacheCounters.parse(METRICS_PAGE).lost_hit_tokens is None
    out = server_hit_rate(CacheCounters(100.0, 400.0, 60.0), after)
    assert out["lost_hit_tokens"] == 240.0 and out["lost_hit_rate"] == pytest.approx(240 / 1600)
    assert server_hit_rate(CacheCounters(100.0, 400.0), after)["lost_hit_tokens"] == 300.0
    none_yet = server_hit_rate(CacheCounters(100.0, 400.0), CacheCounters.parse(METRICS_PAGE))
    assert none_yet["lost_hit_tokens"] is None and none_yet["lost_hit_rate"] is None


def test_metric_sum_filters_by_labels() -> None:
    page = ('# HELP sglang:load_back_tokens_total x\n'
            'sglang:load_back_tokens_total{model_name="m",pool="kv"} 12.0\n'
            'sglang:load_back_tokens_total{model_name="m",pool="mamba"} 3.0\n'
            'sglang:load_back_tokens_total_other{pool="kv"} 100.0\n')  # fmt: skip
    assert metric_sum(page, "sglang:load_back_tokens_total", pool="kv") == 12.0
    assert metric_sum(page, "sglang:load_back_tokens_total") == 15.0
    assert metric_sum(page, "sglang:load_back_tokens_total", pool="host") == 0.0
