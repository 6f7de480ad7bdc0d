"""The GPU serving check's measurements (bench/kl.py, bench/decode.py) and its arms (bench/arms.py)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from sglang_replayssm.bench.arms import ARMS, common_flags, server_command, server_env
from sglang_replayssm.bench.decode import decode_steps
from sglang_replayssm.bench.kl import ProbeResult, quantile, summarize, token_kl


def test_token_kl_is_sglangs_estimator() -> None:
    ref, served = [-0.5, -1.0, -2.0], [-0.5, -1.2, -1.0]
    got = token_kl(ref, served)
    want = [math.exp(a - b) - 1 - (a - b) for a, b in zip(ref, served)]
    assert got == pytest.approx(want, rel=1e-12)
    assert got[0] == 0.0 and all(x > 0 for x in got[1:])
    with pytest.raises(ValueError, match="differ in length"):
        token_kl([0.0], [0.0, 1.0])


def test_quantile_interpolates() -> None:
    assert quantile([3.0, 1.0, 2.0, 4.0], 0.5) == pytest.approx(2.5)
    assert quantile([5.0], 0.95) == 5.0
    assert math.isnan(quantile([], 0.5))


def test_summarize_means_per_probe_then_over_probes() -> None:
    a = ProbeResult(100, 64, 64, [1, 2], served=[-1.0, -1.0], ref=[-1.0, -1.0])  # exact
    b = ProbeResult(100, 10, 64, [3, 4, 5, 6], served=[-1.0] * 4, ref=[-1.5, -1.0, -1.0, -1.0])
    s = summarize([a, b])
    kl_b = (math.expm1(-0.5) + 0.5) / 4
    assert s["kl"] == pytest.approx(kl_b / 2)
    assert s["kl_max_probe"] == pytest.approx(kl_b)
    assert s["tokens"] == 6 and s["dlp_max"] == pytest.approx(0.5)
    assert s["hit_at_expected"] == 1  # b hit short of its shared depth


def test_decode_steps_reads_full_batch_lines_only() -> None:
    log = "\n".join([
        "[2026-12-03 10:00:00] Decode batch, #running-req: 256, #token: 9000, token usage: 0.10, "
        "cuda graph: True, gen throughput (token/s): 12800.00, #queue-req: 0, ",
        "[2026-12-03 10:00:01] Decode batch, #running-req: 200, #token: 9000, token usage: 0.10, "
        "cuda graph: True, gen throughput (token/s): 9000.00, #queue-req: 0, ",
        "[2026-12-03 10:00:02] Decode batch, #running-req: 256, #token: 9100, token usage: 0.10, "
        "cuda graph: True, gen throughput (token/s): 25600.00, #queue-req: 0, ",
    ])
    assert decode_steps(log, 256) == pytest.approx([20.0, 10.0])
    assert decode_steps(log, 64) == []


def test_gpu_arms_keep_overlap_except_no_buffer() -> None:
    assert "--disable-overlap-schedule" in common_flags(ARMS["plugin"], "cpu")
    assert "--disable-overlap-schedule" not in common_flags(ARMS["plugin"], "cuda")
    assert "--disable-overlap-schedule" in common_flags(ARMS["upstream"], "cuda")
    cmd = server_command(ARMS["plugin-fp8"], Path("/m"), 1234, device="cuda", tp=1, extra_args=[])
    assert "--disable-overlap-schedule" not in cmd and cmd[cmd.index("--device") + 1] == "cuda"
    assert server_env(ARMS["plugin-fp8"], "cuda")["SGLANG_REPLAYSSM_READ_COPY"] == "fp8"
    assert ARMS["bf16-state"].env == () and ARMS["plugin"].env == ()
    assert "--mamba-ssm-dtype" in ARMS["bf16-state"].flags


def test_the_pressure_scenario_lets_fillers_stop_at_eos_and_reads_absent_counters_as_zero() -> None:
    """SGLang reserves an ``ignore_eos`` request's whole budget at admission, so only fillers that may stop at
    EOS can outgrow the pool (retraction); probes and references stay fixed-length. A counter SGLang never
    incremented is absent from /metrics: the row reads 0, not unknown."""
    import asyncio
    import socket

    from aiohttp import web

    from sglang_replayssm.bench.kl import KlSpec, run_kl

    spec = KlSpec(probes=2, prefix_len=10, suffix_len=3, branch_tokens=4, filler_count=3, filler_len=6,
                  filler_tokens=5)
    seen: list[dict] = []

    async def generate(request: web.Request) -> web.Response:
        body = await request.json()
        seen.append(body)
        n = body["sampling_params"]["max_new_tokens"]
        ids = body["input_ids"]
        return web.json_response({"output_ids": [11] * n, "meta_info": {
            "cached_tokens": 0, "output_token_logprobs": [[-0.5, 11, None]] * n,
            "input_token_logprobs": [[-0.5, t, None] for t in ids]}})

    async def ok(request: web.Request) -> web.Response:
        return web.Response(text="sglang:load_back_tokens_total{model=\"m\"} 7.0\n")

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]

    async def main() -> dict:
        app = web.Application()
        app.add_routes([web.post("/generate", generate), web.post("/flush_cache", ok), web.get("/metrics", ok)])
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        try:
            return await asyncio.to_thread(run_kl, f"http://127.0.0.1:{port}", spec, ("pressure",))
        finally:
            await runner.cleanup()

    row = asyncio.run(main())["pressure"]
    fillers = [b for b in seen if len(b["input_ids"]) == spec.filler_len]
    assert len(fillers) == 2 * spec.filler_count  # one burst after the seed, one beside the branches
    assert all(b["sampling_params"]["ignore_eos"] is False for b in fillers)
    assert all(b["sampling_params"]["ignore_eos"] is True for b in seen if b not in fillers)
    assert row["num_retracted_requests_total"] == 0.0 and row["hicache_backup_tokens_total"] == 0.0
    assert row["load_back_tokens_total"] == 0.0  # 7 before and after: none during the scenario
