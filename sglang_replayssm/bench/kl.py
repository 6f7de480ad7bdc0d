"""Teacher-forced exactness of a live server: served continuations against a cold prefill of the same tokens.

A *probe* is a prompt served greedily for ``new_tokens`` tokens with their logprobs (the served path:
prefix hit, state rebuild, decode ring, read copy...). Its *reference* is one cold prefill of
prompt + served tokens (``logprob_start_len=0`` keeps SGLang from matching any cached prefix,
schedule_batch.py ``init_next_round_input``), whose input logprobs at the continuation's positions
are what an uncached forward gives the same tokens. Per token, with r = ref - served:

* ``kl``: SGLang's token-level estimator ``exp(r) - 1 - r`` (``sglang/test/kl_test_utils.py``
  ``compare_kl_divergence``), averaged per probe, then over probes;
* ``|dlp|``: |r|, reported as p50 / p95 / max over every token.

Scenarios (each starts from an empty cache: ``/flush_cache``):

* ``decode``: distinct prompts, long continuations: the decode path alone.
* ``exact``: the shared prefix is sent alone first (prefill only), so branches hit at its
  unaligned depth with SGLang's own exact prefill state: the floor for the two below.
* ``rebuilt``: a first branch is sent whole, so later branches share the prefix only up to an
  unaligned token that no request ended at: the plugin rebuilds that state from its records,
  SGLang without records falls back to its last 64-token state.
* ``pressure``: as ``rebuilt``, but a burst of filler requests (``filler_count`` prompts of
  ``filler_len`` tokens decoding ``filler_tokens``) runs after the seed and beside the branches, so that
  on a server with a small KV / mamba pool (and HiCache) the prefix is evicted and loaded back and,
  with a low ``--schedule-conservativeness``, running requests are retracted; SGLang's counters of both
  are read around it (:data:`PRESSURE_COUNTERS`), so a row says whether they happened.
"""

from __future__ import annotations

import asyncio
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from sglang_replayssm.bench.metrics import percentile

_TIMEOUT = aiohttp.ClientTimeout(total=None, sock_connect=30, sock_read=None)


def token_kl(ref: Sequence[float], served: Sequence[float]) -> list[float]:
    """Per-token ``exp(r) - 1 - r`` with r = ref - served (>= 0, 0 iff equal)."""
    if len(ref) != len(served):
        raise ValueError(f"logprob lists differ in length: {len(ref)} != {len(served)}")
    return [math.expm1(a - b) - (a - b) for a, b in zip(ref, served)]


def quantile(values: Sequence[float], q: float) -> float:
    """:func:`~sglang_replayssm.bench.metrics.percentile` at ``100 q``, nan for an empty list (JSON-friendly)."""
    p = percentile(values, 100.0 * q)
    return float("nan") if p is None else p


@dataclass
class ProbeResult:
    prompt_len: int
    cached_tokens: int
    expected_hit: int  # the depth a hit at the shared prefix lands at (0: no sharing)
    output_ids: list[int]
    served: list[float]
    ref: list[float] = field(default_factory=list)


def summarize(probes: Sequence[ProbeResult]) -> dict[str, Any]:
    """KL (mean of per-probe means) and |dlp| quantiles over every token of ``probes``."""
    per_probe, diffs = [], []
    for p in probes:
        kls = token_kl(p.ref, p.served)
        per_probe.append(sum(kls) / len(kls) if kls else 0.0)
        diffs += [abs(a - b) for a, b in zip(p.ref, p.served)]
    return {
        "probes": len(probes),
        "tokens": len(diffs),
        "kl": sum(per_probe) / len(per_probe) if per_probe else float("nan"),
        "kl_max_probe": max(per_probe, default=float("nan")),
        "dlp_p50": quantile(diffs, 0.5),
        "dlp_p95": quantile(diffs, 0.95),
        "dlp_max": max(diffs, default=float("nan")),
        "cached_tokens": [p.cached_tokens for p in probes],
        "expected_hit": [p.expected_hit for p in probes],
        "hit_at_expected": sum(p.cached_tokens >= p.expected_hit for p in probes),
    }


