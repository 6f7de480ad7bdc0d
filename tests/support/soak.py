"""The soak: hours (or minutes) of mixed traffic on one CPU-runtime server, then a drain that must leave nothing.

One server: the tiny GDN (fp32), ReplaySSM with records (``extra_buffer``), HiCache with the L3 file store
(write-through), a device pool small enough for retraction and eviction (:data:`SERVER_FLAGS`). Workers send,
until the deadline, a mix of (:func:`_worker`):

* RAG: a shared system prompt, one of a few documents, a question; a second turn on the answer (shared
  depths off SGLang's state grid: record hits, HiCache host and L3 load-backs as documents get evicted);
* multi-turn sessions: three turns, each on the full history;
* client disconnects: a long answer whose stream the client closes after a few chunks (SGLang aborts it);
* long answers (150-300 tokens): decodes that outgrow what admission reserved in the small pool (retraction).

Every ``probe_every_s`` a probe set (:func:`probe_prompts`: a RAG query, a query leaving a document inside it,
a fresh prompt) is sent beside the traffic; its greedy tokens must equal HF's (``hf_reference``: a fresh
ReplaySSM-off reference; ``--arm read-copy`` decodes from the bf16 read copy, whose probes may first differ where
HF's top-2 logit gap is a near tie, :func:`probe_match`). The scheduler's RSS (``/proc/<pid>/status``) and the ``sglang:replayssm_*``
gauges are sampled every ``sample_every_s``. At the end the traffic drains; the planted states, their locks
and the queued record jobs must be 0 at once, and after ``/flush_cache`` every gauge (the host record
pool's size aside) must be 0. :func:`problems` lists what failed: failed requests (client aborts excluded),
probes that differ, gauges not back to idle, RSS growth over the second half of 2% or more.

``python -m tests.support.soak --minutes 30`` (``make soak``); ``tests/test_cpu_soak_server.py`` runs 3 minutes (``make test``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from sglang_replayssm.bench.client import generate_payload, merge_output_ids, stream_chunks
from sglang_replayssm.bench.server_metrics import metric_sum

#: Pools small enough for KV pressure (up to 8 running requests of up to ~580 tokens in 1,024 KV slots, 48 mamba
#: slots) and for HiCache eviction to host and to the L3 file store (host 2x device); admission on a low
#: estimate of how much a request that may stop at EOS will decode (``--schedule-conservativeness 0.05``), so
#: that long answers outgrow the pool (retraction). ``--kv-tokens 640 --mamba-slots 12`` presses the slots.
SERVER_FLAGS = ["--max-total-tokens", "1024", "--max-mamba-cache-size", "48", "--max-running-requests", "8",
                "--schedule-conservativeness", "0.05",
                "--hicache-ratio", "2", "--enable-hierarchical-cache", "--enable-metrics",
                "--hicache-storage-backend", "file", "--hicache-write-policy", "write_through",
                "--hicache-storage-backend-extra-config", '{"prefetch_threshold": 16}',
                "--mamba-radix-cache-strategy", "extra_buffer", "--enable-linear-replayssm",
                "--linear-replayssm-cache-len", "4"]
PROBE_NEW_TOKENS = 12
MAX_FAILURES = 50  # the workers stop sending after this many failures (a dead server fails at once)
GAUGE = "sglang:replayssm_"
#: Gauges that must be 0 as soon as the traffic drained (the rest once the tree is flushed).
DRAINED = ("planted_states", "planted_locks", "pending_record_jobs")
IDLE_EXEMPT = ("host_record_pool_bytes",)  # allocated once, kept
GAUGE_NAMES = ("record_slots_used", "interval_states_used", "planted_states", "planted_locks",
               "pending_record_jobs", "ring_slots_used", "host_record_entries", "host_record_pool_bytes")


@dataclass
class Corpus:
    """The shared token material: a system prompt and a few documents (token ids of the tiny models)."""

    system: list[int]
    docs: list[list[int]]

    @classmethod
    def make(cls, seed: int, n_docs: int = 6) -> Corpus:
        rng = random.Random(seed)
        return cls([rng.randrange(10, 2000) for _ in range(96)],
                   [[rng.randrange(10, 2000) for _ in range(rng.randrange(160, 320))] for _ in range(n_docs)])


def probe_prompts(corpus: Corpus) -> list[list[int]]:
    """A RAG query on document 0, a query leaving document 1 inside it (a record hit), a fresh prompt."""
    rng = random.Random(99)
    return [corpus.system + corpus.docs[0] + [7, 8, 9, 10] * 4,
            corpus.system + corpus.docs[1][: len(corpus.docs[1]) // 2 + 13] + [5] * 12,
            [rng.randrange(10, 2000) for _ in range(120)]]


@dataclass
class Tally:
    """What the traffic did."""

    ok: int = 0
    aborted: int = 0  # closed by the client on purpose
    failed: list[str] = field(default_factory=list)
    cached_tokens: int = 0
    prompt_tokens: int = 0
    probes: list[dict[str, Any]] = field(default_factory=list)
    samples: list[dict[str, Any]] = field(default_factory=list)


async def _stream(session: aiohttp.ClientSession, url: str, ids: list[int], new: int,
                  close_after: int = 0, ignore_eos: bool = True) -> tuple[list[int], dict[str, Any]]:
    """One streaming greedy /generate; with ``close_after`` the client disconnects after that many chunks
    (returns what it got). Raises on an HTTP or stream error, or on fewer than ``new`` tokens unless the
    request may stop at EOS (``ignore_eos=False``: then at least one)."""
    ids_out: list[int] = []
    meta: dict[str, Any] = {}
    chunks = 0
    async with session.post(url + "/generate", json=generate_payload(ids, new, ignore_eos)) as resp:
        if resp.status != 200:
            raise RuntimeError(f"HTTP {resp.status}: {(await resp.text())[:300]}")
        async for chunk in stream_chunks(resp):
            if "error" in chunk:
                raise RuntimeError(str(chunk["error"])[:300])
            meta = chunk.get("meta_info") or meta
            ids_out = merge_output_ids(ids_out, chunk.get("output_ids") or [], meta.get("completion_tokens"))
            chunks += 1
            if close_after and chunks >= close_after:
                resp.close()  # the disconnect: SGLang aborts the request
                return ids_out, meta
    complete = len(ids_out) == new if ignore_eos else 0 < len(ids_out) <= new
    if not complete:
        raise RuntimeError(f"{len(ids_out)} of {new} tokens")
    return ids_out, meta


async def _request(session: aiohttp.ClientSession, url: str, ids: list[int], new: int, tally: Tally,
                   ignore_eos: bool = True) -> list[int]:
    try:
        out, meta = await _stream(session, url, ids, new, ignore_eos=ignore_eos)
    except Exception as exc:  # noqa: BLE001 - every failure is counted
        tally.failed.append(f"{type(exc).__name__}: {exc}"[:300])
        return []
    tally.ok += 1
    tally.cached_tokens += int(meta.get("cached_tokens", 0))
    tally.prompt_tokens += len(ids)
    return out


async def _worker(session: aiohttp.ClientSession, url: str, corpus: Corpus, seed: int, stop_at: float,
                  tally: Tally) -> None:
    rng = random.Random(seed)
    while time.monotonic() < stop_at and len(tally.failed) < MAX_FAILURES:
        kind = rng.choices(("rag", "session", "abort", "long"), weights=(4, 3, 2, 3))[0]
        if kind == "abort":
            ids = corpus.system + rng.choice(corpus.docs) + [rng.randrange(10, 2000) for _ in range(20)]
            try:
                await _stream(session, url, ids, 200, close_after=rng.randrange(2, 6))
                tally.aborted += 1
            except Exception as exc:  # noqa: BLE001
                tally.failed.append(f"abort: {type(exc).__name__}: {exc}"[:300])
            continue
        if kind == "long":  # a long answer that may stop at EOS: admitted on SGLang's estimate, it can outgrow
            # what admission reserved (retraction; SGLang reserves an ignore_eos request's whole budget)
            ids = corpus.system + [rng.randrange(10, 2000) for _ in range(rng.randrange(20, 80))]
            await _request(session, url, ids, rng.randrange(150, 300), tally, ignore_eos=False)
            continue
        history = corpus.system + (rng.choice(corpus.docs) if kind == "rag" else
                                   [rng.randrange(10, 2000) for _ in range(rng.randrange(40, 120))])
        for _ in range(2 if kind == "rag" else 3):
            history += [rng.randrange(10, 2000) for _ in range(rng.randrange(8, 40))]
            out = await _request(session, url, history, rng.randrange(8, 40), tally)
            if not out or time.monotonic() >= stop_at:
                break
            history += out


def scheduler_pid(server_pid: int) -> int | None:
    """The pid of the server's scheduler process (same process group, title ``sglang::scheduler``)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if os.getpgid(int(entry.name)) != server_pid:
                continue
            if "scheduler" in (entry / "cmdline").read_bytes().decode(errors="replace"):
                return int(entry.name)
        except (OSError, ProcessLookupError):
            continue
    return None


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for {pid}")


