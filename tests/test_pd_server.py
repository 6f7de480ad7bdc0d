"""PD disaggregation on one machine, for real: a prefill server (no ring) + a decode server with the
decode ring and its own radix cache, over mooncake's TCP transport, behind SGLang's router (mini-LB),
against a non-PD server (opt-in: SGLANG_REPLAYSSM_SLOW=1; three CPU servers and a router, ~10 min).

Needs the ``pd`` extra (``pip install 'sglang-replayssm[pd]'``: mooncake-transfer-engine-non-cuda,
sglang-router) and mooncake's ``libibverbs.so.1`` (Debian ``libibverbs1``) loadable by this process: the
servers inherit the environment. The prefill server runs with SGLang's default overlap scheduling
(fix ``pd_early_send_event``, cpu/hooks_pd.py). What it prints: each request's cached tokens on the
prefill side and the decode side's own prefix hits (radix/pd/hits.py), which SGLang does not report.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from contextlib import ExitStack
from pathlib import Path

import pytest

from sglang_replayssm.bench.server import pick_port
from sglang_replayssm.models import make_models
from sglang_replayssm.radix.pd.hits import LOG_PREFIX
from tests.support.serve import cpu_server

pytestmark = [
    pytest.mark.server,
    pytest.mark.timeout(3600),
    pytest.mark.skipif(os.environ.get("SGLANG_REPLAYSSM_SLOW") != "1",
                       reason="opt-in: SGLANG_REPLAYSSM_SLOW=1 pytest tests/test_pd_server.py"),
]

RING = 16
LENGTHS = [100, 300, 700, 300]  # each a prefix of the next; the repeat hits the prefill server's tree
TAIL = 40  # a fifth request: the 300-token prompt + its answer + TAIL new tokens (a next turn)


def _prompt(n: int) -> list[int]:
    return [(7 * i + 3) % 200 + 10 for i in range(n)]


def _post(url: str, ids: list[int]) -> dict:
    body = {"input_ids": ids, "sampling_params": {"max_new_tokens": 3 * RING, "temperature": 0.0, "ignore_eos": True}}
    req = urllib.request.Request(url + "/generate", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=900) as resp:
        return json.loads(resp.read())


def _serve_all(url: str) -> list[dict]:
    """The four prompts, then the next turn of the second one (its prompt + answer + TAIL tokens)."""
    out = [_post(url, _prompt(n)) for n in LENGTHS]
    turn = _prompt(LENGTHS[1]) + out[1]["output_ids"] + [(5 * i + 1) % 200 + 10 for i in range(TAIL)]
    return [*out, _post(url, turn)]


def _needs(module: str, package: str) -> None:
    try:
        __import__(module)
    except ImportError as exc:
        pytest.skip(f"needs {package} (pip install 'sglang-replayssm[pd]'): {exc}")


def _router(stack: ExitStack, prefill: str, bootstrap: int, decode: str, log: Path) -> str:
    port = pick_port()
    cmd = [sys.executable, "-m", "sglang_router.launch_router", "--pd-disaggregation", "--mini-lb",
           "--prefill", prefill, str(bootstrap), "--decode", decode, "--host", "127.0.0.1", "--port", str(port)]
    proc = subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT)
    stack.callback(proc.wait, 30)
    stack.callback(proc.terminate)
    url = f"http://127.0.0.1:{port}"
    for _ in range(120):
        assert proc.poll() is None, log.read_text()
        try:
            urllib.request.urlopen(url + "/health", timeout=5)
            return url
        except OSError:
            time.sleep(1)
    raise TimeoutError(log.read_text())


def test_pd_pair_with_the_decode_ring_behind_the_router_serves_the_non_pd_tokens(tmp_path: Path):
    _needs("mooncake.engine", "mooncake-transfer-engine-non-cuda")
    _needs("sglang_router.mini_lb", "sglang-router")
    model = make_models(names=["tiny-gdn"], log=lambda *a: None)["tiny-gdn"]
    with cpu_server(model, [], tmp_path / "plain.log", timeout_s=900) as plain:
        ref = _serve_all(plain)
    bootstrap = pick_port()
    pd = ["--disaggregation-transfer-backend", "mooncake_tcp", "--disaggregation-bootstrap-port", str(bootstrap)]
    prefill_flags = [*pd, "--disaggregation-mode", "prefill", "--nccl-port", str(pick_port())]
    decode_flags = [*pd, "--disaggregation-mode", "decode", "--disaggregation-decode-enable-radix-cache",
                    "--enable-linear-replayssm", "--linear-replayssm-cache-len", str(RING),
                    "--nccl-port", str(pick_port())]
    with ExitStack() as stack:
        prefill = stack.enter_context(cpu_server(model, prefill_flags, tmp_path / "prefill.log", timeout_s=900))
        decode = stack.enter_context(cpu_server(model, decode_flags, tmp_path / "decode.log", timeout_s=900))
        served = _serve_all(_router(stack, prefill, bootstrap, decode, tmp_path / "router.log"))
    decode_log, prefill_log = (tmp_path / "decode.log").read_text(), (tmp_path / "prefill.log").read_text()
    assert "MC_FORCE_TCP is set, using TCP transport only" in decode_log  # mooncake's own engine, TCP
    # the default (SGLANG_REPLAYSSM_RING_ROWS=auto) keys the decode server's rings by request row
    assert "decode rings for" in decode_log and "request rows (not" in decode_log, "no ring on the decode server"
    # one line per admission; the first is SGLang's own 1-token startup request
    hits = [line.split(f"{LOG_PREFIX}: ", 1)[1] for line in decode_log.splitlines() if LOG_PREFIX in line]
    hits = hits[-len(served):]
    # SGLang returns max(prefill side's hit, decode side's): decode_schedule_batch_mixin.py:64-73
    print("returned cached tokens per request:", [s["meta_info"]["cached_tokens"] for s in served])
    print("prefill side's cached tokens per batch:", re.findall(r"#cached-token: (\d+)", prefill_log))
    print("non-PD cached tokens per request:", [r["meta_info"]["cached_tokens"] for r in ref])
    print("decode side, per admission:", *hits, sep="\n  ")
    for got, want, n in zip(served, ref, [*LENGTHS, "next turn"]):
        assert got["output_ids"] == want["output_ids"], n
    assert "Prefill batch" in prefill_log and served[3]["meta_info"]["cached_tokens"] > 0  # a prefill-side hit
    prompts = [int(re.search(r"#prompt-token: (\d+)", h).group(1)) for h in hits]  # type: ignore[union-attr]
    assert prompts == [s["meta_info"]["prompt_tokens"] for s in served], hits
    decode_hit = [int(re.search(r"#decode-hit-token: (\d+)", h).group(1)) for h in hits]  # type: ignore[union-attr]
    assert decode_hit[-1] > 0, hits  # the next turn hit the decode server's own tree
