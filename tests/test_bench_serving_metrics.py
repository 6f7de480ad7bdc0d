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