def gauges(url: str) -> dict[str, float]:
    text = urllib.request.urlopen(url + "/metrics", timeout=30).read().decode()
    return {name: metric_sum(text, GAUGE + name) for name in GAUGE_NAMES}


def probe_match(out: list[int] | None, expected: list[int], margins: list[float] | None, tie: float) -> bool:
    """The served tokens equal HF's, or (``margins``: HF's top-2 logit gaps, :func:`hf_margins`) first differ
    where HF's own choice was a near tie (gap < ``tie``); past a legitimate flip the two continuations diverge."""
    if out == expected:
        return True
    if out is None or margins is None:
        return False
    first = next((i for i, (a, b) in enumerate(zip(out, expected)) if a != b), min(len(out), len(expected)))
    return first < len(margins) and margins[first] < tie


async def _probe(session: aiohttp.ClientSession, url: str, prompts: list[list[int]], expected: list[list[int]],
                 t: float, tally: Tally, margins: list[list[float]] | None = None, tie: float = 0.0) -> None:
    outs = await asyncio.gather(*(_request(session, url, p, PROBE_NEW_TOKENS, tally) for p in prompts))
    tally.probes.append({"t_s": round(t, 1), "equal": [
        probe_match(o, e, None if margins is None else margins[i], tie) for i, (o, e) in enumerate(zip(outs, expected))],
        "exact": [o == e for o, e in zip(outs, expected)]})


