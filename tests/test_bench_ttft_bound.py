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


def _sweep_module() -> Any:
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "lab" / "scripts" / "bench_mem_sweep.py"
    spec = importlib.util.spec_from_file_location("bench_mem_sweep", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_memory_sweep_rows_carry_each_sizes_ratio_and_bound(tmp_path) -> None:
    """lab/scripts/bench_mem_sweep.py: per size the arm's TTFT over the reference's and what its hits allow (the
    arm caches 100 more tokens of each request at the reference's 0.5 ms a token and pays 4 ms more: bound below
    measured), the slots and KV tokens from the equal-memory split; rows print by size; no reference: one error."""
    sweep = _sweep_module()

    def doc(extra_ms: float) -> dict[str, Any]:
        ref = [_req(str(i), 400 + 100 * i, 0, 20 + 0.5 * (400 + 100 * i)) for i in range(5)]
        arm = [_req(r["rid"], r["prompt_tokens"], 100, r["ttft_s"] * 1e3 - 50 + extra_ms) for r in ref]
        arms = {"baseline": {"requests": ref, "hit_rate": 0.0, "ceiling_hit_rate": 0.5,
                             "ttft_mean_s": sum(r["ttft_s"] for r in ref) / 5},
                "plugin": {"requests": arm, "hit_rate": 0.2, "ceiling_hit_rate": 0.5,
                           "ttft_mean_s": sum(r["ttft_s"] for r in arm) / 5}}
        return {"arms": arms, "equal_memory": {"arms": {"baseline": {"state_slots": 19, "kv_tokens": 10_032},
                                                        "plugin": {"state_slots": 18, "kv_tokens": 9_615}}}}

    rows = [sweep.sweep_row(42, doc(0.0), "baseline"), sweep.sweep_row(30, doc(4.0), "baseline")]
    ref_mean = 20 + 0.5 * 600
    at42, at30 = rows[0]["arms"]["plugin"], rows[1]["arms"]["plugin"]
    assert at42["ttft_bound"] == pytest.approx((ref_mean - 50) / ref_mean)
    assert at42["ttft_ratio"] == pytest.approx(at42["ttft_bound"])
    assert at30["ttft_ratio"] == pytest.approx((ref_mean - 46) / ref_mean) and at30["ttft_bound"] == at42["ttft_bound"]
    assert rows[0]["arms"]["baseline"]["ttft_ratio"] is None and at42["state_slots"] == 18
    table = sweep.format_rows(rows, "baseline").splitlines()
    assert table[1].split()[:2] == ["30", "baseline"] and table[4].split()[:2] == ["42", "plugin"]
    assert "9,615" in table[4] and f"{at42['ttft_bound']:.3f}x" in table[4]
    with pytest.raises(ValueError, match="no 'baseline' arm"):
        sweep.sweep_row(36, {"arms": {"plugin": doc(0.0)["arms"]["plugin"]}}, "baseline")
    assert sweep.plot(rows, tmp_path / "hit.png").stat().st_size > 0
