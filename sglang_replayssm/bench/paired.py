"""Arms measured side by side (``sglang-replayssm bench --paired``): every launched arm's server up at once, the
workload's requests one at a time, each sent to every arm in turn (the order rotating per request) before the next.

Arms measured one after another on a shared host compare the host's moods as much as the arms: on the lab GPU host
two servers differed by up to 20 ms on identical 32-token prompts, on the 2-core CPU machine the same arms' TTFT
ratio moved 0.70-0.91x between runs. Paired, host drift hits every arm alike, and each request's TTFT difference to
the first arm is a paired sample.

The turns go in the order the one-at-a-time client sends them (every conversation's first turn, then every second
turn, ...); each arm keeps its own conversation histories (its own outputs). Every arm gets its warmup requests (and
with ``--flush-cache`` a ``/flush_cache``) before the measured run. Per arm the usual results
(``report.arm_result``), plus ``paired``: the per-request TTFT difference to the first arm (p10 / p50 / p90 ms) over
every request after the first, over requests both hit alike and over requests this arm hit deeper.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp

from sglang_replayssm.bench.client import generate, post
from sglang_replayssm.bench.metrics import percentile, summarize
from sglang_replayssm.bench.records import RequestRecord, match_depth
from sglang_replayssm.bench.runner import ArmRun, cache_counters
from sglang_replayssm.bench.server_metrics import server_hit_rate
from sglang_replayssm.bench.workload import Conversation, Turn

__all__ = ["IDLE_FLAGS", "paired_differences", "run_paired", "run_paired_arms", "send_order"]

#: Every paired server sleeps while idle: an idle SGLang scheduler otherwise spins a core (measured on the CPU
#: runtime: ~100% each), and the servers waiting for their turn would slow the one serving.
IDLE_FLAGS = ("--sleep-on-idle",)


def send_order(conversations: Sequence[Conversation]) -> list[tuple[Conversation, int]]:
    """Turns in the order a one-at-a-time client sends them: every first turn, then every second, ..."""
    depth = max((len(c.turns) for c in conversations), default=0)
    return [(c, t) for t in range(depth) for c in conversations if t < len(c.turns)]


async def run_paired(urls: dict[str, str], conversations: Sequence[Conversation], warmup: Sequence[Turn],
                     flush_cache: bool = True) -> tuple[dict[str, list[RequestRecord]], float, dict[str, Any]]:
    """Every arm's warmup (and ``/flush_cache``), then each request to every arm in turn; the records per arm, the
    wall time of the measured run and each arm's cache counters before it (None: no ``/metrics``). A failed turn
    skips its conversation's later turns on that arm."""
    arms = list(urls)
    records: dict[str, list[RequestRecord]] = {a: [] for a in arms}
    history: dict[tuple[str, int], list[int] | None] = {}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        t0 = time.perf_counter()
        for arm in arms:
            for i, turn in enumerate(warmup):
                await generate(session, urls[arm], turn.new_ids, turn.output_len, RequestRecord(f"warm-{i}", -1, 0, 0), t0)
            if flush_cache:
                await post(urls[arm], "/flush_cache")
        before = {arm: await cache_counters(urls[arm]) for arm in arms}
        t0 = time.perf_counter()
        for k, (conv, t) in enumerate(send_order(conversations)):
            for arm in arms[k % len(arms):] + arms[:k % len(arms)]:
                rec = RequestRecord(conv.rid(t), conv.cid, t, conv.group)
                past = history.get((arm, conv.cid), [])
                if past is None:
                    rec.error = "skipped: an earlier turn failed"
                else:
                    prompt = past + list(conv.turns[t].new_ids)
                    await generate(session, urls[arm], prompt, conv.turns[t].output_len, rec, t0)
                    history[(arm, conv.cid)] = prompt + rec.output_ids if rec.ok else None
                records[arm].append(rec)
    return records, time.perf_counter() - t0, before


def _spread(values: list[float]) -> dict[str, Any]:
    return {"n": len(values), **{f"p{q}_ms": None if not values else round(1e3 * (percentile(values, q) or 0.0), 2)
                                  for q in (10, 50, 90)}}


