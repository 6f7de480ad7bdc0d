"""bench/ttft_bound.py: the TTFT an arm's hits allow at the reference arm's costs."""

from __future__ import annotations

from typing import Any

import pytest

from sglang_replayssm.bench import ttft_bound as mod


def _req(rid: str, prompt: int, cached: int, ttft_ms: float) -> dict[str, Any]:
    return {"rid": rid, "prompt_tokens": prompt, "cached_tokens": cached, "ttft_s": ttft_ms / 1e3}


def test_bound_is_the_reference_cost_at_the_arms_prefill() -> None:
    """Reference TTFT exactly 30 ms + 0.4 ms a prefilled token; the arm caches 500 more tokens of one request and
    pays 2 ms on every request: bound = the fit at its prefill, measured = bound + 2 ms."""
    prompts = [(800, 0), (900, 300), (1000, 600), (700, 100), (1200, 0)]
    ref = [_req(str(i), p, c, 30 + 0.4 * (p - c)) for i, (p, c) in enumerate(prompts)]
    arm = [_req(str(i), p, c + (500 if i == 4 else 0), 2 + 30 + 0.4 * (p - c - (500 if i == 4 else 0)))
           for i, (p, c) in enumerate(prompts)]  # fmt: skip
    got = mod.bound(ref, arm)
    ref_mean = sum(r["ttft_s"] for r in ref) * 1e3 / 5
    assert got["fixed_ms"] == pytest.approx(30) and got["ms_per_1k_tokens"] == pytest.approx(400)
    assert got["fit_r2"] == pytest.approx(1.0)
    assert got["bound_mean_ms"] == pytest.approx(ref_mean - 0.4 * 500 / 5)
    assert got["arm_mean_ms"] == pytest.approx(got["bound_mean_ms"] + 2)
    assert got["deeper"]["n"] == 1 and got["same"]["n"] == 4
    assert got["same"]["delta_mean_ms"] == pytest.approx(2) and got["deeper"]["fit_delta_mean_ms"] == pytest.approx(-200)


def test_too_few_shared_requests_is_refused() -> None:
    with pytest.raises(ValueError, match="too few"):
        mod.bound([_req("a", 10, 0, 5.0)], [_req("b", 10, 0, 5.0)])


def test_bounds_pairs_every_arm_with_the_reference_and_skips_failed_requests() -> None:
    """Arms without records or without enough paired requests drop out; a failed request (no TTFT) is left out."""
    ref = [_req(str(i), 100 * (i + 1), 0, 10 + 0.1 * 100 * (i + 1)) for i in range(4)]
    arm = [*ref[:3], {**ref[3], "ttft_s": None}]
    got = mod.bounds({"baseline": {"requests": ref}, "plugin": {"requests": arm}, "upstream": {"error": "x"},
                      "short": {"requests": ref[:2]}})  # fmt: skip
    assert set(got) == {"plugin"} and got["plugin"]["requests"] == 3
    assert got["plugin"]["bound_ratio"] == pytest.approx(1.0)
    assert mod.bounds({"plugin": {"requests": ref}}) == {}
    line = mod.format_bounds(got)
    assert line.startswith("plugin: its hits allow 1.000x of baseline's mean TTFT") and "measured 1.000x" in line
