"""The TTFT ratio an arm's prefix hits allow, from one bench run with per-request data.

Fits the reference arm's TTFT per request as ``fixed + per_token * prefilled`` (least squares; prefilled =
prompt - cached tokens), then evaluates that fit at the other arm's prefilled tokens for the same requests: the
mean TTFT the other arm would have with the reference's costs, i.e. with no overhead of its own. The ratio of that
to the reference's mean is the bound its hits set; the measured ratio minus the bound is its own cost. Requests are
split into those the arm matched deeper than the reference and those it matched the same.

    python lab/scripts/ttft_bound.py notes/bench-mem-rows-2026-12-05.json --key "run 7" --arm plugin --ref baseline

A JSON of ``sglang-replayssm bench`` (``arms`` at the top) or a notes file holding several under keys (``--key``: the
first key starting with it).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any


def prefilled(r: dict[str, Any]) -> int:
    return int(r["prompt_tokens"]) - int(r["cached_tokens"])


def fit(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least squares ``y = a + c x``: ``(a, c)``."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    c = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx if sxx else 0.0
    return my - c * mx, c


def bound(ref: list[dict[str, Any]], arm: list[dict[str, Any]]) -> dict[str, Any]:
    """The fit on ``ref``'s requests, the bound and the measured ratio of ``arm`` (requests matched by ``rid``)."""
    by_rid = {r["rid"]: r for r in arm}
    pairs = [(r, by_rid[r["rid"]]) for r in ref if r["rid"] in by_rid and r.get("ttft_s") and by_rid[r["rid"]].get("ttft_s")]
    if len(pairs) < 3:
        raise ValueError(f"{len(pairs)} requests in both arms: too few to fit")
    a, c = fit([float(prefilled(r)) for r, _ in pairs], [r["ttft_s"] * 1e3 for r, _ in pairs])
    ref_mean = statistics.fmean(r["ttft_s"] * 1e3 for r, _ in pairs)
    arm_mean = statistics.fmean(p["ttft_s"] * 1e3 for _, p in pairs)
    at_arm = a + c * statistics.fmean(prefilled(p) for _, p in pairs)
    ys = [r["ttft_s"] * 1e3 for r, _ in pairs]
    sse = sum((y - a - c * prefilled(r)) ** 2 for y, (r, _) in zip(ys, pairs, strict=True))
    sst = sum((y - ref_mean) ** 2 for y in ys)
    out: dict[str, Any] = {
        "requests": len(pairs), "fixed_ms": a, "ms_per_1k_tokens": c * 1e3, "ref_mean_ms": ref_mean,
        "arm_mean_ms": arm_mean, "bound_mean_ms": at_arm, "bound_ratio": at_arm / ref_mean,
        "measured_ratio": arm_mean / ref_mean, "fit_r2": 1.0 - sse / sst if sst else 1.0,
        "prefill_ratio": sum(prefilled(p) for _, p in pairs) / max(1, sum(prefilled(r) for r, _ in pairs)),
    }  # fmt: skip
    for name, keep in (("deeper", lambda r, p: p["cached_tokens"] > r["cached_tokens"]),
                       ("same", lambda r, p: p["cached_tokens"] == r["cached_tokens"]),
                       ("shallower", lambda r, p: p["cached_tokens"] < r["cached_tokens"])):  # fmt: skip
        sel = [(r, p) for r, p in pairs if keep(r, p)]
        if sel:
            delta = [(p["ttft_s"] - r["ttft_s"]) * 1e3 for r, p in sel]
            out[name] = {"n": len(sel), "delta_mean_ms": statistics.fmean(delta), "delta_median_ms": statistics.median(delta),
                         "fit_delta_mean_ms": c * statistics.fmean(prefilled(p) - prefilled(r) for r, p in sel)}  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("json", type=Path)
    ap.add_argument("--key", default=None, help="in a notes file: the first top-level key starting with this")
    ap.add_argument("--arm", default="plugin")
    ap.add_argument("--ref", default="baseline")
    args = ap.parse_args(argv)
    data = json.loads(args.json.read_text())
    if args.key is not None:
        data = data[next(k for k in data if k.startswith(args.key))]
    arms = data.get("arms", data)
    res = bound(arms[args.ref]["requests"], arms[args.arm]["requests"])
    print(json.dumps(res, indent=1))
    print(f"{args.arm} vs {args.ref}: TTFT = {res['fixed_ms']:.1f} ms + {res['ms_per_1k_tokens']:.0f} ms per 1,000 "
          f"prefilled tokens ({args.ref}'s fit); bound {res['bound_ratio']:.3f}x, measured {res['measured_ratio']:.3f}x, "
          f"prefilled tokens {res['prefill_ratio']:.3f}x, {res['requests']} requests, fit R^2 {res['fit_r2']:.3f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
