"""Two arms of `sglang-replayssm bench` against real SGLang servers on the tiny GDN model.

A two-turn RAG stream whose shared depths are off SGLang's 64-token state grid (a 200-token system
prompt, documents of 48-96 tokens): the baseline (SGLang's extra_buffer) loses part of every shared
prefix; the plugin (records, end states) hits each request's attention-only ceiling exactly.
Real servers on the CPU runtime (or a GPU): about three minutes.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from sglang_replayssm.bench import cli
from sglang_replayssm.bench.report import ARM_KEYS

pytestmark = [
    pytest.mark.server,
    pytest.mark.timeout(1800),
]


#: A two-turn RAG stream on tiny-gdn, ordered, one request at a time.
RAG_ARGS = ["--dataset-name", "rag", "--rag-num-docs", "2", "--rag-doc-len", "96", "--gsp-range-ratio", "0.5",
            "--rag-system-prompt-len", "200", "--rag-num-conversations", "4", "--rag-num-turns", "2",
            "--rag-question-len", "16", "--rag-output-len", "8", "--gsp-ordered", "--max-concurrency", "1",
            "--disable-tqdm"]


def _model() -> Path:
    from sglang_replayssm.models import DEFAULT_OUT, make_models

    return make_models(DEFAULT_OUT, names=["tiny-gdn"])["tiny-gdn"]


@pytest.fixture(scope="module")
def rag_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int, dict]:
    """The baseline and plugin arms on the RAG stream: (output dir, exit code, bench JSON)."""
    tmp_path = tmp_path_factory.mktemp("rag")
    out = tmp_path / "bench.json"
    rc = cli.main([
        "--model-path", str(_model()), *RAG_ARGS, "--arms", "baseline,plugin", "--json", str(out),
        "--plot-dir", str(tmp_path / "plots"), "--log-dir", str(tmp_path / "logs"),
    ])
    return tmp_path, rc, json.loads(out.read_text())


def test_baseline_and_plugin_on_tiny_gdn_rag(rag_run) -> None:
    tmp_path, rc, doc = rag_run
    assert rc == 0, doc.get("failed_arms") or doc.get("error")
    assert list(doc["arms"]) == ["baseline", "plugin"]
    for name, arm in doc["arms"].items():
        assert set(ARM_KEYS) <= set(arm), name
        assert arm["requests_failed"] == 0, name
        assert all(len(r["output_ids"]) == r["max_new_tokens"] for r in arm["requests"]), name
        assert arm["ttft_mean_s"] > 0 and arm["output_tok_s"] > 0, name
        assert arm["hit_rate"] > 0, name
        assert arm["hit_rate_server"] == pytest.approx(arm["hit_rate"], abs=0.01), name
        assert "--enable-metrics" in arm["server_cmd"], name
        assert Path(arm["log"]).is_file(), name
    base, plug = doc["arms"]["baseline"], doc["arms"]["plugin"]
    assert "--enable-linear-replayssm" in plug["server_cmd"]
    assert "--enable-linear-replayssm" not in base["server_cmd"]
    assert plug["agreement"] >= 0.99, plug["agreement_detail"]
    # The shared depths end off the 64-token grid and a first turn's end state is never tracked: the
    # baseline resumes from a grid depth at best; the plugin rebuilds the state at the exact depth
    # from records and keeps end states, so every request hits its attention-only ceiling.
    cached = {name: [r["cached_tokens"] for r in arm["requests"]] for name, arm in doc["arms"].items()}
    ceiling = [r["ceiling_tokens"] for r in plug["requests"]]
    assert cached["plugin"] == ceiling, (cached, ceiling)
    assert sum(cached["baseline"]) < sum(ceiling), (cached, ceiling)
    assert sorted(p.name for p in (tmp_path / "plots").iterdir()) == ["hit_rate.png", "ttft_cdf.png"]
    # the TTFT the plugin's hits allow at baseline's costs, over every request paired with baseline's (a slope
    # fitted on 8 small prompts is noise, so only the pairing is checked)
    found = doc["ttft_bound"]["plugin"]
    assert found["requests"] == len(plug["requests"]) and found["prefill_ratio"] < 1
    assert found["measured_ratio"] == pytest.approx(plug["ttft_mean_s"] / base["ttft_mean_s"])


def test_a_tiny_record_budget_falls_back_with_the_same_tokens(rag_run, tmp_path: Path, monkeypatch) -> None:
    """32 record slots: the shared prefixes' records are gone before they are needed, so hits fall
    back to the deepest state; every request is served with the tokens of the full-budget run."""
    _, _, doc = rag_run
    monkeypatch.setenv("SGLANG_REPLAYSSM_RECORD_TOKENS", "32")
    out = tmp_path / "tiny.json"
    rc = cli.main(["--model-path", str(_model()), *RAG_ARGS, "--arms", "plugin", "--json", str(out),
                   "--log-dir", str(tmp_path / "logs")])
    tiny_doc = json.loads(out.read_text())
    assert rc == 0, tiny_doc.get("failed_arms") or tiny_doc.get("error")

    def rebuilt(arm: dict) -> int:
        return sum(int(m) for m in re.findall(r"#mamba-rebuilt-token: (\d+)", Path(arm["log"]).read_text()))

    full_arm, tiny_arm = doc["arms"]["plugin"], tiny_doc["arms"]["plugin"]
    assert rebuilt(full_arm) > rebuilt(tiny_arm)
    full = {r["rid"]: r for r in full_arm["requests"]}
    tiny = {r["rid"]: r for r in tiny_arm["requests"]}
    assert sorted(full) == sorted(tiny)
    for rid, req in tiny.items():
        assert req["output_ids"] == full[rid]["output_ids"], rid
        assert req["cached_tokens"] <= full[rid]["cached_tokens"], rid
    assert sum(r["cached_tokens"] for r in tiny.values()) < sum(r["cached_tokens"] for r in full.values())
