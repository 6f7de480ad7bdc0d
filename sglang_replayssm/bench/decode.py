"""Decode throughput of a live server: ``concurrency`` requests at once, then SGLang's own step log.

Every request has a distinct random prompt of ``prompt_len`` tokens (no prefix sharing) and decodes
``output_len`` greedy tokens with ``ignore_eos``, so the batch stays full until the end. Two numbers:

* ``output_tok_s``: all completion tokens / wall time from the first send to the last answer
  (prefill included, as a client sees it);
* ``step_ms``: from the server log's ``Decode batch`` lines (metrics_reporter.py), over the lines
  written while the whole batch was running (``#running-req`` == concurrency): per-step time =
  running / gen throughput, as median and p90 (steady state, prefill excluded).
"""

from __future__ import annotations

import asyncio
import random
import re
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp

from sglang_replayssm.bench.kl import quantile

DECODE_LINE = re.compile(r"Decode batch.*?#running-req:\s*(?P<running>\d+),.*?"
                         r"gen throughput \(token/s\):\s*(?P<tput>[0-9.]+)")


def decode_steps(log_text: str, running: int) -> list[float]:
    """Per-step decode time (ms) of every ``Decode batch`` line with ``#running-req == running``."""
    out = []
    for m in DECODE_LINE.finditer(log_text):
        tput = float(m["tput"])
        if int(m["running"]) == running and tput > 0:
            out.append(1000.0 * running / tput)
    return out


async def _one(session: aiohttp.ClientSession, url: str, ids: Sequence[int], new: int) -> int:
    payload = {"input_ids": list(ids),
               "sampling_params": {"temperature": 0.0, "max_new_tokens": new, "ignore_eos": True}}
    async with session.post(url + "/generate", json=payload,
                            timeout=aiohttp.ClientTimeout(total=None, sock_connect=30)) as resp:
        body = await resp.json(content_type=None)
        if resp.status != 200 or not isinstance(body, dict) or "meta_info" not in body:
            raise RuntimeError(f"/generate answered HTTP {resp.status}: {str(body)[:300]}")
        return int(body["meta_info"]["completion_tokens"])


async def _burst(url: str, prompts: Sequence[Sequence[int]], new: int) -> tuple[int, float]:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        t0 = time.perf_counter()
        counts = await asyncio.gather(*(_one(session, url, p, new) for p in prompts))
        return sum(counts), time.perf_counter() - t0


def run_decode(url: str, concurrency: int, prompt_len: int, output_len: int, *, log_path: Path | None = None,
               vocab: tuple[int, int] = (10, 2000), seed: int = 3) -> dict[str, Any]:
    """One burst of ``concurrency`` requests; step times from ``log_path`` (the server's log) if given."""
    rng = random.Random(f"{seed}-{concurrency}")
    prompts = [[rng.randrange(*vocab) for _ in range(prompt_len)] for _ in range(concurrency)]
    log_start = log_path.stat().st_size if log_path is not None and log_path.exists() else 0
    tokens, wall = asyncio.run(_burst(url.rstrip("/"), prompts, output_len))
    steps: list[float] = []
    if log_path is not None and log_path.exists():
        with open(log_path, errors="replace") as f:
            f.seek(log_start)
            steps = decode_steps(f.read(), concurrency)
    return {
        "concurrency": concurrency, "prompt_len": prompt_len, "output_len": output_len,
        "output_tokens": tokens, "wall_s": wall, "output_tok_s": tokens / wall if wall > 0 else float("nan"),
        "step_ms_p50": quantile(steps, 0.5), "step_ms_p90": quantile(steps, 0.9), "step_lines": len(steps),
    }