async def _sampler(url: str, pid: int | None, start: float, stop_at: float, every_s: float, tally: Tally) -> None:
    while time.monotonic() < stop_at:
        sample: dict[str, Any] = {"t_s": round(time.monotonic() - start, 1)}
        try:
            if pid is not None:
                sample["rss_kib"] = rss_kib(pid)
            sample["gauges"] = await asyncio.to_thread(gauges, url)
        except (OSError, RuntimeError) as exc:  # the scheduler died: every later request fails too
            tally.failed.append(f"sampler: the server is gone ({type(exc).__name__}: {exc})"[:300])
            return
        tally.samples.append(sample)
        await asyncio.sleep(min(every_s, max(0.0, stop_at - time.monotonic())))


async def traffic(url: str, corpus: Corpus, expected: list[list[int]], *, seconds: float, workers: int,
                  probe_every_s: float, sample_every_s: float, pid: int | None, seed: int = 0,
                  margins: list[list[float]] | None = None, tie: float = 0.0) -> Tally:
    """Run the mixed traffic for ``seconds`` with probes and samples; returns after every request ended.
    ``margins`` / ``tie``: probes may first differ from HF's tokens at a near tie (:func:`probe_match`)."""
    tally = Tally()
    start = time.monotonic()
    stop_at = start + seconds
    prompts = probe_prompts(corpus)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                     timeout=aiohttp.ClientTimeout(total=None, sock_connect=30)) as session:

        async def probes() -> None:
            while True:
                await _probe(session, url, prompts, expected, time.monotonic() - start, tally, margins, tie)
                if time.monotonic() + probe_every_s >= stop_at:
                    return
                await asyncio.sleep(probe_every_s)

        await asyncio.gather(*(_worker(session, url, corpus, seed + i, stop_at, tally) for i in range(workers)),
                             probes(), _sampler(url, pid, start, stop_at, sample_every_s, tally))
        await _probe(session, url, prompts, expected, time.monotonic() - start, tally, margins, tie)  # drained
    return tally


def rss_growth(samples: list[dict[str, Any]]) -> float:
    """Relative RSS growth over the second half: the last sample against the one nearest the middle."""
    rss = [(s["t_s"], s["rss_kib"]) for s in samples if "rss_kib" in s]
    if len(rss) < 3:
        return float("nan")
    mid_t = rss[-1][0] / 2
    mid = min(rss, key=lambda s: abs(s[0] - mid_t))[1]
    return (rss[-1][1] - mid) / mid


