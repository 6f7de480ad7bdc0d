"""HiCache on the CPU runtime with real servers (slow, `server` marker).

A device pool small enough that the first prompt's prefix is evicted to host; the re-request is a host
hit (loaded back, KV and mamba state) and its greedy tokens equal HF's. An unsupported layout fails at
startup with one line naming the flags.
"""

from __future__ import annotations

import json
import os
import random
import urllib.request
from pathlib import Path

import pytest

from sglang_replayssm.bench.server_metrics import metric_sum

NEW_TOKENS = 12
RING_LEN = 4
# Device pool far smaller than the prompts: 512 KV tokens and 8 mamba slots for 4 x 200-token prompts.
SMALL_POOL = ["--max-total-tokens", "512", "--max-mamba-cache-size", "8", "--max-running-requests", "2",
              "--hicache-ratio", "4", "--enable-hierarchical-cache", "--enable-metrics"]

SERVER_CASES = {
    # id: (model, flags, multi-turn re-request)
    "gdn-kernel": ("tiny-gdn", ["--mamba-radix-cache-strategy", "extra_buffer"], False),
    "gdn-direct": ("tiny-gdn", ["--mamba-radix-cache-strategy", "extra_buffer", "--hicache-io-backend", "direct"],
                   False),
    "gdn-ring-extra_buffer": ("tiny-gdn", ["--mamba-radix-cache-strategy", "extra_buffer",
                                           "--enable-linear-replayssm", "--linear-replayssm-cache-len",
                                           str(RING_LEN)], False),
    "gdn-ring-no_buffer-multiturn": ("tiny-gdn", ["--mamba-radix-cache-strategy", "no_buffer",
                                                  "--disable-overlap-schedule", "--enable-linear-replayssm",
                                                  "--linear-replayssm-cache-len", str(RING_LEN)], True),
    "kda-kernel": ("tiny-kda", ["--mamba-radix-cache-strategy", "extra_buffer"], False),
}


@pytest.fixture(scope="module")
def models() -> dict[str, Path]:
    from sglang_replayssm.models import make_models

    return make_models(names=("tiny-gdn", "tiny-kda"), log=lambda *a: None)


