"""Streaming client and per-arm runner against the stand-in server (no model needed)."""

from __future__ import annotations

import asyncio
import json

import pytest

from sglang_replayssm.bench import client
from sglang_replayssm.bench.runner import ArmRunError, reachable, run_arm
from sglang_replayssm.bench.workload import GspSpec, RagSpec, Turn, generate_gsp, generate_rag
from tests.support.fake_server import FakeServer, fake_output

VOCAB = list(range(2, 1000))


def test_merge_output_ids_cumulative_and_incremental() -> None:
    acc: list[int] = []
    for ids, n in (([7], 1), ([7, 8], 2), ([7, 8, 9], 3)):
        acc = client.merge_output_ids(acc, ids, n)
    assert acc == [7, 8, 9]
    acc = []
    for ids, n in (([7], 1), ([8], 2), ([9, 10], 4)):
        acc = client.merge_output_ids(acc, ids, n)
    assert acc == [7, 8, 9, 10]


def test_iter_sse_events_keeps_partial_event() -> None:
    buf = bytearray(b'data: {"a": 1}\n\ndata: [DONE]\n\ndata: {"b"')
    assert client.iter_sse_events(buf) == ['{"a": 1}', "[DONE]"]
    assert bytes(buf) == b'data: {"b"'
    buf += b": 2}\n\n"
    assert client.iter_sse_events(buf) == ['{"b": 2}']


def test_iter_sse_events_keeps_unicode_line_separators_inside_a_payload() -> None:
    """Generated text is arbitrary: a JSON string may hold U+0085 / U+2028 / U+2029 raw (json.dumps with
    ensure_ascii=False does not escape them), which ``str.splitlines`` treats as line ends."""
    payload = json.dumps({"text": "a\x85b\u2028c\u2029d\x1ce", "output_ids": [7]}, ensure_ascii=False)
    buf = bytearray(f"data: {payload}\n\ndata: [DONE]\n\n".encode())
    events = client.iter_sse_events(buf)
    assert json.loads(events[0]) == json.loads(payload) and events[1:] == ["[DONE]"]


@pytest.mark.parametrize("incremental", [False, True])
def test_gsp_run_collects_ids_ttft_and_cached_tokens(incremental: bool) -> None:
    convs = generate_gsp(GspSpec(num_groups=2, prompts_per_group=3, system_prompt_len=40, question_len=5,
                                 output_len=6, ordered=True), VOCAB, 0)
    with FakeServer(vocab_size=1000, incremental=incremental, step_s=0.002) as url:
        records = asyncio.run(client.run_conversations(url, convs, request_rate=float("inf"),
                                                       max_concurrency=1, seed=0))
    assert [r.rid for r in records] == [c.rid(0) for c in convs]
    for conv, r in zip(convs, records):
        assert r.ok, r.error
        assert r.output_ids == fake_output(conv.turns[0].new_ids, 6, 1000)
        assert r.prompt_tokens == 45 and r.completion_tokens == 6
        assert r.ttft_s is not None and r.e2e_s is not None and 0 < r.ttft_s <= r.e2e_s
    # One request at a time, ordered: the first of each group misses, the rest hit the system prompt.
    assert [r.cached_tokens for r in records] == [0, 40, 40, 0, 40, 40]


def test_multi_turn_sends_history_plus_answer() -> None:
    convs = generate_rag(RagSpec(num_docs=1, doc_len=20, system_prompt_len=10, num_conversations=1, num_turns=3,
                                 question_len=4, output_len=5), VOCAB, 0)
    with FakeServer(vocab_size=1000) as url:
        records = asyncio.run(client.run_conversations(url, convs, request_rate=float("inf"),
                                                       max_concurrency=None, seed=0))
    turns = convs[0].turns
    assert [r.prompt_tokens for r in records] == [34, 34 + 5 + 4, 34 + 5 + 4 + 5 + 4]
    # Each later turn reuses the whole previous prompt and its answer but the answer's last token
    # (sampled, never forwarded: it has no KV yet), as SGLang reports it.
    assert [r.cached_tokens for r in records] == [0, 34 + 5 - 1, 34 + 5 + 4 + 5 - 1]
    prompt1 = list(turns[0].new_ids) + records[0].output_ids + list(turns[1].new_ids)
    assert records[1].output_ids == fake_output(prompt1, 5, 1000)


