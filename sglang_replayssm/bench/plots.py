"""PNG plots of a finished benchmark: TTFT CDF per arm, prefix hit rate per arm."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_ttft_cdf(arms: dict[str, dict[str, Any]], path: Path) -> Path:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, arm in arms.items():
        ttft = sorted(r["ttft_s"] for r in arm["requests"] if r.get("error") is None and r.get("ttft_s") is not None)
        if ttft:
            ys = [(i + 1) / len(ttft) for i in range(len(ttft))]
            ax.step([1000 * t for t in ttft], ys, where="post", label=name)
    ax.set_xlabel("time to first token (ms)")
    ax.set_ylabel("fraction of requests")
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3)
    ax.legend()
    ax.set_title("TTFT CDF per arm")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_hit_rate(arms: dict[str, dict[str, Any]], path: Path) -> Path:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    names = list(arms)
    client = [100 * (arms[n]["hit_rate"] or 0.0) for n in names]
    server = [100 * (arms[n].get("hit_rate_server") or 0.0) for n in names]
    xs = range(len(names))
    width = 0.38
    ax.bar([x - width / 2 for x in xs], client, width, label="client (sum cached_tokens / prompt)")
    ax.bar([x + width / 2 for x in xs], server, width, label="server /metrics")
    for x, v in zip(xs, client):
        ax.annotate(f"{v:.1f}%", (x - width / 2, v), ha="center", va="bottom", fontsize=8)
    # The attention-only ceiling of each arm's own run (bench/ceiling.py): a line across its bars.
    ceilings = [(x, 100 * arms[n]["ceiling_hit_rate"]) for x, n in zip(xs, names)
                if arms[n].get("ceiling_hit_rate") is not None]
    for i, (x, c) in enumerate(ceilings):
        ax.hlines(c, x - width, x + width, colors="black", linestyles="dashed",
                  label="attention-only ceiling" if i == 0 else None)
    ax.set_xticks(list(xs), names)
    ax.set_ylabel("prefix hit rate (%)")
    ax.set_ylim(0, 105)
    ax.legend(fontsize=8)
    ax.set_title("Prefix hit rate per arm")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def write_plots(arms: dict[str, dict[str, Any]], plot_dir: Path) -> list[Path]:
    plot_dir.mkdir(parents=True, exist_ok=True)
    if not arms:
        return []
    return [plot_ttft_cdf(arms, plot_dir / "ttft_cdf.png"), plot_hit_rate(arms, plot_dir / "hit_rate.png")]