def _generate(url: str, ids: list[int]) -> dict:
    body = json.dumps({"input_ids": ids, "sampling_params": {"max_new_tokens": NEW_TOKENS, "temperature": 0.0,
                                                             "ignore_eos": True}}).encode()
    req = urllib.request.Request(url + "/generate", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as resp:
        return json.loads(resp.read())


@pytest.mark.server
@pytest.mark.timeout(900)
@pytest.mark.parametrize("case", [pytest.param(c, marks=pytest.mark.skipif(
    c == "gdn-direct" and os.environ.get("SGLANG_REPLAYSSM_SLOW") != "1",
    reason="opt-in (the direct io backend; gdn-kernel covers the path): SGLANG_REPLAYSSM_SLOW=1")) for c in SERVER_CASES])
def test_evicted_prefix_loads_back_from_host(models, tmp_path, case):
    from tests.support.hf_reference import hf_greedy
    from tests.support.serve import cpu_server

    model_name, flags, multiturn = SERVER_CASES[case]
    rng = random.Random(1)
    prompts = [[rng.randrange(10, 2000) for _ in range(200)] for _ in range(4)]
    with cpu_server(models[model_name], [*SMALL_POOL, *flags], tmp_path / "server.log") as url:
        outs = [_generate(url, p) for p in prompts]  # each evicts its predecessors from the device
        again = prompts[0] + (outs[0]["output_ids"] + [11, 12, 13, 14, 15] if multiturn else [])
        out = _generate(url, again)
        metrics = urllib.request.urlopen(url + "/metrics", timeout=30).read().decode()

    details = out["meta_info"].get("cached_tokens_details") or {}
    assert details.get("host", 0) >= 64, details  # the hit came from host memory ...
    assert metric_sum(metrics, "sglang:load_back_tokens_total", pool="kv") > 0  # ... loaded back: KV
    assert metric_sum(metrics, "sglang:load_back_tokens_total", pool="mamba") > 0  # and the mamba state
    assert metric_sum(metrics, "sglang:cached_tokens_total", cache_source="host") >= details["host"]
    if not multiturn:
        assert out["output_ids"] == outs[0]["output_ids"], "host hit differs from the uncached run"

    expected = hf_greedy(models[model_name], [*prompts, again], NEW_TOKENS, ignore_eos=True)
    if model_name == "tiny-kda" and outs[0]["output_ids"] != expected[0]:
        pytest.xfail("the uncached KDA request already differs from HF (CPU KDA runtime, not HiCache)")
    for i, (o, e) in enumerate(zip([*outs, out], expected)):
        assert o["output_ids"] == e, f"request {i} differs from HF"


@pytest.mark.server
@pytest.mark.timeout(600)
def test_unsupported_layout_fails_at_startup_naming_the_flags(models, tmp_path):
    from sglang_replayssm.bench.server import ServerStartError
    from tests.support.serve import cpu_server

    log = tmp_path / "server.log"
    flags = ["--enable-hierarchical-cache", "--mamba-radix-cache-strategy", "extra_buffer",
             "--hicache-mem-layout", "layer_first"]
    with pytest.raises(ServerStartError), cpu_server(models["tiny-gdn"], flags, log):
        pass
    lines = [ln for ln in log.read_text().splitlines() if ln.startswith("ValueError: HiCache")]
    assert lines and "--hicache-mem-layout layer_first" in lines[0], lines


STORAGE_FLAGS = ["--max-total-tokens", "512", "--max-mamba-cache-size", "8", "--max-running-requests", "2",
                 "--hicache-ratio", "2", "--enable-hierarchical-cache", "--enable-metrics",
                 "--hicache-storage-backend", "file", "--hicache-write-policy", "write_through",
                 "--hicache-storage-backend-extra-config", '{"prefetch_threshold": 16}',
                 "--mamba-radix-cache-strategy", "extra_buffer", "--enable-linear-replayssm",
                 "--linear-replayssm-cache-len", str(RING_LEN)]


@pytest.mark.server
@pytest.mark.timeout(1500)
@pytest.mark.skipif(os.environ.get("SGLANG_REPLAYSSM_SLOW") != "1",
                    reason="opt-in (two servers, ~6 min): SGLANG_REPLAYSSM_SLOW=1")
@pytest.mark.parametrize("switch", ["on", "off"])
def test_l3_storage_hit_then_a_hit_inside_the_prefetched_span(models, tmp_path, switch):
    """``--hicache-storage-backend file`` on the CPU runtime: ten prompts push the first out of device
    and host; its re-request is a storage hit at the deepest stored state (SGLang's), with HF's
    tokens. A request leaving it inside that span hits at the KV depth only with the records stored
    beside the pages (``record_storage``); a second server on the same directory does the same."""
    from tests.support.hf_reference import hf_greedy
    from tests.support.serve import cpu_server, generate

    env = {"SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR": str(tmp_path / "l3")}
    if switch == "off":
        env["SGLANG_REPLAYSSM_DISABLE_FIXES"] = "record_storage"
    rng = random.Random(1)
    prompts = [[rng.randrange(10, 2000) for _ in range(200)] for _ in range(10)]
    leave = [p[:150] + [5] * 20 for p in prompts[:2]]
    model = models["tiny-gdn"]
    with cpu_server(model, STORAGE_FLAGS, tmp_path / "server1.log", env=env, timeout_s=600) as url:
        outs = [generate(url, p, NEW_TOKENS) for p in prompts]
        again = generate(url, prompts[0], NEW_TOKENS)
        inside = generate(url, leave[0], NEW_TOKENS)
    with cpu_server(model, STORAGE_FLAGS, tmp_path / "server2.log", env=env, timeout_s=600) as url:
        generate(url, [rng.randrange(10, 2000) for _ in range(40)], 2)  # a first forward: record shapes
        again2 = generate(url, prompts[1], NEW_TOKENS)
        inside2 = generate(url, leave[1], NEW_TOKENS)
        metrics = urllib.request.urlopen(url + "/metrics", timeout=30).read().decode()

    assert again["cached_tokens"] == again2["cached_tokens"] == 192  # the deepest stored state (64-grid)
    assert metric_sum(metrics, "sglang:cached_tokens_total", cache_source="storage") >= 192
    want = 150 if switch == "on" else 0
    assert (inside["cached_tokens"], inside2["cached_tokens"]) == (want, want)
    expected = hf_greedy(model, [prompts[0], prompts[1], *leave], NEW_TOKENS, ignore_eos=True)
    got = [again["output_ids"], again2["output_ids"], inside["output_ids"], inside2["output_ids"]]
    assert got == expected
    assert outs[0]["output_ids"] == again["output_ids"]
