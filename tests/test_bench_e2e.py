"""Two arms of `sglang-replayssm bench` against real SGLang servers on the tiny GDN model.

Real servers on the CPU runtime (or a GPU): about two minutes.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sglang_replayssm.bench import cli
from sglang_replayssm.bench.report import ARM_KEYS

pytestmark = [
    pytest.mark.server,
    pytest.mark.timeout(1800),
]


def test_baseline_and_plugin_on_tiny_gdn(tmp_path: Path) -> None:
    from sglang_replayssm.models import DEFAULT_OUT, make_models

    model = make_models(DEFAULT_OUT, names=["tiny-gdn"])["tiny-gdn"]
    out = tmp_path / "bench.json"
    rc = cli.main([
        "--model-path", str(model), "--arms", "baseline,plugin", "--json", str(out),
        "--plot-dir", str(tmp_path / "plots"), "--log-dir", str(tmp_path / "logs"),
        "--gsp-num-groups", "2", "--gsp-prompts-per-group", "2", "--gsp-system-prompt-len", "256",
        "--gsp-question-len", "16", "--gsp-output-len", "8", "--gsp-ordered", "--max-concurrency", "1",
        "--disable-tqdm",
    ])
    doc = json.loads(out.read_text())
    assert rc == 0, doc.get("failed_arms") or doc.get("error")
    assert list(doc["arms"]) == ["baseline", "plugin"]
    for name, arm in doc["arms"].items():
        assert set(ARM_KEYS) <= set(arm), name
        assert arm["requests_failed"] == 0, name
        assert all(len(r["output_ids"]) == 8 for r in arm["requests"]), name
        assert arm["ttft_mean_s"] > 0 and arm["output_tok_s"] > 0, name
        # Ordered, one request at a time: the second prompt of each group can reuse the system prompt.
        assert arm["hit_rate"] > 0, name
        assert arm["hit_rate_server"] == pytest.approx(arm["hit_rate"], abs=0.01), name
        assert "--enable-metrics" in arm["server_cmd"], name
        assert Path(arm["log"]).is_file(), name
    base, plug = doc["arms"]["baseline"], doc["arms"]["plugin"]
    assert "--enable-linear-replayssm" in plug["server_cmd"]
    assert "--enable-linear-replayssm" not in base["server_cmd"]
    assert plug["hit_rate"] >= base["hit_rate"] - 0.005
    assert plug["agreement"] >= 0.99, plug["agreement_detail"]
    assert sorted(p.name for p in (tmp_path / "plots").iterdir()) == ["hit_rate.png", "ttft_cdf.png"]
