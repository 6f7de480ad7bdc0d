"""Drive one arm's workload against a running server: warmup, counters, the measured run."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass

from tqdm import tqdm

from sglang_replayssm.bench import client
from sglang_replayssm.bench.metrics import summarize
from sglang_replayssm.bench.records import RequestRecord
from sglang_replayssm.bench.server_metrics import CacheCounters, server_hit_rate
from sglang_replayssm.bench.workload import Conversation, Turn


class ArmRunError(RuntimeError):
    """The arm's server answered, but not usefully (every request failed, ...)."""


@dataclass
class ArmRun:
    records: list[RequestRecord]
    summary: dict[str, object]
    server: dict[str, float | None]
    notes: list[str]


async def cache_counters(base_url: str) -> CacheCounters | None:
    try:
        status, text = await client.get_text(base_url, "/metrics")
    except Exception:
        return None
    return CacheCounters.parse(text) if status == 200 else None


async def _run(base_url: str, conversations: Sequence[Conversation], warmup: Sequence[Turn], *,
               request_rate: float, max_concurrency: int | None, seed: int, flush_cache: bool,
               label: str, disable_tqdm: bool) -> ArmRun:
    notes: list[str] = []
    if warmup:
        warm = [Conversation(i, -1, 0, (t,)) for i, t in enumerate(warmup)]
        done = await client.run_conversations(base_url, warm, request_rate=float("inf"),
                                              max_concurrency=1, seed=seed)
        failed = [r for r in done if not r.ok]
        if failed:
            raise ArmRunError(f"warmup request failed: {failed[0].error}")
    if flush_cache:
        status = await client.post(base_url, "/flush_cache")
        if status != 200:
            notes.append(f"/flush_cache answered HTTP {status}")
    before = await cache_counters(base_url)
    if before is None:
        notes.append("no /metrics counters (server without --enable-metrics?): server hit rate unknown")
    total = sum(len(c.turns) for c in conversations)
    with tqdm(total=total, desc=label, unit="req", disable=disable_tqdm) as bar:
        t0 = time.perf_counter()
        records = await client.run_conversations(
            base_url, conversations, request_rate=request_rate, max_concurrency=max_concurrency, seed=seed,
            on_done=lambda _r: bar.update(1))
        wall = time.perf_counter() - t0
    after = await cache_counters(base_url) if before is not None else None
    if not any(r.ok for r in records):
        first = next((r.error for r in records if r.error), "no requests")
        raise ArmRunError(f"every request failed; first error: {first}")
    return ArmRun(records, summarize(records, wall), server_hit_rate(before, after), notes)


def run_arm(base_url: str, conversations: Sequence[Conversation], warmup: Sequence[Turn], *,
            request_rate: float, max_concurrency: int | None, seed: int, flush_cache: bool = False,
            label: str = "", disable_tqdm: bool = False) -> ArmRun:
    return asyncio.run(_run(base_url, conversations, warmup, request_rate=request_rate,
                            max_concurrency=max_concurrency, seed=seed, flush_cache=flush_cache,
                            label=label, disable_tqdm=disable_tqdm))


def reachable(base_url: str, timeout_s: float) -> tuple[bool, str]:
    """Whether a server answers at ``base_url`` (``/health``, else ``/model_info``)."""
    async def check() -> tuple[bool, str]:
        reason = ""
        for path in ("/health", "/model_info"):
            try:
                status, _ = await client.get_text(base_url, path, timeout_s)
            except Exception as exc:
                reason = f"{type(exc).__name__}: {exc}".rstrip(": ")
                continue
            if status == 200:
                return True, ""
            reason = f"GET {path} answered HTTP {status}"
        return False, reason

    return asyncio.run(check())


def server_model_path(base_url: str) -> str | None:
    """The model (tokenizer) path a running server reports, if it does."""
    import json

    async def get() -> str | None:
        try:
            status, text = await client.get_text(base_url, "/model_info")
        except Exception:
            return None
        if status != 200:
            return None
        info = json.loads(text)
        return info.get("tokenizer_path") or info.get("model_path")

    return asyncio.run(get())
