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
"""

from __future__ import annotations

import json
import os
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from sglang_replayssm.models import make_models
from sglang_replayssm.models.mtp import fit_prompts
from sglang_replayssm.models.specs import SPECS
from sglang_replayssm.testing.serve import cpu_server

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

    def __init__(self, model: Path, logs: Path) -> None:
        self.model, self.logs, self.done = model, logs, {}

    def __getitem__(self, name: str) -> dict:
        if name not in self.done:
            flags, env = ARMS[name]
            with cpu_server(self.model, flags, self.logs / f"{name}.log", env=env, timeout_s=600) as url:
                self.done[name] = _workload(url)
            (self.logs / "runs.json").write_text(json.dumps(self.done))
        return self.done[name]


@pytest.fixture(scope="module")
def runs(model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[_Runs]:
    yield _Runs(model, tmp_path_factory.mktemp("spec-movers-logs"))


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
