"""Issue 14, D3 and D4 on a real SGLang 0.5.23 server (CPU runtime, tiny fp32 GDN model with its
fitted MTP layer): NEXTN + the spec-verify ring with ``--enable-mixed-chunk`` (SGLang keeps it for
EAGLE / NEXTN; a MIXED step runs a spec row as a 1-token extend from ``temporal``) and a three-turn
streaming session (each turn extends the row the previous turn verified into, cursors kept).

Found (2026-12-01): the mixed-chunk generations equal plain greedy with the fix on and off (this
workload's MIXED steps met no pending records, so D3 is shown only at unit level,
tests/test_spec_ring.py). 2026-12-02 (records on beside the spec ring): the fold-off arm differed from
token 36 of the long generation, the fold-on arm stayed equal; timing decides, so fold-off is not asserted. The session's later turns differed from plain with the spec fold on and off:
SGLang's ``StreamingSession.try_cache_finished_req`` keeps a finished turn's record at prompt + output,
one token past what a verify that ends on its bonus token computed, and a verify past
``max_new_tokens`` leaves the mamba state deeper than the kept KV; with ``session_state_depth``
(radix/session_depth.py; tests/test_spec_e2e.py shows it off) they equal plain. Servers start per arm
on first use.

Issue 14's HiCache and retraction lines: one pressured server per arm (bench arms nextn, nextn-ring,
nextn-plugin; 200 KV tokens, 8 mamba slots, HiCache ratio 4, track interval 64) runs evicted prefixes
loaded back from host (``cached_tokens_details.host``, ``sglang:load_back_tokens_total`` kv and mamba),
second turns that load a finished turn's end state back, and five concurrent fitted generations that
SGLang retracts mid-decode (``meta_info.num_retractions``, ``sglang:num_retracted_requests_total``).
2026-12-02: every arm equal to plain greedy (notes/records-spec.md).
"""

from __future__ import annotations

import json
import os
import random
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from sglang_replayssm.bench.arms import ARMS as BENCH_ARMS
from sglang_replayssm.bench.arms import COMMON_FLAGS
from sglang_replayssm.bench.server_metrics import metric_sum
from sglang_replayssm.models import make_models
from sglang_replayssm.models.mtp import fit_prompts
from sglang_replayssm.models.specs import SPECS
from tests.support.serve import cpu_server

# Opt-in (CI time): this workload shows no D3 difference; the D1 and session server tests
# (tests/test_spec_e2e.py) and the D2-D5 unit tests run in `make test`.
pytestmark = [
    pytest.mark.server,
    pytest.mark.timeout(1800),
    pytest.mark.skipif(os.environ.get("SGLANG_REPLAYSSM_SLOW") != "1",
                       reason="opt-in: SGLANG_REPLAYSSM_SLOW=1 pytest tests/test_spec_movers_e2e.py"),
]

NEXTN = ["--speculative-algorithm", "NEXTN", "--speculative-num-steps", "3", "--speculative-num-draft-tokens", "4"]
NEXTN_RING = [*NEXTN, "--enable-linear-replayssm-spec", "--linear-replayssm-cache-len", "16"]
MIXED = ["--mamba-radix-cache-strategy", "extra_buffer", "--enable-mixed-chunk", "--chunked-prefill-size", "64",
         "--enable-streaming-session"]


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = os.environ.get("SGLANG_REPLAYSSM_SPEC_MODELS") or str(tmp_path_factory.mktemp("spec-models"))
    return make_models(Path(out), names=["tiny-gdn"], log=lambda *a: None)["tiny-gdn"]


def _post(url: str, path: str, body: dict) -> dict:
    req = urllib.request.Request(url + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=900) as resp:
        text = resp.read()
    return json.loads(text) if text.strip() else {}


def _generate(url: str, ids: list[int], n: int, **extra: object) -> list[int]:
    body = {"input_ids": ids, "sampling_params": {"max_new_tokens": n, "temperature": 0.0, "ignore_eos": True},
            **extra}
    return list(_post(url, "/generate", body)["output_ids"])


