"""lab/scripts/ttft_bound.py: the TTFT an arm's hits allow at the reference arm's costs."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _mod() -> Any:
    spec = importlib.util.spec_from_file_location("ttft_bound", ROOT / "lab/scripts/ttft_bound.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _req(rid: str, prompt: int, cached: int, ttft_ms: float) -> dict[str, Any]:
    return {"rid": rid, "prompt_tokens": prompt, "cached_tokens": cached, "ttft_s": ttft_ms / 1e3}


def test_bound_is_the_reference_cost_at_the_arms_prefill() -> None:
    """Reference TTFT exactly 30 ms + 0.4 ms a prefilled token; the arm caches 500 more tokens of one request and
    pays 2 ms on every request: bound = the fit at its prefill, measured = bound + 2 ms."""
    mod = _mod()
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
    mod = _mod()
    with pytest.raises(ValueError, match="too few"):
        mod.bound([_req("a", 10, 0, 5.0)], [_req("b", 10, 0, 5.0)])