async def _post(session: aiohttp.ClientSession, url: str, payload: dict[str, Any]) -> dict[str, Any]:
    async with session.post(url + "/generate", json=payload, timeout=_TIMEOUT) as resp:
        body = await resp.json(content_type=None)
        if resp.status != 200 or not isinstance(body, dict) or "meta_info" not in body:
            raise RuntimeError(f"/generate answered HTTP {resp.status}: {str(body)[:300]}")
        return body


def _payload(ids: Sequence[int], new: int, ignore_eos: bool = True, **extra: Any) -> dict[str, Any]:
    return {"input_ids": list(ids), "sampling_params": {"temperature": 0.0, "max_new_tokens": new,
                                                       "ignore_eos": ignore_eos}, **extra}


async def serve(session: aiohttp.ClientSession, url: str, ids: Sequence[int], new: int,
                expected_hit: int = 0) -> ProbeResult:
    """Serve ``ids`` greedily for ``new`` tokens, with the served tokens' logprobs."""
    body = await _post(session, url, _payload(ids, new, return_logprob=True, return_text_in_logprobs=False))
    meta = body["meta_info"]
    lps = [float(x[0]) for x in meta["output_token_logprobs"]]
    return ProbeResult(len(ids), int(meta.get("cached_tokens", 0)), expected_hit, list(body["output_ids"]), lps)


async def reference(session: aiohttp.ClientSession, url: str, probe: ProbeResult, prompt: Sequence[int]) -> None:
    """Fill ``probe.ref``: one cold prefill of prompt + served tokens, its logprobs at the served tokens."""
    ids = list(prompt) + probe.output_ids
    body = await _post(session, url, _payload(ids, 0, return_logprob=True, logprob_start_len=0,
                                              return_text_in_logprobs=False))
    lps = body["meta_info"]["input_token_logprobs"]
    n = len(probe.output_ids)
    probe.ref = [float(x[0]) for x in lps[-n:]]
    if len(probe.ref) != n:
        raise RuntimeError(f"the reference prefill returned {len(lps)} logprobs for {len(ids)} tokens")


async def flush(session: aiohttp.ClientSession, url: str) -> None:
    async with session.post(url + "/flush_cache", timeout=aiohttp.ClientTimeout(total=60)) as resp:
        await resp.read()
        if resp.status != 200:
            raise RuntimeError(f"/flush_cache answered HTTP {resp.status}")


@dataclass(frozen=True)
class KlSpec:
    probes: int = 4  # per scenario
    prompt_len: int = 1024  # decode scenario
    decode_tokens: int = 256
    prefix_len: int = 1000  # the shared prefix (keep it off the 64-token grid)
    suffix_len: int = 37
    branch_tokens: int = 64
    vocab_low: int = 10
    vocab_high: int = 2000
    seed: int = 7
    concurrency: int = 4
    filler_count: int = 20  # pressure scenario: a burst outgrows a 24,000-token KV pool, not a 48,000-token host pool
    filler_len: int = 1200
    filler_tokens: int = 512  # decode long enough that admitted fillers outgrow a small KV pool: retraction


def _ids(rng: random.Random, n: int, spec: KlSpec) -> list[int]:
    return [rng.randrange(spec.vocab_low, spec.vocab_high) for _ in range(n)]


# The plugin's Prometheus counters of record-rebuilt hits (radix/metrics.py), read around each scenario
# so a row says whether its hits were rebuilt or found exact (absent without the plugin's records).
REBUILT_COUNTERS = ("sglang:replayssm_record_rebuilt_hits_total", "sglang:replayssm_record_rebuilt_tokens_total")
# SGLang's own counters of host load-back and retraction (metrics_collector.py), for the pressure scenario.
PRESSURE_COUNTERS = ("sglang:load_back_tokens_total", "sglang:num_retracted_requests_total",
                     "sglang:hicache_backup_tokens_total")