def _stream(url: str, ids: list[int], n: int, progress: list[int]) -> list[int]:
    body = {"input_ids": ids, "stream": True,
            "sampling_params": {"max_new_tokens": n, "temperature": 0.0, "ignore_eos": True}}
    req = urllib.request.Request(url + "/generate", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    out: list[int] = []
    with urllib.request.urlopen(req, timeout=900) as resp:
        for raw in resp:
            line = raw.decode().strip()
            if line.startswith("data:") and line[5:].strip() != "[DONE]":
                out = list(json.loads(line[5:])["output_ids"])
                progress[0] = len(out)
    return out


def _workload(url: str) -> dict[str, list[list[int]]]:
    prompts = fit_prompts(SPECS["tiny-gdn"], 2048)
    progress, long_out = [0], []
    thread = threading.Thread(target=lambda: long_out.append(_stream(url, prompts[0], 40, progress)))
    thread.start()
    shorts = []
    for i, p in enumerate(prompts[5:9]):  # each arrives while the fitted long generation verifies
        while progress[0] < 6 + 7 * i and thread.is_alive():
            time.sleep(0.005)
        shorts.append(_generate(url, p[-12:], 3))
    thread.join()
    session = _post(url, "/open_session", {"capacity_of_str_len": 100000, "streaming": True})
    sid = session.get("session_id", session) if isinstance(session, dict) else session
    turns = []
    try:
        for p, n in ((prompts[9], 14), (prompts[10][:6], 11), (prompts[11][:5], 9)):
            turns.append(_generate(url, p, n, session_params={"id": sid}))
    finally:
        _post(url, "/close_session", {"session_id": sid})
    return {"mixed": [long_out[0], *shorts], "session": turns}


ARMS = {
    "plain": (MIXED, {}),
    "nextn": ([*NEXTN, *MIXED], {}),  # NEXTN without the ring
    "ring": ([*NEXTN_RING, *MIXED], {}),
    "ring_fold_off": ([*NEXTN_RING, *MIXED], {"SGLANG_REPLAYSSM_DISABLE_FIXES": "spec_extend_fold"}),
}


class _Runs:
    """Each arm's server is started (and its workload run) the first time a test asks for it."""

    def __init__(self, model: Path, logs: Path, arms: dict = ARMS, workload: Callable[[str], dict] = _workload) -> None:
        self.model, self.logs, self.done, self.arms, self.workload = model, logs, {}, arms, workload

    def __getitem__(self, name: str) -> dict:
        if name not in self.done:
            flags, env = self.arms[name]
            with cpu_server(self.model, flags, self.logs / f"{name}.log", env=env, timeout_s=600) as url:
                self.done[name] = self.workload(url)
            (self.logs / "runs.json").write_text(json.dumps(self.done))
        return self.done[name]


@pytest.fixture(scope="module")
def runs(model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[_Runs]:
    yield _Runs(model, tmp_path_factory.mktemp("spec-movers-logs"))


# --- HiCache eviction + load-back and retraction under memory pressure (one pressured server per arm) ---

#: 200 KV tokens for five concurrent ~100-token generations, admission told to expect 4 new tokens per
#: request: decode runs out of KV and SGLang retracts mid-decode (tests/test_movers_e2e.py's budget).
PRESSURE = ["--max-total-tokens", "200", "--max-mamba-cache-size", "8"]
PRESSURE_ENV = {"SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION": "4"}
#: Device prefixes evicted to a host pool 4x the device's; the 64-token track interval leaves mamba
#: states at 64 and 128 inside each 150-token system prompt, so a revisit loads KV and state back.
HICACHE = ["--enable-hierarchical-cache", "--hicache-ratio", "4", "--mamba-track-interval", "64"]


def _bench_flags(arm: str) -> list[str]:
    return [*COMMON_FLAGS, *BENCH_ARMS[arm].flags]


PRESSURE_ARMS = {
    "plain": (_bench_flags("baseline"), {}),  # no spec, no pressure, no HiCache: the reference tokens
    "nextn": ([*_bench_flags("nextn"), *PRESSURE, *HICACHE], PRESSURE_ENV),  # NEXTN without the ring
    "nextn-ring": ([*_bench_flags("nextn-ring"), *PRESSURE, *HICACHE], PRESSURE_ENV),  # + decode ring
    "nextn-plugin": ([*_bench_flags("nextn-plugin"), *PRESSURE, *HICACHE], PRESSURE_ENV),  # + spec ring
}


def _pressure_workload(url: str) -> dict:
    """HiCache: three 140-token system prompts (each + the tail of a fitted prompt), revisited after the
    others pushed them out of the 200-token device pool, then a second turn of each group's first
    request (prompt + output + 3 tokens). Retraction: five fitted prompts (drafts accepted, so records
    pend across verify steps) decoding 60 tokens each, concurrently."""
    prompts = fit_prompts(SPECS["tiny-gdn"], 2048)
    rng = random.Random(11)
    system = {g: [rng.randrange(10, 2000) for _ in range(140)] for g in "ABC"}
    hicache: list[dict] = []

    def ask(ids: list[int], n: int) -> None:
        body = {"input_ids": ids, "sampling_params": {"max_new_tokens": n, "temperature": 0.0, "ignore_eos": True}}
        meta = (out := _post(url, "/generate", body))["meta_info"]
        hicache.append({"input_ids": ids, "output_ids": out["output_ids"], "cached": meta.get("cached_tokens", 0),
                        "host": (meta.get("cached_tokens_details") or {}).get("host", 0),
                        "accept": meta.get("spec_accept_length")})

    for i, g in enumerate("AABBCABC"):
        ask(system[g] + prompts[i][-8:], 16)
    for first in hicache[:5:2]:  # second turns of A, B, C's first requests: each finished request's end state
        ask(first["input_ids"] + first["output_ids"] + [11, 12, 13], 8)  # (folded records) comes back from host
    results: list[dict | None] = [None] * 5

    def run(i: int) -> None:
        body = {"input_ids": prompts[4 * (i % 4) + i // 4], "sampling_params": {
            "max_new_tokens": 60, "temperature": 0.0, "ignore_eos": True}}
        out = _post(url, "/generate", body)
        results[i] = {"output_ids": out["output_ids"], "retractions": out["meta_info"].get("num_retractions", 0),
                      "accept": out["meta_info"].get("spec_accept_length")}

    threads = [threading.Thread(target=run, args=(i,)) for i in range(5)]
    for t in threads:
        t.start()
        time.sleep(0.05)
    for t in threads:
        t.join()
    metrics = urllib.request.urlopen(url + "/metrics", timeout=30).read().decode()
    load_back = {pool: metric_sum(metrics, "sglang:load_back_tokens_total", pool=pool) for pool in ("kv", "mamba")}
    return {"hicache": hicache, "load_back": load_back, "retraction": results,
            "retracted_reqs": metric_sum(metrics, "sglang:num_retracted_requests_total")}


@pytest.fixture(scope="module")
def pressure_runs(model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[_Runs]:
    yield _Runs(model, tmp_path_factory.mktemp("spec-pressure-logs"), PRESSURE_ARMS, _pressure_workload)


@pytest.mark.parametrize("arm", ["ring", "nextn"])
def test_mixed_chunks_equal_plain(runs: _Runs, arm: str) -> None:
    """With the fold on (and without the ring) the mixed-chunk generations equal plain greedy. Whether a
    MIXED step meets pending records depends on when the short requests land: on 2026-12-01 the fold-off
    arm was equal too, on 2026-12-02 (records on beside the spec ring) it differed from token 36 of the
    long generation (D3 on a server). So the fold-off arm (``ring_fold_off``, kept for manual A/B) is not asserted;
    D3's regression is the unit test (tests/test_spec_ring.py)."""
    assert runs[arm]["mixed"] == runs["plain"]["mixed"]


@pytest.mark.parametrize("arm", ["ring", "nextn"])
def test_session_turns_equal_plain(runs: _Runs, arm: str) -> None:
    assert runs[arm]["session"] == runs["plain"]["session"]


@pytest.mark.parametrize("arm", ["nextn", "nextn-ring", "nextn-plugin"])
def test_hicache_load_back_equals_plain(pressure_runs: _Runs, arm: str) -> None:
    """Revisited system prompts come back from host (KV and mamba state loaded back) and every
    generation's greedy tokens equal plain greedy (no spec, no pressure, no HiCache). With records
    (nextn-ring, nextn-plugin) each second turn hits 163 tokens from host: the state SGLang donated at
    the first turn's finish (``end_state``, the spec ring's pending records folded first), backed up
    and loaded back; NEXTN without the ring keeps only the tracked state at 128."""
    got, want = pressure_runs[arm], pressure_runs["plain"]
    assert sum(r["host"] for r in got["hicache"]) > 0, [r["host"] for r in got["hicache"]]
    assert got["load_back"]["kv"] > 0 and got["load_back"]["mamba"] > 0, got["load_back"]
    if arm != "nextn":  # with records the second turns resume from the finished end state, loaded back
        assert all(r["host"] > 140 for r in got["hicache"][8:]), [r["host"] for r in got["hicache"]]
    assert [r["output_ids"] for r in got["hicache"]] == [r["output_ids"] for r in want["hicache"]]


@pytest.mark.parametrize("arm", ["nextn", "nextn-ring", "nextn-plugin"])
def test_retraction_equals_plain(pressure_runs: _Runs, arm: str) -> None:
    """Concurrent long generations are retracted mid-decode (meta_info.num_retractions) and still
    equal plain greedy."""
    got, want = pressure_runs[arm], pressure_runs["plain"]
    assert not any(r["retractions"] for r in want["retraction"])
    assert sum(r["retractions"] for r in got["retraction"]) > 0, [r["retractions"] for r in got["retraction"]]
    assert got["retracted_reqs"] > 0  # sglang:num_retracted_requests_total
    for i, (g, w) in enumerate(zip(got["retraction"], want["retraction"])):
        assert g["output_ids"] == w["output_ids"], f"request {i} ({g['retractions']} retractions) differs"
