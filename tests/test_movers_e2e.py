"""Issue 4 end to end: slots whose ring holds pending records survive MIXED batches, streaming
sessions and retractions on a real SGLang 0.5.23 server (CPU runtime, tiny fp32 GDN model, L=4).

* ``--enable-mixed-chunk --enable-streaming-session``: a long generation streams while short
  prompts arrive, each after it emitted a few more tokens (each arrival is a MIXED batch whose
  decode row runs SGLang's extend kernel over a slot that usually holds 1-3 ring records; the
  server log must show them), then a three-turn streaming session whose later turns
  extend the slot the previous turn decoded into. Greedy tokens with ReplaySSM on equal ReplaySSM
  off; with the ``extend_fold`` fix switched off they do not (the defect is real on this path).
* Retraction: ``--max-total-tokens`` small enough that concurrent long generations are retracted
  mid-decode (``meta_info.num_retractions`` > 0, rings wrapped); tokens equal the unpressured run.
  Outside PD disaggregation (refused with the ring) SGLang frees a retracted request's slot and
  recomputes it; this run guards that path and the cursor choke point that makes it safe.

* HiCache: on the same pressured server, shared 150-token prefixes pushed out of the 200-token KV
  pool and revisited are loaded back from host (``meta_info.cached_tokens_details.host`` > 0); tokens
  equal the ReplaySSM-off run.

Three server starts in all (ReplaySSM off; on with pressure and HiCache; on with the fix off).
"""

from __future__ import annotations

import json
import random
import re
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from sglang_replayssm.models import make_models
from tests.support.serve import cpu_server

pytestmark = [pytest.mark.server, pytest.mark.timeout(900)]

RING = ["--enable-linear-replayssm", "--linear-replayssm-cache-len", "4"]
MIXED = ["--mamba-radix-cache-strategy", "extra_buffer", "--enable-mixed-chunk", "--chunked-prefill-size", "64",
         "--enable-streaming-session"]