async def _counters(session: aiohttp.ClientSession, url: str) -> dict[str, float]:
    from sglang_replayssm.bench.server_metrics import metric_sums

    try:
        async with session.get(url + "/metrics", timeout=aiohttp.ClientTimeout(total=10)) as resp:
            sums = metric_sums(await resp.text()) if resp.status == 200 else {}
    except (aiohttp.ClientError, asyncio.TimeoutError):
        sums = {}
    return {k: sums[k] for k in REBUILT_COUNTERS + PRESSURE_COUNTERS if k in sums}


async def _scenario(url: str, name: str, spec: KlSpec) -> tuple[list[ProbeResult], dict[str, Any]]:
    rng = random.Random(f"{spec.seed}-{name}")
    sem = asyncio.Semaphore(max(1, spec.concurrency))
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        await flush(session, url)
        before = await _counters(session, url)

        async def bounded(coro: Any) -> Any:
            async with sem:
                return await coro

        if name == "decode":
            prompts = [_ids(rng, spec.prompt_len, spec) for _ in range(spec.probes)]
            probes = await asyncio.gather(*(bounded(serve(session, url, p, spec.decode_tokens)) for p in prompts))
        else:
            prefix = _ids(rng, spec.prefix_len, spec)
            prompts = [prefix + _ids(rng, spec.suffix_len + i, spec) for i in range(spec.probes + 1)]
            seed_ids = prefix if name == "exact" else prompts[0]
            # max_new_tokens 0: SGLang keeps the exact state at the prompt's end (kl_multiturn_utils.py
            # make_mamba_decode_assert); branches go one at a time, each seeing the tree the last left.
            await serve(session, url, seed_ids, 0)
            prompts = prompts[1:]
            if name == "pressure":
                await _fillers(session, url, rng, spec)  # evicts the prefix (to host, with HiCache)
                fill = asyncio.ensure_future(_fillers(session, url, rng, spec))  # retraction beside the branches
                probes = [await serve(session, url, p, spec.branch_tokens, spec.prefix_len) for p in prompts]
                await fill
            else:
                probes = [await serve(session, url, p, spec.branch_tokens, spec.prefix_len) for p in prompts]
        after = await _counters(session, url)
        if name == "pressure" and after:  # a Prometheus counter appears only once incremented: absent is 0
            after = {k: after.get(k, 0.0) for k in set(after) | set(PRESSURE_COUNTERS)}
        # References only after every probe: their cold prefills insert into the tree too.
        await asyncio.gather(*(bounded(reference(session, url, pr, p)) for pr, p in zip(probes, prompts)))
    summary = summarize(probes)
    summary.update({k.split(":")[-1]: after[k] - before.get(k, 0.0) for k in after})
    return list(probes), summary


async def _fillers(session: aiohttp.ClientSession, url: str, rng: random.Random, spec: KlSpec) -> None:
    """``filler_count`` distinct prompts served at once (their outputs are not compared).

    Sent without ``ignore_eos``: SGLang reserves a fixed-length request's whole budget at admission
    (``PrefillAdder._get_running_request_total_token_offset``), so only requests that may stop early
    are admitted on the ``--schedule-conservativeness`` estimate and can outgrow the pool (retraction).
    """
    fillers = [_ids(rng, spec.filler_len, spec) for _ in range(spec.filler_count)]
    await asyncio.gather(*(_post(session, url, _payload(f, spec.filler_tokens, ignore_eos=False))
                           for f in fillers))


SCENARIOS: tuple[str, ...] = ("decode", "exact", "rebuilt", "pressure")


def run_kl(url: str, spec: KlSpec, scenarios: Sequence[str] = SCENARIOS) -> dict[str, Any]:
    """Every scenario against the server at ``url``: {scenario: summary}."""
    unknown = [s for s in scenarios if s not in SCENARIOS]
    if unknown:
        raise ValueError(f"unknown KL scenario(s) {unknown}; choose from {list(SCENARIOS)}")
    out: dict[str, Any] = {}
    for name in scenarios:
        _, out[name] = asyncio.run(_scenario(url.rstrip("/"), name, spec))
    return out
