"""aiohttp streaming client for SGLang's native ``/generate``: greedy, token ids in and out."""

from __future__ import annotations

import asyncio
import json
import random
import re
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import aiohttp

from sglang_replayssm.bench.records import RequestRecord
from sglang_replayssm.bench.workload import Conversation

_TIMEOUT = aiohttp.ClientTimeout(total=None, sock_connect=30, sock_read=None)


def generate_payload(input_ids: Sequence[int], max_new_tokens: int, ignore_eos: bool = True) -> dict[str, Any]:
    return {
        "input_ids": list(input_ids),
        "sampling_params": {"temperature": 0.0, "max_new_tokens": max_new_tokens, "ignore_eos": ignore_eos},
        "stream": True,
    }


def merge_output_ids(acc: list[int], chunk_ids: list[int], completion_tokens: int | None) -> list[int]:
    """Output ids after one stream chunk, whether the server streams cumulative ids or deltas.

    SGLang sends the ids so far (default) or only the new ones (``--incremental-streaming-output``);
    a chunk whose length is the completion count so far is cumulative.
    """
    if completion_tokens is not None and len(chunk_ids) == completion_tokens:
        return list(chunk_ids)
    return acc + list(chunk_ids)


def iter_sse_events(buffer: bytearray) -> list[str]:
    """Pop complete ``data: ...`` payloads off ``buffer`` (events end with a blank line). Lines end at CR / LF
    only (the SSE rule): a payload's JSON text may hold U+0085, U+2028 or U+2029 raw, where ``str.splitlines``
    would cut it."""
    events: list[str] = []
    while True:
        end = buffer.find(b"\n\n")
        if end < 0:
            return events
        raw = bytes(buffer[:end]).decode("utf-8", errors="replace")
        del buffer[:end + 2]
        for line in re.split(r"\r\n|\r|\n", raw):
            if line.startswith("data:"):
                events.append(line[5:].strip())


async def stream_chunks(resp: aiohttp.ClientResponse) -> AsyncIterator[dict[str, Any]]:
    """The JSON chunks of a streaming /generate response, in order (``[DONE]`` left out)."""
    buffer = bytearray()
    async for piece in resp.content.iter_any():
        buffer += piece
        for data in iter_sse_events(buffer):
            if data != "[DONE]":
                yield json.loads(data)


async def generate(session: aiohttp.ClientSession, base_url: str, input_ids: Sequence[int],
                   max_new_tokens: int, record: RequestRecord, t_origin: float) -> RequestRecord:
    """Send one streaming request and fill ``record`` in; errors are recorded, not raised."""
    record.max_new_tokens = max_new_tokens
    record.prompt_tokens = len(input_ids)
    t0 = time.perf_counter()
    record.start_s = t0 - t_origin
    try:
        async with session.post(base_url + "/generate", json=generate_payload(input_ids, max_new_tokens),
                                timeout=_TIMEOUT) as resp:
            if resp.status != 200:
                body = (await resp.text())[:500]
                record.error = f"HTTP {resp.status}: {body}"
                return record
            ids: list[int] = []
            meta: dict[str, Any] = {}
            async for chunk in stream_chunks(resp):
                if "error" in chunk:
                    record.error = str(chunk["error"])[:500]
                    return record
                meta = chunk.get("meta_info") or meta
                ids = merge_output_ids(ids, chunk.get("output_ids") or [], meta.get("completion_tokens"))
                if ids and record.ttft_s is None:
                    record.ttft_s = time.perf_counter() - t0
            record.e2e_s = time.perf_counter() - t0
            record.output_ids = ids
            record.completion_tokens = int(meta.get("completion_tokens", len(ids)))
            record.prompt_tokens = int(meta.get("prompt_tokens", len(input_ids)))
            record.cached_tokens = int(meta.get("cached_tokens", 0))
            record.spec_verify_ct = int(meta.get("spec_verify_ct") or 0)
            record.spec_correct_drafts = int(meta.get("spec_num_correct_drafts") or 0)
            if record.ttft_s is None:
                record.error = "the stream ended without output tokens"
    except (aiohttp.ClientError, asyncio.TimeoutError, json.JSONDecodeError, ValueError) as exc:
        record.error = f"{type(exc).__name__}: {exc}"
    return record


def arrival_delays(n: int, request_rate: float, seed: int) -> list[float]:
    """Start offsets (s) of ``n`` arrivals: Poisson at ``request_rate``/s, all at 0 when infinite."""
    if request_rate == float("inf") or request_rate <= 0:
        return [0.0] * n
    rng = random.Random(seed + 4)
    t, out = 0.0, []
    for _ in range(n):
        out.append(t)
        t += rng.expovariate(request_rate)
    return out


async def run_conversations(base_url: str, conversations: Sequence[Conversation], *, request_rate: float,
                            max_concurrency: int | None, seed: int,
                            on_done: Callable[[RequestRecord], None] | None = None) -> list[RequestRecord]:
    """Drive every conversation; a turn is sent when the previous one finished.

    Conversations start on the arrival process; ``max_concurrency`` caps requests in flight.
    Records come back in workload order (conversation, turn).
    """
    base_url = base_url.rstrip("/")
    sem = asyncio.Semaphore(max_concurrency) if max_concurrency else None
    delays = arrival_delays(len(conversations), request_rate, seed)
    results: dict[str, RequestRecord] = {}
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        t_origin = time.perf_counter()

        async def one(conv: Conversation, delay: float) -> None:
            await asyncio.sleep(max(0.0, t_origin + delay - time.perf_counter()))
            history: list[int] = []
            for t, turn in enumerate(conv.turns):
                record = RequestRecord(conv.rid(t), conv.cid, t, conv.group)
                prompt = history + list(turn.new_ids)
                if sem is not None:
                    async with sem:
                        await generate(session, base_url, prompt, turn.output_len, record, t_origin)
                else:
                    await generate(session, base_url, prompt, turn.output_len, record, t_origin)
                results[record.rid] = record
                if on_done is not None:
                    on_done(record)
                if not record.ok:
                    for later in range(t + 1, len(conv.turns)):
                        skipped = RequestRecord(conv.rid(later), conv.cid, later, conv.group,
                                                error=f"skipped: turn {t} failed")
                        results[skipped.rid] = skipped
                        if on_done is not None:
                            on_done(skipped)
                    return
                history = prompt + record.output_ids

        await asyncio.gather(*(one(c, d) for c, d in zip(conversations, delays)))
    return [results[c.rid(t)] for c in conversations for t in range(len(c.turns))]


async def get_text(base_url: str, path: str, timeout_s: float = 10.0) -> tuple[int, str]:
    async with aiohttp.ClientSession() as session:
        async with session.get(base_url.rstrip("/") + path,
                               timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
            return resp.status, await resp.text()


async def post(base_url: str, path: str, timeout_s: float = 60.0) -> int:
    async with aiohttp.ClientSession() as session:
        async with session.post(base_url.rstrip("/") + path,
                                timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
            await resp.read()
            return resp.status