def test_max_concurrency_caps_requests_in_flight() -> None:
    convs = generate_gsp(GspSpec(num_groups=1, prompts_per_group=6, system_prompt_len=4, question_len=2,
                                 output_len=5), VOCAB, 0)
    with FakeServer(vocab_size=1000, step_s=0.02) as url:
        records = asyncio.run(client.run_conversations(url, convs, request_rate=float("inf"),
                                                       max_concurrency=2, seed=0))
    events = sorted([(r.start_s, 1) for r in records] + [(r.start_s + r.e2e_s, -1) for r in records])
    in_flight = peak = 0
    for _, step in events:
        in_flight += step
        peak = max(peak, in_flight)
    assert peak == 2


def test_arrival_delays_poisson_and_infinite() -> None:
    assert client.arrival_delays(4, float("inf"), 0) == [0.0] * 4
    d = client.arrival_delays(2000, 50.0, 0)
    assert d[0] == 0.0 and all(b >= a for a, b in zip(d, d[1:]))
    assert d[-1] / 1999 == pytest.approx(1 / 50.0, rel=0.1)
    assert client.arrival_delays(5, 3.0, 1) == client.arrival_delays(5, 3.0, 1)


def test_http_error_is_recorded_and_later_turns_skipped() -> None:
    convs = generate_gsp(GspSpec(num_groups=1, prompts_per_group=1, system_prompt_len=4, question_len=2,
                                 num_turns=2), VOCAB, 0)
    with FakeServer() as url:
        records = asyncio.run(client.run_conversations(url + "/nope", convs, request_rate=float("inf"),
                                                       max_concurrency=None, seed=0))
    assert records[0].error is not None and records[0].error.startswith("HTTP 404")
    assert records[1].error is not None and "skipped" in records[1].error


def test_run_arm_reports_client_and_server_hit_rate() -> None:
    convs = generate_gsp(GspSpec(num_groups=2, prompts_per_group=4, system_prompt_len=30, question_len=6,
                                 output_len=3, ordered=True), VOCAB, 0)
    warm = [Turn((999, 998, 997), 2)]
    with FakeServer(vocab_size=1000) as url:
        run = run_arm(url, convs, warm, request_rate=float("inf"), max_concurrency=1, seed=0, disable_tqdm=True)
    assert run.summary["hit_rate"] == pytest.approx(6 * 30 / (8 * 36))
    # The server's counters are read around the measured run, so warmup does not count.
    assert run.server["prompt_tokens"] == 8 * 36
    assert run.server["hit_rate"] == pytest.approx(run.summary["hit_rate"])
    assert run.notes == []


def test_run_arm_without_metrics_page_notes_it() -> None:
    convs = generate_gsp(GspSpec(num_groups=1, prompts_per_group=2, system_prompt_len=8, question_len=2,
                                 output_len=2), VOCAB, 0)
    with FakeServer(metrics=False) as url:
        run = run_arm(url, convs, [], request_rate=float("inf"), max_concurrency=None, seed=0, disable_tqdm=True)
    assert run.server["hit_rate"] is None
    assert any("/metrics" in n for n in run.notes)


def test_run_arm_all_failed_raises() -> None:
    convs = generate_gsp(GspSpec(num_groups=1, prompts_per_group=1, system_prompt_len=4, question_len=2),
                         VOCAB, 0)
    with FakeServer() as url, pytest.raises(ArmRunError, match="every request failed"):
        run_arm(url + "/x", convs, [], request_rate=float("inf"), max_concurrency=None, seed=0,
                disable_tqdm=True)


def test_reachable() -> None:
    with FakeServer() as url:
        assert reachable(url, 5.0) == (True, "")
    ok, reason = reachable("http://127.0.0.1:9", 2.0)
    assert not ok and reason
