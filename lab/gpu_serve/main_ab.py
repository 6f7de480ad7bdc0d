"""The main job with its arms paired: every arm's server up at once (decode_ab.py's group), one request at a
time, each request sent to every arm (the order rotating) before the next, so host drift between and within
calls hits every arm alike. Arms measured one after another on the lab host differed by 27-33 ms on cold
prompts where a paired run showed 5.

The workload is the bench's (``sglang-replayssm bench`` arguments, e.g. serve_check.py's RAG_ARGS), sent in the
order its ``--max-concurrency 1`` client sends it (every conversation's first turn, then every second, ...);
each arm keeps its own conversation histories (its own outputs). Per arm: hit rate beside the attention-only
ceiling, TTFT p50 / p90 / mean; per arm against the first: the per-request TTFT difference (median, p10, p90)
over every request, over the requests both arms hit alike and over those this arm hit deeper; the first
request's TTFT (a server's first use of each path).
"""

from __future__ import annotations

import asyncio
import shlex
import time
from pathlib import Path
from typing import Any

import aiohttp

from sglang_replayssm.bench import cli as bench_cli
from sglang_replayssm.bench.ceiling import ceiling_hit_rate, ceiling_tokens
from sglang_replayssm.bench.client import generate, post
from sglang_replayssm.bench.memory import resolve_defaults
from sglang_replayssm.bench.metrics import percentile, summarize
from sglang_replayssm.bench.model import vocab_ids
from sglang_replayssm.bench.records import RequestRecord
from sglang_replayssm.bench.workload import Conversation, Turn, first_tokens, warmup_requests


def workload(bench_args: str, model_path: Path) -> tuple[list[Conversation], list[Turn]]:
    """The conversations and warmup requests ``sglang-replayssm bench`` builds from ``bench_args``."""
    args = bench_cli.build_parser().parse_args(["--model-path", str(model_path), *shlex.split(bench_args)])
    resolve_defaults(args)
    vocab = vocab_ids(model_path)
    conversations = bench_cli._workload(args, vocab, model_path)
    first_len = max((len(c.turns[0].new_ids) for c in conversations if c.turns), default=16)
    warm = warmup_requests(args.warmup_requests, vocab, args.seed, first_tokens(conversations), input_len=first_len)
    return conversations, warm


def send_order(conversations: list[Conversation]) -> list[tuple[Conversation, int]]:
    """Turns in the order a one-at-a-time client sends them: every first turn, then every second, ..."""
    depth = max((len(c.turns) for c in conversations), default=0)
    return [(c, t) for t in range(depth) for c in conversations if t < len(c.turns)]


async def run_paired(urls: dict[str, str], conversations: list[Conversation],
                     warm: list[Turn]) -> dict[str, list[RequestRecord]]:
    """Every arm's warmup and ``/flush_cache``, then the workload's requests, each to every arm in turn."""
    arms = list(urls)
    records: dict[str, list[RequestRecord]] = {a: [] for a in arms}
    history: dict[tuple[str, int], list[int]] = {}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        t0 = time.perf_counter()
        for arm in arms:
            for i, turn in enumerate(warm):
                await generate(session, urls[arm], turn.new_ids, turn.output_len,
                               RequestRecord(f"warm-{i}", -1, 0, 0), t0)
            await post(urls[arm], "/flush_cache")
        t0 = time.perf_counter()
        for k, (conv, t) in enumerate(send_order(conversations)):
            for arm in arms[k % len(arms):] + arms[:k % len(arms)]:
                rec = RequestRecord(conv.rid(t), conv.cid, t, conv.group)
                prompt = history.get((arm, conv.cid), []) + list(conv.turns[t].new_ids)
                await generate(session, urls[arm], prompt, conv.turns[t].output_len, rec, t0)
                records[arm].append(rec)
                history[(arm, conv.cid)] = prompt + rec.output_ids
    return records


def _spread(values: list[float]) -> dict[str, Any]:
    return {"n": len(values), **{f"p{q}_ms": None if not values else round(1e3 * (percentile(values, q) or 0.0), 2)
                                  for q in (10, 50, 90)}}


def compare(conversations: list[Conversation], records: dict[str, list[RequestRecord]]) -> dict[str, Any]:
    """Per arm: the bench summary and ceiling; against the first arm: per-request TTFT differences."""
    first = next(iter(records))
    out: dict[str, Any] = {}
    for arm, recs in records.items():
        s = summarize(recs, sum(r.e2e_s or 0.0 for r in recs))
        row = {k: s.get(k) for k in ("hit_rate", "ttft_mean_s", "ttft_p50_s", "ttft_p90_s", "e2e_p50_s",
                                     "requests_ok", "requests_failed")}
        row["ceiling_hit_rate"] = ceiling_hit_rate(ceiling_tokens(conversations, recs), recs)
        row["first_ttft_ms"] = round(1e3 * (recs[0].ttft_s or 0.0), 1) if recs else None
        pairs = [(a, b) for a, b in zip(records[first], recs) if a.ok and b.ok and a.rid == b.rid]
        diffs = {"all": [], "same_hit": [], "deeper_hit": [], "shallower_hit": []}
        for a, b in pairs[1:]:  # the first request pays first-use costs (first_ttft_ms)
            d = (b.ttft_s or 0.0) - (a.ttft_s or 0.0)
            diffs["all"].append(d)
            key = "same_hit" if b.cached_tokens == a.cached_tokens else (
                "deeper_hit" if b.cached_tokens > a.cached_tokens else "shallower_hit")
            diffs[key].append(d)
        row["ttft_minus_first_arm"] = {k: _spread(v) for k, v in diffs.items()}
        out[arm] = row
    return out


def table(result: dict[str, Any]) -> str:
    lines = []
    for workload_name, res in result.items():
        by_arm = res["arms"]
        lines += [f"main job, paired: {workload_name}",
                  "| arm | hit | ceiling | TTFT p50 / p90 ms | first request ms | TTFT - first arm, p50 ms "
                  "(all / same hit / deeper hit) |", "|---|---|---|---|---|---|"]
        for arm, r in by_arm.items():
            d = r["ttft_minus_first_arm"]
            cells = " / ".join(f"{d[k]['p50_ms']} (n={d[k]['n']})" for k in ("all", "same_hit", "deeper_hit"))
            lines.append(f"| {arm} | {100 * (r['hit_rate'] or 0):.2f}% | {100 * (r['ceiling_hit_rate'] or 0):.2f}% | "
                         f"{1e3 * (r['ttft_p50_s'] or 0):.1f} / {1e3 * (r['ttft_p90_s'] or 0):.1f} | "
                         f"{r['first_ttft_ms']} | {cells} |")
        lines.append("")
    return "\n".join(lines)


def run_main_pairs(urls: dict[str, str], workloads: dict[str, str], model_path: Path) -> dict[str, Any]:
    """For each workload (name -> bench arguments): the paired run and its comparison."""
    result: dict[str, Any] = {}
    for name, bench_args in workloads.items():
        conversations, warm = workload(bench_args, model_path)
        records = asyncio.run(run_paired(urls, conversations, warm))
        rows = {arm: [[r.rid, r.prompt_tokens, r.cached_tokens, None if r.ttft_s is None else round(1e3 * r.ttft_s, 2)]
                      for r in recs] for arm, recs in records.items()}
        result[name] = {"arms": compare(conversations, records), "requests": rows}
    return result
