"""JSON schema of an arm, atomic JSON writes, the stdout table and the plots."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sglang_replayssm.bench.metrics import agreement, summarize
from sglang_replayssm.bench.records import RequestRecord
from sglang_replayssm.bench.report import ARM_KEYS, arm_result, format_table, write_json

REQUIRED = {"hit_rate", "ttft_mean_s", "ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "output_tok_s", "agreement",
            "server_cmd", "requests"}


def records(outputs: list[list[int]]) -> list[RequestRecord]:
    return [RequestRecord(f"{i}.0", i, 0, 0, prompt_tokens=100, cached_tokens=50 * (i > 0),
                          completion_tokens=len(out), ttft_s=0.1 * (i + 1), e2e_s=1.0, output_ids=out)
            for i, out in enumerate(outputs)]


def test_arm_result_has_the_required_keys_and_json_round_trips(tmp_path: Path) -> None:
    ref = records([[1, 2], [3, 4], [5, 6]])
    mine = records([[1, 2], [3, 0], [5, 6]])
    res = arm_result(summarize(mine, 2.0), {"hit_rate": 0.3, "cached_tokens": 90.0, "prompt_tokens": 300.0},
                     agreement("baseline", ref, mine), "python -m sglang.launch_server ...", mine, log="x.log")
    assert set(ARM_KEYS) == REQUIRED
    assert REQUIRED <= set(res)
    path = tmp_path / "out" / "r.json"
    write_json(path, {"arms": {"plugin": res}})
    back = json.loads(path.read_text())["arms"]["plugin"]
    assert back["hit_rate"] == pytest.approx(100 / 300)
    assert back["hit_rate_server"] == 0.3
    assert back["agreement"] == pytest.approx(5 / 6)
    assert back["agreement_detail"]["first_diff_rid"] == "1.0"
    assert back["ttft_p50_s"] == pytest.approx(0.2)
    assert back["server_cmd"].startswith("python -m sglang.launch_server")
    assert [RequestRecord.from_json(r) for r in back["requests"]] == mine
    assert back["log"] == "x.log"
    assert list(path.parent.iterdir()) == [path]  # no temporary file left behind


def test_write_json_keeps_the_old_file_when_serialisation_fails(tmp_path: Path) -> None:
    path = tmp_path / "r.json"
    write_json(path, {"arms": {"a": 1}})
    with pytest.raises(TypeError):
        write_json(path, {"arms": {"a": object()}})
    assert json.loads(path.read_text()) == {"arms": {"a": 1}}
    assert list(tmp_path.iterdir()) == [path]


def test_table_lists_arms_and_failures() -> None:
    ref = records([[1], [2]])
    res = arm_result(summarize(ref, 1.0), {}, agreement("baseline", ref, ref), "cmd", ref, ceiling_hit_rate=0.5)
    table = format_table({"baseline": res}, {"upstream": {"error": "server exited with code 1\nlog tail"}})
    lines = table.splitlines()
    assert lines[0].split()[:5] == ["arm", "hit", "ceiling", "hit(srv)", "lost(srv)"]
    row = next(line for line in lines if line.startswith("baseline"))
    assert "25.0%" in row and "50.0%" in row and "100.0%" in row and "none" in row and "2/2" in row
    assert row.split()[3:5] == ["-", "-"]  # no server counters: unknown, not zero
    assert lines[-1] == "upstream: FAILED: server exited with code 1"
    server = {"hit_rate": 0.25, "lost_hit_rate": 0.125, "lost_hit_tokens": 3.0}
    res = arm_result(summarize(ref, 1.0), server, None, "cmd", ref)
    assert res["lost_hit_rate_server"] == 0.125 and res["server_lost_hit_tokens"] == 3.0
    row = format_table({"plugin": res}).splitlines()[2]
    assert row.split()[3:5] == ["25.0%", "12.5%"]


def test_plots_are_written(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from sglang_replayssm.bench.plots import write_plots

    ref = records([[1], [2], [3]])
    arms = {name: arm_result(summarize(ref, 1.0), {"hit_rate": 0.2}, None, None, ref)
            for name in ("baseline", "plugin")}
    paths = write_plots(json.loads(json.dumps(arms)), tmp_path / "plots")
    assert [p.name for p in paths] == ["ttft_cdf.png", "hit_rate.png"]
    for p in paths:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
