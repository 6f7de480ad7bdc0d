"""The TTFT an arm's prefix hits allow, at the reference arm's per-request costs.

The reference arm's TTFT per request is fitted as ``fixed + per_token * prefilled`` (least squares; prefilled =
prompt - cached tokens) and evaluated at another arm's prefilled tokens for the same requests (by ``rid``): the mean
TTFT that arm would have with no cost of its own. Its ratio to the reference's mean is the bound its hits set;
measured minus bound is the arm's own cost. Requests are split by how deep the arm matched against the reference.
"""

from __future__ import annotations

import statistics
from typing import Any

from sglang_replayssm.bench.records import match_depth

__all__ = ["bound", "bounds", "format_bounds"]


def _prefilled(r: dict[str, Any]) -> int:
    return int(r["prompt_tokens"]) - int(r["cached_tokens"])


def _complete(r: dict[str, Any]) -> bool:
    """A request that got its first token (failed ones carry no TTFT)."""
    return bool(r.get("ttft_s")) and r.get("prompt_tokens") is not None and r.get("cached_tokens") is not None


def _fit(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least squares ``y = a + c x``: ``(a, c)`` (a constant ``x``: ``c`` 0)."""
    try:
        c, a = statistics.linear_regression(xs, ys)
    except statistics.StatisticsError:
        return statistics.fmean(ys), 0.0
    return a, c


def bound(ref: list[dict[str, Any]], arm: list[dict[str, Any]]) -> dict[str, Any]:
    """The fit on ``ref``'s requests, the bound and the measured ratio of ``arm`` (requests matched by ``rid``)."""
    by_rid = {r["rid"]: r for r in arm if _complete(r)}
    pairs = [(r, by_rid[r["rid"]]) for r in ref if _complete(r) and r["rid"] in by_rid]
    if len(pairs) < 3:
        raise ValueError(f"{len(pairs)} requests in both arms: too few to fit")
    xs, ys = [float(_prefilled(r)) for r, _ in pairs], [r["ttft_s"] * 1e3 for r, _ in pairs]
    a, c = _fit(xs, ys)
    ref_mean = statistics.fmean(ys)
    arm_mean = statistics.fmean(p["ttft_s"] * 1e3 for _, p in pairs)
    at_arm = a + c * statistics.fmean(_prefilled(p) for _, p in pairs)
    sse = sum((y - a - c * x) ** 2 for x, y in zip(xs, ys, strict=True))
    sst = sum((y - ref_mean) ** 2 for y in ys)
    out: dict[str, Any] = {
        "requests": len(pairs), "fixed_ms": a, "ms_per_1k_tokens": c * 1e3, "ref_mean_ms": ref_mean,
        "arm_mean_ms": arm_mean, "bound_mean_ms": at_arm, "bound_ratio": at_arm / ref_mean,
        "measured_ratio": arm_mean / ref_mean, "fit_r2": 1.0 - sse / sst if sst else 1.0,
        "prefill_ratio": sum(_prefilled(p) for _, p in pairs) / max(1, sum(_prefilled(r) for r, _ in pairs)),
    }  # fmt: skip
    for name in ("deeper", "same", "shallower"):
        sel = [(r, p) for r, p in pairs if match_depth(r["cached_tokens"], p["cached_tokens"]) == name]
        if sel:
            delta = [(p["ttft_s"] - r["ttft_s"]) * 1e3 for r, p in sel]
            out[name] = {"n": len(sel), "delta_mean_ms": statistics.fmean(delta), "delta_median_ms": statistics.median(delta),
                         "fit_delta_mean_ms": c * statistics.fmean(_prefilled(p) - _prefilled(r) for r, p in sel)}  # fmt: skip
    return out


def bounds(arms: dict[str, dict[str, Any]], ref: str = "baseline") -> dict[str, dict[str, Any]]:
    """:func:`bound` of every arm besides ``ref`` that pairs with it (both with per-request records)."""
    if "requests" not in arms.get(ref, {}):
        return {}
    out = {}
    for name, arm in arms.items():
        if name != ref and "requests" in arm:
            try:
                out[name] = bound(arms[ref]["requests"], arm["requests"])
            except ValueError:
                continue
    return out


def format_bounds(found: dict[str, dict[str, Any]], ref: str = "baseline") -> str:
    """One line per arm of :func:`bounds`' result: the TTFT ratio its hits allow, and the measured one."""
    return "\n".join(
        f"{name}: its hits allow {b['bound_ratio']:.3f}x of {ref}'s mean TTFT at {ref}'s costs ({b['fixed_ms']:.1f} ms "
        f"+ {b['ms_per_1k_tokens']:.0f} ms per 1,000 prefilled tokens, R^2 {b['fit_r2']:.2f}); measured "
        f"{b['measured_ratio']:.3f}x, prefilled tokens {b['prefill_ratio']:.3f}x"
        for name, b in found.items()
    )
