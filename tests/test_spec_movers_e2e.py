"""Issue 14, D3 and D4 on a real SGLang 0.5.23 server (CPU runtime, tiny fp32 GDN model with its
fitted MTP layer): NEXTN + the spec-verify ring with ``--enable-mixed-chunk`` (SGLang keeps it for
EAGLE / NEXTN; a MIXED step runs a spec row as a 1-token extend from ``temporal``) and a three-turn
streaming session (each turn extends the row the previous turn verified into, cursors kept).

Greedy tokens equal the non-spec server's with the plugin's ``spec_extend_fold``; with it off the
extends start from a ``temporal`` that lags by the row's pending accepted records, and the tokens
differ. Three servers: plain, NEXTN + ring, NEXTN + ring with the fix off.
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

pytestmark = [pytest.mark.server, pytest.mark.timeout(1800)]

NEXTN_RING = ["--speculative-algorithm", "NEXTN", "--speculative-num-steps", "3", "--speculative-num-draft-tokens", "4",
              "--enable-linear-replayssm-spec", "--linear-replayssm-cache-len", "16"]
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


@pytest.fixture(scope="module")
def runs(model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, dict]]:
    logs = tmp_path_factory.mktemp("spec-movers-logs")
    arms = {
        "plain": (MIXED, {}),
        "ring": ([*NEXTN_RING, *MIXED], {}),
        "ring_fold_off": ([*NEXTN_RING, *MIXED], {"SGLANG_REPLAYSSM_DISABLE_FIXES": "spec_extend_fold"}),
    }
    out: dict[str, dict] = {}
    for name, (flags, env) in arms.items():
        with cpu_server(model, flags, logs / f"{name}.log", env=env, timeout_s=600) as url:
            out[name] = _workload(url)
    (logs / "runs.json").write_text(json.dumps(out))
    yield out


def test_d3_d4_mixed_chunks_and_session_turns_equal_plain_with_the_fix(runs: dict[str, dict]) -> None:
    assert runs["ring"] == runs["plain"]


def test_d3_d4_differ_without_the_fix(runs: dict[str, dict]) -> None:
    assert runs["ring_fold_off"] != runs["plain"]
