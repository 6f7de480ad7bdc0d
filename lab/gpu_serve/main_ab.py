"""The main job with its arms paired on the GPU servers decode_ab.py starts (every arm's server up at once):
``sglang-replayssm bench --paired``'s run (bench/paired.py) over serve_check.py's workloads, beside the
attention-only ceiling.

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
from pathlib import Path
from typing import Any

from sglang_replayssm.bench import cli as bench_cli
from sglang_replayssm.bench.ceiling import ceiling_hit_rate, ceiling_tokens
from sglang_replayssm.bench.memory import resolve_defaults
from sglang_replayssm.bench.metrics import summarize
from sglang_replayssm.bench.model import vocab_ids
from sglang_replayssm.bench.paired import paired_differences, run_paired
from sglang_replayssm.bench.records import RequestRecord
from sglang_replayssm.bench.ttft_bound import bounds, format_bounds
from sglang_replayssm.bench.workload import Conversation, Turn


def workload(bench_args: str, model_path: Path) -> tuple[list[Conversation], list[Turn]]:
    """The conversations and warmup requests ``sglang-replayssm bench`` builds from ``bench_args``."""
    args = bench_cli.build_parser().parse_args(["--model-path", str(model_path), *shlex.split(bench_args)])
    resolve_defaults(args)
    return bench_cli.workload_and_warmup(args, vocab_ids(model_path), model_path)


def compare(conversations: list[Conversation], records: dict[str, list[RequestRecord]]) -> dict[str, Any]:
    """Per arm: the bench summary, the ceiling and the paired differences to the first arm."""
    first = next(iter(records))
    out: dict[str, Any] = {}
    for arm, recs in records.items():
        s = summarize(recs, sum(r.e2e_s or 0.0 for r in recs))
        row = {k: s.get(k) for k in ("hit_rate", "ttft_mean_s", "ttft_p50_s", "ttft_p90_s", "e2e_p50_s",
                                     "requests_ok", "requests_failed")}
        row["ceiling_hit_rate"] = ceiling_hit_rate(ceiling_tokens(conversations, recs), recs)
        computed = sorted(r.prompt_tokens - r.cached_tokens for r in recs if r.ok)
        row["prefill_tokens"] = sum(computed)  # what the arm prefilled: its TTFT's share that hits can cut
        row["prefill_tokens_p50"] = computed[len(computed) // 2] if computed else None
        row["first_ttft_ms"] = round(1e3 * (recs[0].ttft_s or 0.0), 1) if recs else None
        row["ttft_minus_first_arm"] = paired_differences(records[first], recs)
        out[arm] = row
    return out


def hits_allow(records: dict[str, list[RequestRecord]]) -> dict[str, Any]:
    """Per arm after the first: the TTFT its hits allow at the first arm's per-request costs (bench/ttft_bound.py)."""
    return bounds({arm: {"requests": [r.to_json() for r in recs]} for arm, recs in records.items()}, next(iter(records)))


def table(result: dict[str, Any]) -> str:
    lines = []
    for workload_name, res in result.items():
        by_arm = res["arms"]
        lines += [f"main job, paired: {workload_name}",
                  "| arm | hit | ceiling | prefilled tokens (sum / p50) | TTFT p50 / p90 / mean ms | first request "
                  "ms | TTFT - first arm, p50 ms (all / same hit / deeper hit) |", "|---|---|---|---|---|---|---|"]
        for arm, r in by_arm.items():
            d = r["ttft_minus_first_arm"]
            cells = " / ".join(f"{d[k]['p50_ms']} (n={d[k]['n']})" for k in ("all", "same_hit", "deeper_hit"))
            lines.append(f"| {arm} | {100 * (r['hit_rate'] or 0):.2f}% | {100 * (r['ceiling_hit_rate'] or 0):.2f}% | "
                         f"{r['prefill_tokens']} / {r['prefill_tokens_p50']} | "
                         f"{1e3 * (r['ttft_p50_s'] or 0):.1f} / {1e3 * (r['ttft_p90_s'] or 0):.1f} / "
                         f"{1e3 * (r['ttft_mean_s'] or 0):.1f} | "
                         f"{r['first_ttft_ms']} | {cells} |")
        if res.get("ttft_bound"):
            lines += ["", "TTFT the hits allow at the first arm's costs (fixed + per prefilled token):",
                      format_bounds(res["ttft_bound"], next(iter(by_arm)))]
        lines.append("")
    return "\n".join(lines)


def run_main_pairs(urls: dict[str, str], workloads: dict[str, str], model_path: Path) -> dict[str, Any]:
    """For each workload (name -> bench arguments): the paired run and its comparison."""
    result: dict[str, Any] = {}
    for name, bench_args in workloads.items():
        conversations, warm = workload(bench_args, model_path)
        records, _, _ = asyncio.run(run_paired(urls, conversations, warm))
        rows = {arm: [[r.rid, r.prompt_tokens, r.cached_tokens, None if r.ttft_s is None else round(1e3 * r.ttft_s, 2)]
                      for r in recs] for arm, recs in records.items()}
        result[name] = {"arms": compare(conversations, records), "requests": rows, "ttft_bound": hits_allow(records)}
    return result
