"""Issue 4 end to end: slots whose ring holds pending records survive MIXED batches, streaming
sessions and retractions on a real SGLang 0.5.23 server (CPU runtime, tiny fp32 GDN model, L=4).

* ``--enable-mixed-chunk --enable-streaming-session``: a long generation decodes while staggered
  prompts arrive (each arrival is a MIXED batch whose decode row runs SGLang's extend kernel over a
  slot that usually holds 1-3 ring records), then a three-turn streaming session whose later turns
  extend the slot the previous turn decoded into. Greedy tokens with ReplaySSM on equal ReplaySSM
  off; with the ``extend_fold`` fix switched off they do not (the defect is real on this path).
* Retraction: ``--max-total-tokens`` small enough that concurrent long generations are retracted
  mid-decode (``meta_info.num_retractions`` > 0, rings wrapped); tokens equal the unpressured run.
  Outside PD disaggregation (refused with the ring) SGLang frees a retracted request's slot and
  recomputes it; this run guards that path and the cursor choke point that makes it safe.

Three server starts in all (ReplaySSM off; on with memory pressure; on with the fix off).
"""

from __future__ import annotations

import json
import random
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from sglang_replayssm.models import make_models
from sglang_replayssm.testing.serve import cpu_server

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


def _mixed_and_session(url: str) -> dict[str, list[list[int]]]:
    rng = random.Random(4)
    long_prompt = _tokens(rng, 40)
    jobs = [(0.0, long_prompt, 80)] + [(0.6 + 0.5 * i, _tokens(rng, 20 + 7 * i), 6 + i) for i in range(6)]
    mixed = [r["output_ids"] for r in _staggered(url, jobs)]
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


def _retraction_workload(url: str) -> list[dict]:
    rng = random.Random(7)
    return _staggered(url, [(0.0, _tokens(rng, 20 + 3 * i), 60) for i in range(5)])


#: Memory pressure: 200 KV tokens for five concurrent 80-token requests, and admission told to
#: expect 4 new tokens per request, so decode runs out of KV and SGLang retracts mid-decode.
PRESSURE = ["--max-total-tokens", "200"]
PRESSURE_ENV = {"SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION": "4"}


@pytest.fixture(scope="module")
def gdn() -> Path:
    return make_models(names=["tiny-gdn"], log=lambda *a: None)["tiny-gdn"]


@pytest.fixture(scope="module")
def reference(gdn, tmp_path_factory) -> dict:
    """ReplaySSM off, no memory pressure: the tokens every other run must reproduce."""
    with cpu_server(gdn, MIXED, tmp_path_factory.mktemp("off") / "server.log") as url:
        out = _mixed_and_session(url)
        out["retraction"] = _retraction_workload(url)
    assert not any(r["retractions"] for r in out["retraction"])
    return out


def test_ring_under_mixed_chunks_sessions_and_retraction(gdn, reference, tmp_path):
    """One ReplaySSM server (L=4) with mixed chunks, streaming sessions and memory pressure."""
    with cpu_server(gdn, MIXED + RING + PRESSURE, tmp_path / "ring.log", env=PRESSURE_ENV) as url:
        ring = _mixed_and_session(url)
        retraction = _retraction_workload(url)
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
    assert broken["mixed"] != reference["mixed"]
    assert broken["session"][0] == reference["session"][0]  # the first turn decodes from a fresh slot
    assert broken["session"][1:] != reference["session"][1:]
