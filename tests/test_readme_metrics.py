"""README's Metrics section names only metrics the plugin exports (radix/metrics.py), so the doc stays true."""

from __future__ import annotations

import re
from pathlib import Path

from sglang_replayssm.radix import metrics

README = Path(__file__).resolve().parents[1] / "README.md"


def _exported() -> set[str]:
    """The suffixes after ``sglang:replayssm_`` of every counter and gauge the plugin registers."""
    names = {v for k, v in vars(metrics).items() if k.endswith("PROMETHEUS_NAME") and isinstance(v, str)}
    names |= {metrics.GAUGE_PREFIX + g for g in metrics.GAUGES}
    return {n.removeprefix(metrics.GAUGE_PREFIX) for n in names}


def test_every_metric_the_readme_names_is_exported():
    text = README.read_text()
    section = text.split("## Metrics", 1)[1].split("\n## ", 1)[0]
    named = {re.sub(r"\{.*\}$", "", m) for m in re.findall(r"`([a-z_]+(?:_total|_bytes)(?:\{kind\})?)`", section)}
    assert len(named) >= 8, named  # the section lists the counters
    assert named <= _exported(), sorted(named - _exported())
