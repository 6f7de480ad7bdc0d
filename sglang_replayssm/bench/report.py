"""The benchmark's outputs: the JSON document (rewritten after every arm) and the stdout table."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sglang_replayssm.bench.metrics import Agreement
from sglang_replayssm.bench.records import RequestRecord

# The keys every ran arm carries under ``arms.<name>`` (more may follow).
ARM_KEYS: tuple[str, ...] = ("hit_rate", "ttft_mean_s", "ttft_p50_s", "ttft_p90_s", "ttft_p99_s",
                             "output_tok_s", "agreement", "server_cmd", "requests")


def arm_result(summary: dict[str, Any], server: dict[str, float | None], agreement: Agreement | None,
               server_cmd: str | None, records: Sequence[RequestRecord], **extra: Any) -> dict[str, Any]:
    """One ran arm's JSON object: the required keys first, then details."""
    result: dict[str, Any] = {
        "hit_rate": summary["hit_rate"],
        "ttft_mean_s": summary["ttft_mean_s"],
        "ttft_p50_s": summary["ttft_p50_s"],
        "ttft_p90_s": summary["ttft_p90_s"],
        "ttft_p99_s": summary["ttft_p99_s"],
        "output_tok_s": summary["output_tok_s"],
        "agreement": agreement.token_fraction if agreement is not None else None,
        "server_cmd": server_cmd,
        "requests": [r.to_json() for r in records],
        "hit_rate_server": server.get("hit_rate"),
        "server_cached_tokens": server.get("cached_tokens"),
        "server_prompt_tokens": server.get("prompt_tokens"),
        "lost_hit_rate_server": server.get("lost_hit_rate"),
        "server_lost_hit_tokens": server.get("lost_hit_tokens"),
        "agreement_detail": agreement.to_json() if agreement is not None else None,
    }
    result.update({k: v for k, v in summary.items() if k not in result})
    result.update(extra)
    return result


def write_json(path: Path, doc: dict[str, Any]) -> None:
    """Replace ``path`` atomically, so a crash never leaves half a document."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(doc, f, indent=1)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{1000 * x:.0f}"


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


def _accept(arm: dict[str, Any]) -> str:
    """Speculative acceptance: output tokens per verify (accepted drafts + bonus), '-' without spec."""
    length = arm.get("spec_accept_length_mean")
    return "-" if length is None else f"{length:.2f}"


def format_table(arms: dict[str, dict[str, Any]], failed: dict[str, dict[str, Any]] | None = None) -> str:
    """Fixed-width table, one row per arm (failed arms last, with their reason). ``lost(srv)``: the prompt tokens
    whose KV matched where no mamba state was kept (recomputed), from the server's counter; the rest of an arm's
    shortfall to the ceiling is KV the cache no longer held."""
    header = ("arm", "hit", "ceiling", "hit(srv)", "lost(srv)", "ttft mean", "p50", "p90", "p99", "e2e mean",
              "out tok/s", "accept", "agree", "first diff", "ok/req")
    rows = [header, ("", "", "", "", "", "ms", "ms", "ms", "ms", "ms", "", "tok/ver", "", "", "")]
    for name, a in arms.items():
        detail = a.get("agreement_detail") or {}
        diff = detail.get("first_diff_rid")
        first = "-" if not detail else ("none" if diff is None else f"{diff}@{detail.get('first_diff_token')}")
        rows.append((name, _pct(a["hit_rate"]), _pct(a.get("ceiling_hit_rate")), _pct(a.get("hit_rate_server")),
                     _pct(a.get("lost_hit_rate_server")), _ms(a["ttft_mean_s"]),
                     _ms(a["ttft_p50_s"]), _ms(a["ttft_p90_s"]), _ms(a["ttft_p99_s"]), _ms(a.get("e2e_mean_s")),
                     _num(a["output_tok_s"]), _accept(a), _pct(a["agreement"]), first,
                     f"{a.get('requests_ok', '?')}/{a.get('requests_total', '?')}"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
             for r in rows]
    for name, f in (failed or {}).items():
        lines.append(f"{name}: FAILED: {f.get('error', '').splitlines()[0] if f.get('error') else '?'}")
    return "\n".join(lines)
