"""Markdown tables of a serve_check.json document (serve_check.py)."""

from __future__ import annotations

from typing import Any


def _f(x: Any, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def _ratio(a: Any, b: Any) -> str:
    return f"{a / b:.2f}x" if a and b else "-"


def _ms(seconds: Any) -> str:
    return "-" if seconds is None else f"{1e3 * seconds:.1f}"


def _above(ttft: Any, floor: Any) -> float | None:
    """TTFT above the arm's fixed floor (a short uncached prompt's TTFT): what prefix hits can save."""
    return ttft - floor if ttft and floor and ttft > floor else None


def tables(doc: dict[str, Any]) -> str:
    arms = doc["arms"]
    out: list[str] = [f"model: {doc['model_path']}", ""]
    floors = {n: (a["stages"].get("main", {}).get("ttft_floor") or {}).get("ttft_p50_s") for n, a in arms.items()
              if "stages" in a}
    for ds in ("gsp", "rag", "gsp-long"):
        rows = {n: a["stages"]["main"][ds] for n, a in arms.items() if ds in a.get("stages", {}).get("main", {})}
        if not rows:
            continue
        base = rows.get("baseline", {})
        base_above = _above(base.get("ttft_p50_s"), floors.get("baseline"))
        out += [f"### main job: {ds}", "",
                "| arm | hit rate | ceiling | TTFT p50 (ms) | TTFT p90 (ms) | e2e p50 (ms) | TTFT p50 / baseline "
                "| floor (ms) | p50 above floor / baseline's | failed |", "|---|---|---|---|---|---|---|---|---|---|"]
        for n, r in rows.items():
            above = _above(r.get("ttft_p50_s"), floors.get(n))
            out.append(f"| {n} | {_f(r.get('hit_rate'), '.4f')} | {_f(r.get('ceiling_hit_rate'), '.4f')} | "
                       f"{_f(r['ttft_p50_s'] and 1e3 * r['ttft_p50_s'], '.1f')} | "
                       f"{_f(r['ttft_p90_s'] and 1e3 * r['ttft_p90_s'], '.1f')} | "
                       f"{_f(r['e2e_p50_s'] and 1e3 * r['e2e_p50_s'], '.1f')} | "
                       f"{_ratio(r.get('ttft_p50_s'), base.get('ttft_p50_s'))} | "
                       f"{_ms(floors.get(n))} | {_ratio(above, base_above)} | "
                       f"{r.get('requests_failed')} |")
        out.append("")
    kl = {n: a["stages"]["kl"] for n, a in arms.items() if "kl" in a.get("stages", {})}
    if kl:
        out += ["### teacher-forced KL against a cold prefill", "",
                "| arm | scenario | tokens | KL | p50 abs dlp | p95 abs dlp | max abs dlp | hits at depth | rebuilt hits "
                "| loaded back | retracted |",
                "|---|---|---|---|---|---|---|---|---|---|---|"]
        for n, sc in kl.items():
            for s, r in sc.items():
                out.append(f"| {n} | {s} | {r['tokens']} | {r['kl']:.3g} | {r['dlp_p50']:.3g} | {r['dlp_p95']:.3g} | "
                           f"{r['dlp_max']:.3g} | {r['hit_at_expected']}/{r['probes']} | "
                           f"{_f(r.get('replayssm_record_rebuilt_hits_total'), '.0f')} | "
                           f"{_f(r.get('load_back_tokens_total'), '.0f')} | "
                           f"{_f(r.get('num_retracted_requests_total'), '.0f')} |")
        out.append("")
    dec = {n: a["stages"]["decode"] for n, a in arms.items() if "decode" in a.get("stages", {})}
    if dec:
        base = {d["concurrency"]: d for d in dec.get("baseline", [])}
        out += ["### decode throughput", "",
                "| arm | concurrent | output tok/s | / baseline | step p50 (ms) | step p90 (ms) | log lines |",
                "|---|---|---|---|---|---|---|"]
        for n, ds in dec.items():
            for d in ds:
                b = base.get(d["concurrency"], {})
                out.append(f"| {n} | {d['concurrency']} | {d['output_tok_s']:.0f} | "
                           f"{_ratio(d['output_tok_s'], b.get('output_tok_s'))} | {d['step_ms_p50']:.2f} | "
                           f"{d['step_ms_p90']:.2f} | {d['step_lines']} |")
        out.append("")
    out.append(profile_table(doc))
    for n, a in arms.items():
        if a.get("error"):
            out.append(f"- {n} failed: {a['error'].splitlines()[0][:300]}")
    if doc.get("skipped"):
        out.append(f"- skipped (budget): {', '.join(doc['skipped'])}")
    return "\n".join(out) + "\n"


def profile_table(doc: dict[str, Any]) -> str:
    prof = {n: a["stages"]["profile"] for n, a in doc["arms"].items() if "profile" in a.get("stages", {})}
    if not prof:
        return ""
    fams = sorted({f for p in prof.values() for f in p.get("family_us_per_step", {})})
    out = ["### one decode step, by kernel family (us per step)", "",
           "| arm | " + " | ".join(fams) + " | total | linear share | host syncs / step |",
           "|---" * (len(fams) + 4) + "|"]
    for n, p in prof.items():
        if "error" in p:
            out.append(f"| {n} | {p['error']} |")
            continue
        f = p["family_us_per_step"]
        out.append(f"| {n} | " + " | ".join(f"{f.get(x, 0.0):.0f}" for x in fams) +
                   f" | {p['kernel_us_per_step']:.0f} | {p['linear_share']:.2f} | "
                   f"{sum(p['host_syncs_per_step'].values()):.1f} |")
    return "\n".join(out) + "\n"