def paired_differences(first: Sequence[RequestRecord], arm: Sequence[RequestRecord]) -> dict[str, Any]:
    """The arm's TTFT minus the first arm's, request by request (the first request apart: first-use costs):
    over all requests both completed, over those both hit alike, deeper and shallower (cached tokens)."""
    diffs: dict[str, list[float]] = {"all": [], "same_hit": [], "deeper_hit": [], "shallower_hit": []}
    pairs = [(a, b) for a, b in zip(first, arm) if a.rid == b.rid and a.ok and b.ok]
    for a, b in pairs[1:]:
        d = (b.ttft_s or 0.0) - (a.ttft_s or 0.0)
        diffs["all"].append(d)
        diffs[f"{match_depth(a.cached_tokens, b.cached_tokens)}_hit"].append(d)
    out: dict[str, Any] = {k: _spread(v) for k, v in diffs.items()}
    out["first_request_ms"] = [None if r.ttft_s is None else round(1e3 * r.ttft_s, 1) for r in (first[0], arm[0])
                               ] if first and arm else None
    return out


def format_paired(doc_arms: dict[str, Any]) -> str:
    """One line per arm: its per-request TTFT difference to the first arm."""
    rows = []
    for name, arm in doc_arms.items():
        d = arm.get("paired")
        if d:
            a = d["all"]
            rows.append(f"{name:10} TTFT - first arm per request: p50 {a['p50_ms']} ms (p10 {a['p10_ms']}, p90 "
                        f"{a['p90_ms']}; n {a['n']}); same hit {d['same_hit']['p50_ms']} (n {d['same_hit']['n']}), "
                        f"deeper {d['deeper_hit']['p50_ms']} (n {d['deeper_hit']['n']})")
    return "\n".join(rows)


def run_paired_arms(bench: Any, conversations: list[Conversation], warmup: list[Turn], model_dir: Path,
                    device: str, names: list[str]) -> None:
    """Start every arm's server, then the paired run; each arm's results go to ``bench`` as a sequential arm's
    do (an arm whose server does not start is a failed arm; the others run)."""
    from sglang_replayssm.bench.launch import arm_launch
    from sglang_replayssm.bench.memory import spent_bytes
    from sglang_replayssm.bench.server import ServerProcess, ServerStartError, pick_port

    args = bench.args
    with contextlib.ExitStack() as stack:
        up: dict[str, tuple[Any, Any]] = {}
        for name in names:
            bench.doc["arm_order"].append(name)
            spec = arm_launch(args, name, model_dir, device, pick_port(), bench.budgets, common=IDLE_FLAGS)
            try:
                srv = stack.enter_context(ServerProcess(spec.cmd, spec.env, spec.log_path, spec.base_url,
                                                        args.ready_check_timeout_sec))
            except (ServerStartError, OSError) as exc:
                print(f"error: arm {name} failed: {exc}", file=sys.stderr, flush=True)
                bench.add_failure(name, str(exc), spec.cmd_str, log=str(spec.log_path),
                                  summary=str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
                continue
            print(f"[{name}] server healthy after {srv.startup_s:.1f} s", flush=True)
            up[name] = (srv, spec)
        if not up:
            return
        urls = {n: srv.base_url for n, (srv, _) in up.items()}
        print(f"paired: {len(send_order(conversations))} requests x {len(urls)} arms, one at a time", flush=True)
        records, wall, before = asyncio.run(run_paired(urls, conversations, warmup, flush_cache=args.flush_cache))
        first = next(iter(records))
        for name, (srv, spec) in up.items():
            after = asyncio.run(cache_counters(urls[name])) if before[name] is not None else None
            run = ArmRun(records[name], summarize(records[name], wall), server_hit_rate(before[name], after), [])
            bench.add_arm(name, run, spec.cmd_str, log=str(spec.log_path), startup_s=srv.startup_s,
                          cache_bytes=spent_bytes(bench.sizes, spec.log_path, srv.base_url),
                          equal_memory=spec.budget.as_dict() if spec.budget else None,
                          paired=paired_differences(records[first], records[name]))
    print(format_paired(bench.doc["arms"]), flush=True)
