"""rag-mem at several cache sizes: per size, every arm's slots, KV tokens and hit rate, and each arm's TTFT against
the reference arm's beside what its hits allow (:mod:`sglang_replayssm.bench.ttft_bound`).

    PYTHONPATH=. python lab/scripts/bench_mem_sweep.py --mib 30,33,36,39,42 --out out/mem-sweep
    PYTHONPATH=. python lab/scripts/bench_mem_sweep.py --from-notes notes/bench-mem-rows-2026-12-05.json \
        --key "memory sweep" --out out/mem-sweep      # the table and plot of runs already made

Per size M: ``sglang-replayssm bench --dataset-name rag-mem --paired --arms A --equal-memory-mib M --json
OUT/M.json`` (extra bench flags after ``--``), one size after another. Then the table, ``OUT/sweep.json`` (its rows)
and ``OUT/hit_vs_mib.png`` (hit rate per arm against the cache bytes, the ceiling dashed). One size says little:
the hit rate of a cache smaller than its working set is not monotonic in the bytes.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root

from sglang_replayssm.bench.ttft_bound import bounds  # noqa: E402


def sweep_row(mib: float, doc: dict[str, Any], ref: str) -> dict[str, Any]:
    """One size's row from its bench JSON: per arm slots, KV tokens, hit rate and ceiling; per arm besides ``ref``
    its mean TTFT over ``ref``'s and the ratio its hits allow (None where the fit is not possible)."""
    arms, sized = doc["arms"], doc.get("equal_memory", {}).get("arms", {})
    if ref not in arms:
        raise ValueError(f"{mib:g} MiB: no {ref!r} arm to compare with (arms: {', '.join(arms) or 'none'})")
    allowed = bounds(arms, ref)
    row: dict[str, Any] = {"mib": mib, "arms": {}}
    for name, arm in arms.items():
        size = sized.get(name, {})
        row["arms"][name] = {
            "state_slots": size.get("state_slots"), "kv_tokens": size.get("kv_tokens"), "hit_rate": arm["hit_rate"],
            "ceiling": arm.get("ceiling_hit_rate"),
            "ttft_ratio": None if name == ref else arm["ttft_mean_s"] / arms[ref]["ttft_mean_s"],
            "ttft_bound": allowed[name]["bound_ratio"] if name in allowed else None}
    return row


def _ratio(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}x"


def format_rows(rows: list[dict[str, Any]], ref: str) -> str:
    """The table: one line per size and arm, sizes ascending."""
    lines = [f"{'MiB':>5} {'arm':<12} {'slots':>5} {'KV tok':>8} {'hit':>7} {'ceiling':>8} "
             f"{'TTFT / ' + ref:>18} {'hits allow':>11}"]
    for row in sorted(rows, key=lambda r: r["mib"]):
        for name, a in row["arms"].items():
            ceiling = "-" if a["ceiling"] is None else f"{a['ceiling']:.1%}"
            lines.append(f"{row['mib']:>5g} {name:<12} {a['state_slots'] or '-':>5} {a['kv_tokens'] or 0:>8,} "
                         f"{a['hit_rate']:>7.1%} {ceiling:>8} {_ratio(a['ttft_ratio']):>18} "
                         f"{_ratio(a['ttft_bound']):>11}")
    return "\n".join(lines)


def plot(rows: list[dict[str, Any]], path: Path) -> Path:
    """Hit rate per arm against the cache bytes; the first arm's ceiling dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = sorted(rows, key=lambda r: r["mib"])
    fig, ax = plt.subplots(figsize=(6, 4))
    names = list(rows[0]["arms"])
    for name in names:
        pts = [(r["mib"], r["arms"][name]["hit_rate"] * 100) for r in rows if name in r["arms"]]
        ax.plot(*zip(*pts), marker="o", label=name)
    ceiling = [(r["mib"], r["arms"][names[0]]["ceiling"] * 100) for r in rows
               if r["arms"][names[0]]["ceiling"] is not None]
    if ceiling:
        ax.plot(*zip(*ceiling), linestyle="--", color="grey", label="ceiling (attention-only, unbounded)")
    ax.set_xlabel("cache bytes per arm (MiB)")
    ax.set_ylabel("prefix hit rate (%)")
    ax.set_ylim(0, 100)
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _run(mib: float, arms: str, out: Path, extra: list[str]) -> dict[str, Any]:
    from sglang_replayssm.bench.cli import main as bench

    path = out / f"{mib:g}.json"
    rc = bench(["--dataset-name", "rag-mem", "--paired", "--arms", arms, "--equal-memory-mib", f"{mib:g}",
                "--json", str(path), "--log-dir", str(out / f"logs-{mib:g}"), "--disable-tqdm", *extra])
    if rc != 0:
        raise SystemExit(f"error: the bench at {mib:g} MiB exited {rc}; its JSON: {path}")
    return json.loads(path.read_text())


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mib", default="30,33,36,39,42", help="cache sizes per arm, comma-separated")
    ap.add_argument("--arms", default="baseline,plugin", help="the first is the reference")
    ap.add_argument("--out", type=Path, default=Path("out/mem-sweep"))
    ap.add_argument("--from-notes", type=Path, default=None,
                    help="no runs: a notes JSON whose --key entry maps 'M MiB' to bench JSONs")
    ap.add_argument("--key", default="memory sweep", help="with --from-notes: the first key starting with this")
    args = ap.parse_args(argv)
    ref = args.arms.split(",")[0]
    args.out.mkdir(parents=True, exist_ok=True)
    if args.from_notes is not None:
        notes = json.loads(args.from_notes.read_text())
        entry = notes[next(k for k in notes if k.startswith(args.key))]
        docs = {float(k.split()[0]): v for k, v in entry.items()}
    else:
        docs = {m: _run(m, args.arms, args.out, extra) for m in (float(x) for x in args.mib.split(",") if x)}
    rows = [sweep_row(m, doc, ref) for m, doc in docs.items()]
    print(format_rows(rows, ref))
    (args.out / "sweep.json").write_text(json.dumps(rows, indent=1) + "\n")
    print(f"plot: {plot(rows, args.out / 'hit_vs_mib.png')}\njson: {args.out / 'sweep.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
