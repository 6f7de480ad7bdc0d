"""PD disaggregation on one machine: a prefill server (no ring) + a decode server with the decode ring,
against a non-PD server (opt-in: SGLANG_REPLAYSSM_SLOW=1; three CPU servers, ~5-10 min).

No transfer backend imports here (notes/pd.md), so SGLang's mooncake connector runs over a loopback
stand-in of mooncake's ``TransferEngine`` (tests/mooncake_loopback, on the servers' PYTHONPATH):
bootstrap, handshake, KV pages, the mamba state slots and the metadata buffers are SGLang's own; only
the bytes travel over local TCP. The client plays SGLang's mini load balancer: each request goes to
both servers with the same bootstrap host / port / room, the decode server's answer is the result.

The prefill server runs with ``--disable-overlap-schedule``: under overlap its prefix-hit early send
records a CUDA event (disaggregation/prefill.py:1495-1497), which raises on the CPU runtime.
"""

from __future__ import annotations

import json
import os
import random
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path

import pytest

from sglang_replayssm.bench.server import pick_port
from sglang_replayssm.models import make_models
from sglang_replayssm.testing.serve import cpu_server

pytestmark = [
    pytest.mark.server,
    pytest.mark.timeout(3600),
    pytest.mark.skipif(os.environ.get("SGLANG_REPLAYSSM_SLOW") != "1",
                       reason="opt-in: SGLANG_REPLAYSSM_SLOW=1 pytest tests/test_pd_server.py"),
]

RING = 16
LENGTHS = [100, 300, 700, 300]  # the repeat hits the prefill server's radix cache
LOOPBACK = Path(__file__).parent / "mooncake_loopback"


def _prompt(n: int) -> list[int]:
    return [(7 * i + 3) % 200 + 10 for i in range(n)]


def _post(url: str, body: dict) -> dict:
    req = urllib.request.Request(url + "/generate", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=900) as resp:
        return json.loads(resp.read())


def _body(ids: list[int], **extra: object) -> dict:
    return {"input_ids": ids, "sampling_params": {"max_new_tokens": 3 * RING, "temperature": 0.0,
                                                  "ignore_eos": True}, **extra}


def test_pd_pair_with_the_decode_ring_serves_the_non_pd_tokens(tmp_path: Path):
    model = make_models(names=["tiny-gdn"], log=lambda *a: None)["tiny-gdn"]
    bootstrap = pick_port()
    env = {"PYTHONPATH": os.pathsep.join([str(LOOPBACK), os.environ.get("PYTHONPATH", "")])}
    pd = ["--disaggregation-transfer-backend", "mooncake_tcp", "--disaggregation-bootstrap-port", str(bootstrap)]
    prefill_flags = [*pd, "--disaggregation-mode", "prefill", "--disable-overlap-schedule",
                     "--nccl-port", str(pick_port())]
    decode_flags = [*pd, "--disaggregation-mode", "decode", "--enable-linear-replayssm",
                    "--linear-replayssm-cache-len", str(RING), "--nccl-port", str(pick_port())]
    with ExitStack() as stack:
        prefill = stack.enter_context(cpu_server(model, prefill_flags, tmp_path / "prefill.log", env=env,
                                                 timeout_s=900))
        decode = stack.enter_context(cpu_server(model, decode_flags, tmp_path / "decode.log", env=env,
                                                timeout_s=900))
        plain = stack.enter_context(cpu_server(model, [], tmp_path / "plain.log", timeout_s=900))
        served = []
        with ThreadPoolExecutor(max_workers=2) as pool:
            for n in LENGTHS:
                body = _body(_prompt(n), bootstrap_host="127.0.0.1", bootstrap_port=bootstrap,
                             bootstrap_room=random.randrange(1 << 62))
                p, d = pool.map(_post, [prefill, decode], [body, body])
                served.append((p, d, _post(plain, _body(_prompt(n)))))
    text = (tmp_path / "decode.log").read_text()
    assert f"GDN ReplaySSM ring buffers allocated (record_len={RING}" in text
    for (p, d, ref), n in zip(served, LENGTHS):
        assert d["output_ids"] == ref["output_ids"], n
        assert p["output_ids"] == ref["output_ids"][:1], n  # the prefill server samples the first token
    print("prefill cached tokens per request:", [p["meta_info"]["cached_tokens"] for p, _, _ in served])
    print("decode cached tokens per request:", [d["meta_info"]["cached_tokens"] for _, d, _ in served])
    assert served[-1][0]["meta_info"]["cached_tokens"] > 0  # the repeated prompt hit on the prefill side