def drain(url: str, timeout_s: float = 60.0) -> tuple[dict[str, float], dict[str, float]]:
    """The gauges once idle (a few seconds for the idle loop's refresh), then after ``/flush_cache``."""
    time.sleep(3)
    drained = gauges(url)
    deadline = time.monotonic() + timeout_s
    while True:
        req = urllib.request.Request(url + "/flush_cache", method="POST")
        with urllib.request.urlopen(req, timeout=30) as resp:
            if resp.status == 200:
                break
        if time.monotonic() > deadline:
            raise RuntimeError("the server never flushed its cache")
        time.sleep(1)
    time.sleep(3)
    return drained, gauges(url)


def problems(report: dict[str, Any], max_rss_growth: float = 0.02, min_retractions: int = 0) -> list[str]:
    """What the soak's acceptance rejects (empty: passed); ``min_retractions``: SGLang's retraction counter
    must reach it (the pressure happened)."""
    out = []
    if report.get("retractions", 0.0) < min_retractions:
        out.append(f"{report.get('retractions', 0.0):.0f} retractions (want >= {min_retractions})")
    if report["failed"]:
        out.append(f"{len(report['failed'])} failed requests, first: {report['failed'][0]}")
    bad = [p for p in report["probes"] if not all(p["equal"])]
    if bad or not report["probes"]:
        out.append(f"probes differing from HF's greedy tokens: {bad or 'no probe ran'}")
    if not report["busy_gauges"].get("record_slots_used"):
        out.append(f"the record gauge never rose: {report['busy_gauges']}")
    drained = {k: v for k, v in report["drained_gauges"].items() if k in DRAINED and v}
    flushed = {k: v for k, v in report["flushed_gauges"].items() if k not in IDLE_EXEMPT and v}
    if drained or flushed:
        out.append(f"gauges not back to idle: drained {drained}, flushed {flushed}")
    growth = report["rss_growth"]
    if not growth < max_rss_growth:  # NaN fails too
        out.append(f"scheduler RSS grew {growth:.2%} over the second half (limit {max_rss_growth:.0%})")
    return out


#: Extra server flags per arm: ``nextn`` adds speculative decoding (the tiny GDN's MTP layer, chain drafts);
#: ``read-copy`` decodes non-flush steps from the bf16 read copy (:data:`ARM_ENV`); ``ring-rows`` keys the decode
#: rings by request row (``SGLANG_REPLAYSSM_RING_ROWS``).
ARMS: dict[str, list[str]] = {
    "records": [],
    "nextn": ["--speculative-algorithm", "NEXTN", "--speculative-num-steps", "3",
              "--speculative-num-draft-tokens", "4"],
    "read-copy": [],
    "ring-rows": [],
}
ARM_ENV: dict[str, dict[str, str]] = {"read-copy": {"SGLANG_REPLAYSSM_READ_COPY": "bf16"},
                                      "ring-rows": {"SGLANG_REPLAYSSM_RING_ROWS": "on"}}
#: Arms whose probes may first differ from HF's tokens where HF's top-2 logit gap is below this (a near tie
#: the bf16 copy's rounding decides the other way; tiny-gdn's gaps at the probes go down to 0.001); every other
#: arm must equal HF's tokens exactly. The report's ``exact`` says whether a probe needed the rule.
NEAR_TIE: dict[str, float] = {"read-copy": 0.01}