def _post(url: str, path: str, body: dict, timeout_s: float = 300.0) -> dict:
    req = urllib.request.Request(url + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:
        text = resp.read()
    return json.loads(text) if text.strip() else {}


def _generate(url: str, input_ids: list[int], max_new_tokens: int, **extra: object) -> dict:
    body = {"input_ids": input_ids,
            "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0.0, "ignore_eos": True},
            **extra}
    out = _post(url, "/generate", body)
    return {"output_ids": out["output_ids"], "retractions": out["meta_info"].get("num_retractions", 0)}


def _staggered(url: str, jobs: list[tuple[float, list[int], int]]) -> list[dict]:
    """Send each (delay_s, prompt, new_tokens) on its own thread after its delay; results in order."""
    results: list[dict | BaseException | None] = [None] * len(jobs)

    def run(i: int, delay: float, prompt: list[int], n: int) -> None:
        time.sleep(delay)
        try:
            results[i] = _generate(url, prompt, n)
        except BaseException as exc:  # re-raised below
            results[i] = exc

    threads = [threading.Thread(target=run, args=(i, *job)) for i, job in enumerate(jobs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for r in results:
        if isinstance(r, BaseException):
            raise r
    return results  # type: ignore[return-value]


def _tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(10, 2000) for _ in range(n)]


def _stream_ids(url: str, input_ids: list[int], max_new_tokens: int, progress: list[int]) -> list[int]:
    """Greedy /generate with ``stream``; ``progress[0]`` is the number of tokens emitted so far."""
    body = {"input_ids": input_ids, "stream": True,
            "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0.0, "ignore_eos": True}}
    req = urllib.request.Request(url + "/generate", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    ids: list[int] = []
    with urllib.request.urlopen(req, timeout=600) as resp:
        for raw in resp:
            line = raw.decode().strip()
            if not line.startswith("data:") or line[5:].strip() == "[DONE]":
                continue
            chunk = json.loads(line[5:])
            ids = list(chunk["output_ids"]) if not ids else ids + list(chunk["output_ids"])[len(ids):]
            progress[0] = len(ids)
    return ids


def _mixed(url: str, rng: random.Random) -> list[list[int]]:
    """A 130-token generation (it fits the pressured 200-token pool) streams; each short prompt is
    sent once it has emitted another 11 tokens, so every arrival meets it mid-decode (a MIXED batch,
    usually over ring records)."""
    progress, long_out, errors = [0], [], []
    long_prompt = _tokens(rng, 40)
    short = [(_tokens(rng, 20 + 7 * i), 6 + i) for i in range(6)]

    def run_long() -> None:
        try:
            long_out.append(_stream_ids(url, long_prompt, 130, progress))
        except BaseException as exc:  # re-raised below
            errors.append(exc)

    thread = threading.Thread(target=run_long)
    thread.start()
    threads, outs = [], [None] * len(short)
    for i, (prompt, n) in enumerate(short):
        while progress[0] < 8 + 11 * i and thread.is_alive():
            time.sleep(0.005)
        # (If the long generation already ended, the prompt still runs; whether enough arrivals
        # met it mid-decode is checked on the server log.)

        def run(i: int = i, prompt: list[int] = prompt, n: int = n) -> None:
            outs[i] = _generate(url, prompt, n)["output_ids"]

        threads.append(threading.Thread(target=run))
        threads[-1].start()
    for t in [thread, *threads]:
        t.join()
    if errors:
        raise errors[0]
    return [long_out[0], *outs]


def _prefills_with_running_requests(log: Path) -> int:
    """Prefill batches logged while requests were decoding: MIXED batches under --enable-mixed-chunk
    (unless the decode rows did not fit, which only memory pressure causes)."""
    return len(re.findall(r"Prefill batch.*#running-req: [1-9]", log.read_text(errors="replace")))


def _mixed_and_session(url: str) -> dict[str, list[list[int]]]:
    rng = random.Random(4)
    mixed = _mixed(url, rng)
    session_id = _post(url, "/open_session", {"capacity_of_str_len": 100000, "streaming": True})
    if isinstance(session_id, dict):
        session_id = session_id.get("session_id", session_id)
    turns = []
    try:
        for n_prompt, n_new in ((30, 10), (12, 11), (9, 7)):  # (n_new - 1) % 4 != 0: records pending
            out = _generate(url, _tokens(rng, n_prompt), n_new, session_params={"id": session_id})
            turns.append(out["output_ids"])
    finally:
        _post(url, "/close_session", {"session_id": session_id})
    return {"mixed": mixed, "session": turns}


def _hicache_workload(url: str) -> list[dict]:
    """Three 150-token system prompts, revisited after the others pushed them out of the small KV
    pool: with HiCache the revisits load the prefix (and its mamba state) back from host."""
    rng = random.Random(11)
    system = {g: _tokens(rng, 150) for g in "ABC"}
    out = []
    for g in "AABBCABC":
        body = {"input_ids": system[g] + _tokens(rng, 6),
                "sampling_params": {"max_new_tokens": 8, "temperature": 0.0, "ignore_eos": True}}
        meta = (r := _post(url, "/generate", body))["meta_info"]
        out.append({"output_ids": r["output_ids"], "host": (meta.get("cached_tokens_details") or {}).get("host", 0)})
    return out


def _retraction_workload(url: str) -> list[dict]:
    rng = random.Random(7)
    return _staggered(url, [(0.0, _tokens(rng, 20 + 3 * i), 60) for i in range(5)])


#: Memory pressure: 200 KV tokens for five concurrent 80-token requests, and admission told to
#: expect 4 new tokens per request, so decode runs out of KV and SGLang retracts mid-decode.
PRESSURE = ["--max-total-tokens", "200"]
PRESSURE_ENV = {"SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION": "4"}
#: HiCache with a 64-token track interval (the 150-token prefixes carry mamba states at 64 and 128).
HICACHE = ["--enable-hierarchical-cache", "--hicache-ratio", "4", "--mamba-track-interval", "64"]


@pytest.fixture(scope="module")
def gdn() -> Path:
    return make_models(names=["tiny-gdn"], log=lambda *a: None)["tiny-gdn"]


@pytest.fixture(scope="module")
def reference(gdn, tmp_path_factory) -> dict:
    """ReplaySSM off, no memory pressure: the tokens every other run must reproduce."""
    with cpu_server(gdn, MIXED, tmp_path_factory.mktemp("off") / "server.log") as url:
        out = _mixed_and_session(url)
        out["retraction"] = _retraction_workload(url)
        out["hicache"] = _hicache_workload(url)
    assert not any(r["retractions"] for r in out["retraction"])
    return out


def test_ring_under_mixed_chunks_sessions_retraction_and_hicache(gdn, reference, tmp_path):
    """One ReplaySSM server (L=4) with mixed chunks, streaming sessions, memory pressure and HiCache."""
    with cpu_server(gdn, MIXED + RING + PRESSURE + HICACHE, tmp_path / "ring.log", env=PRESSURE_ENV) as url:
        ring = _mixed_and_session(url)
        retraction = _retraction_workload(url)
        hicache = _hicache_workload(url)
    assert [r["output_ids"] for r in hicache] == [r["output_ids"] for r in reference["hicache"]]
    assert sum(r["host"] for r in hicache) > 0, [r["host"] for r in hicache]  # loaded back from host
    assert _prefills_with_running_requests(tmp_path / "ring.log") >= 3
    assert ring["mixed"] == reference["mixed"]
    assert ring["session"] == reference["session"]
    retractions = [r["retractions"] for r in retraction]
    assert sum(retractions) > 0, retractions
    for i, (got, want) in enumerate(zip(retraction, reference["retraction"])):
        assert got["output_ids"] == want["output_ids"], f"request {i} ({got['retractions']} retractions) differs"


def test_without_extend_fold_the_ring_breaks_mixed_chunks_and_sessions(gdn, reference, tmp_path):
    """The same mixed/session stream with the extend_fold fix off (and admission off, which would
    refuse the flags; so no_buffer, SGLang's only ring strategy): tokens differ from ReplaySSM off."""
    env = {"SGLANG_REPLAYSSM_DISABLE_FIXES": "extend_fold,admission"}
    flags = [f if f != "extra_buffer" else "no_buffer" for f in MIXED] + ["--disable-overlap-schedule"]
    with cpu_server(gdn, flags + RING, tmp_path / "fix-off.log", env=env) as url:
        broken = _mixed_and_session(url)
    assert _prefills_with_running_requests(tmp_path / "fix-off.log") >= 6
    assert broken["mixed"] != reference["mixed"]
    assert broken["session"][0] == reference["session"][0]  # the first turn decodes from a fresh slot
    assert broken["session"][1:] != reference["session"][1:]
