"""A PD decode server with the decode ring on the CPU runtime (opt-in: SGLANG_REPLAYSSM_SLOW=1).

Plumbing only: no transfer backend imports on this machine (notes/pd.md), so the decode server runs with
SGLang's ``fake`` backend, which moves nothing; its tokens come from whatever the receiving buffers hold
and are compared with nothing. What it shows: the decode server starts with ``--enable-linear-replayssm``
(SGLang refuses it, attention_hook.py:424), allocates the ring on its decode pool, and serves concurrent
requests past several ring flushes. The exactness of the decode pool's ring is tested at unit level
(tests/test_pd_decode_ring.py).
"""

from __future__ import annotations

import json
import os
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from sglang_replayssm.models import make_models
from sglang_replayssm.testing.serve import cpu_server

pytestmark = [
    pytest.mark.server,
    pytest.mark.timeout(1800),
    pytest.mark.skipif(os.environ.get("SGLANG_REPLAYSSM_SLOW") != "1",
                       reason="opt-in: SGLANG_REPLAYSSM_SLOW=1 pytest tests/test_pd_server.py"),
]

RING = 16
DECODE = ["--disaggregation-mode", "decode", "--disaggregation-transfer-backend", "fake",
          "--enable-linear-replayssm", "--linear-replayssm-cache-len", str(RING)]


def _generate(url: str, ids: list[int], n: int, room: int) -> dict:
    body = {"input_ids": ids, "bootstrap_host": "2.2.2.2", "bootstrap_room": room,  # FAKE_BOOTSTRAP_HOST
            "sampling_params": {"max_new_tokens": n, "temperature": 0.0, "ignore_eos": True}}
    req = urllib.request.Request(url + "/generate", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=900) as resp:
        return json.loads(resp.read())


def test_decode_server_runs_the_ring_with_the_fake_backend(tmp_path: Path):
    model = make_models(names=["tiny-gdn"], log=lambda *a: None)["tiny-gdn"]
    log = tmp_path / "decode.log"
    prompts = [[(7 * i + 3 + k) % 200 + 10 for i in range(n)] for k, n in enumerate((100, 300))]
    with cpu_server(model, DECODE, log, timeout_s=900) as url:
        with ThreadPoolExecutor(max_workers=len(prompts)) as pool:
            outs = list(pool.map(lambda kp: _generate(url, kp[1], 3 * RING, kp[0] + 1), enumerate(prompts)))
    assert [len(o["output_ids"]) for o in outs] == [3 * RING] * len(prompts)
    text = log.read_text()
    assert f"GDN ReplaySSM ring buffers allocated (record_len={RING}" in text
    assert "Radix cache is disabled for decode server" in text