def run(model_dir: Path, workdir: Path, *, seconds: float, workers: int = 4, probe_every_s: float = 180.0,
        sample_every_s: float = 10.0, seed: int = 0, arm: str = "records", kv_tokens: int = 0,
        mamba_slots: int = 0, extra_flags: tuple[str, ...] = (), retract_every: int = 0) -> dict[str, Any]:
    """Start the server (:data:`SERVER_FLAGS`, the ``arm``'s, then ``extra_flags``, which win), run
    :func:`traffic`, drain; returns the report (:func:`problems` judges it). ``retract_every`` > 0 adds
    SGLang's own test switch (``SGLANG_TEST_RETRACT``): a running request is retracted every that many
    forward steps besides what the pool's pressure retracts."""
    from tests.support.hf_reference import hf_greedy, hf_margins
    from tests.support.serve import cpu_server_process

    corpus = Corpus.make(seed)
    expected = hf_greedy(model_dir, probe_prompts(corpus), PROBE_NEW_TOKENS, ignore_eos=True)
    tie = NEAR_TIE.get(arm, 0.0)
    margins = hf_margins(model_dir, probe_prompts(corpus), expected) if tie else None
    env = {"SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR": str(workdir / "l3"), **ARM_ENV.get(arm, {})}
    if retract_every:
        env |= {"SGLANG_TEST_RETRACT": "1", "SGLANG_TEST_RETRACT_INTERVAL": str(retract_every)}
    t0 = time.monotonic()
    flags = [*SERVER_FLAGS, *ARMS[arm], *extra_flags]
    if kv_tokens:
        flags[flags.index("--max-total-tokens") + 1] = str(kv_tokens)
    if mamba_slots:
        flags[flags.index("--max-mamba-cache-size") + 1] = str(mamba_slots)
    with cpu_server_process(model_dir, flags, workdir / "server.log", env=env, timeout_s=600) as srv:
        assert srv.proc is not None
        pid = scheduler_pid(srv.proc.pid)
        tally = asyncio.run(traffic(srv.base_url, corpus, expected, seconds=seconds, workers=workers,
                                    probe_every_s=probe_every_s, sample_every_s=sample_every_s, pid=pid,
                                    seed=seed, margins=margins, tie=tie))
        try:
            drained, flushed = drain(srv.base_url)
            metrics = urllib.request.urlopen(srv.base_url + "/metrics", timeout=30).read().decode()
        except OSError as exc:
            tally.failed.append(f"drain: the server is gone ({type(exc).__name__}: {exc})"[:300])
            drained, flushed, metrics = {}, {}, ""
    busy = {k: max(s["gauges"][k] for s in tally.samples) for k in GAUGE_NAMES} if tally.samples else {}
    report = asdict(tally)
    report.update(arm=arm, flags=flags, env=ARM_ENV.get(arm, {}), near_tie=tie, probe_margins=margins, seconds=seconds, wall_s=round(time.monotonic() - t0, 1), scheduler_pid=pid,
                  busy_gauges=busy, drained_gauges=drained, flushed_gauges=flushed,
                  rss_growth=rss_growth(tally.samples),
                  storage_hit_tokens=metric_sum(metrics, "sglang:cached_tokens_total", cache_source="storage"),
                  host_hit_tokens=metric_sum(metrics, "sglang:cached_tokens_total", cache_source="host"),
                  retractions=metric_sum(metrics, "sglang:num_retracted_requests_total"),
                  rebuilt_tokens=metric_sum(metrics, "sglang:replayssm_record_rebuilt_tokens_total"),
                  skipped_plants=metric_sum(metrics, "sglang:replayssm_skipped_plants_total"))
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.support.soak", description=__doc__.split("\n")[0])
    parser.add_argument("--minutes", type=float, default=30.0, help="traffic time (default 30)")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--arm", choices=sorted(ARMS), default="records",
                        help="records (default), nextn, read-copy or ring-rows")
    parser.add_argument("--probe-every", type=float, default=180.0, help="seconds between probes (default 180)")
    parser.add_argument("--sample-every", type=float, default=10.0, help="seconds between RSS/gauge samples")
    parser.add_argument("--kv-tokens", type=int, default=0, help="--max-total-tokens (default 1024)")
    parser.add_argument("--mamba-slots", type=int, default=0, help="--max-mamba-cache-size (default 48)")
    parser.add_argument("--retract-every", type=int, default=0,
                        help="also retract a running request every N forward steps (SGLang's SGLANG_TEST_RETRACT)")
    parser.add_argument("--min-retractions", type=int, default=0, help="fail unless SGLang retracted this many")
    parser.add_argument("--server-flags", default="", help='more server flags, last wins (e.g. "--max-running-requests 8")')
    parser.add_argument("--workdir", type=Path, default=Path("out/soak"))
    parser.add_argument("--json", type=Path, default=Path("out/soak/soak.json"))
    args = parser.parse_args(argv)
    from sglang_replayssm.models import make_models

    model = make_models(names=("tiny-gdn",), log=lambda *a: None)["tiny-gdn"]
    args.workdir.mkdir(parents=True, exist_ok=True)
    report = run(model, args.workdir, seconds=args.minutes * 60, workers=args.workers,
                 probe_every_s=args.probe_every, sample_every_s=args.sample_every, arm=args.arm,
                 kv_tokens=args.kv_tokens, mamba_slots=args.mamba_slots, extra_flags=tuple(args.server_flags.split()),
                 retract_every=args.retract_every)
    found = problems(report, min_retractions=args.min_retractions)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({**report, "problems": found}, indent=1))
    print(json.dumps({k: v for k, v in report.items() if k not in ("samples", "failed")} | {
        "failed": len(report["failed"]), "samples": len(report["samples"]), "problems": found}, indent=1))
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
