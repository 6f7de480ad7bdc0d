"""`sglang-replayssm bench` end to end with stand-in servers: outputs, error paths, partial results."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from sglang_replayssm.bench import cli, launch
from sglang_replayssm.bench.arms import Arm, merge_flags
from tests.support import fake_server
from tests.support.fake_server import FakeServer, write_fake_model_dir

SMALL = ["--gsp-num-groups", "2", "--gsp-prompts-per-group", "2", "--gsp-system-prompt-len", "24",
         "--gsp-question-len", "4", "--gsp-output-len", "3", "--disable-tqdm"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_fake_model_dir(tmp_path_factory.mktemp("model") / "hybrid", 300)


def read(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def test_unreachable_url_is_one_clear_message_and_nonzero(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "r.json"
    rc = cli.main(["--url", "http://127.0.0.1:9", "--json", str(out), *SMALL])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc != 0
    assert len(err) == 1 and err[0].startswith("error: cannot reach an SGLang server at http://127.0.0.1:9")
    doc = read(out)
    assert doc["arms"] == {} and "cannot reach" in doc["error"]


def test_model_without_linear_attention_is_refused_before_any_server(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    plain = write_fake_model_dir(tmp_path / "plain", 100, linear=False)

    def no_launch(*a: object, **k: object) -> list[str]:
        raise AssertionError("a server was about to be launched")

    monkeypatch.setattr(launch, "server_command", no_launch)
    rc = cli.main(["--model-path", str(plain), "--json", str(tmp_path / "r.json"), *SMALL])
    err = capsys.readouterr().err
    assert rc == 2
    assert "no linear-attention" in err and err.count("\n") == 1
    assert "linear-attention" in read(tmp_path / "r.json")["error"]


def test_model_without_linear_attention_is_refused_with_url_too(tmp_path: Path) -> None:
    plain = write_fake_model_dir(tmp_path / "plain", 100, linear=False)
    with FakeServer(model_path=str(plain)) as url:
        assert cli.main(["--url", url, *SMALL]) == 2


@pytest.mark.parametrize("argv", [["--arms", "baseline,turbo"], ["--gsp-zipf-alpha", "1.0"],
                                  ["--gsp-num-groups", "0"], ["--no-such-flag"]])
def test_bad_arguments_exit_nonzero(argv: list[str], model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(launch, "server_command", lambda *a, **k: pytest.fail("no server expected"))
    assert cli.main(["--model-path", str(model_dir), *SMALL, *argv]) != 0


def test_url_run_writes_table_json_and_plots(model_dir: Path, tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    with FakeServer(model_path=str(model_dir), vocab_size=300) as url:
        rc = cli.main(["--url", url, "--arms", "mine", "--json", str(tmp_path / "r.json"),
                       "--plot-dir", str(tmp_path / "plots"), "--gsp-ordered", "--max-concurrency", "1", *SMALL])
    stdout = capsys.readouterr().out
    assert rc == 0
    assert any(line.startswith("mine ") for line in stdout.splitlines())
    doc = read(tmp_path / "r.json")
    arm = doc["arms"]["mine"]
    assert doc["arm_order"] == ["mine"] and doc["failed_arms"] == {}
    assert doc["workload"]["requests"] == 4
    assert len(arm["requests"]) == 4
    # Ordered, one at a time, ideal cache: the second prompt of each group hits its 24-token system prompt.
    assert arm["hit_rate"] == pytest.approx(2 * 24 / (4 * 28))
    assert arm["hit_rate_server"] == pytest.approx(arm["hit_rate"])
    # The fake server is an ideal token-granular cache: every request hits exactly its ceiling.
    assert arm["ceiling_hit_rate"] == pytest.approx(arm["hit_rate"])
    assert [r["ceiling_tokens"] for r in arm["requests"]] == [r["cached_tokens"] for r in arm["requests"]]
    assert any(line.split()[:3] == ["arm", "hit", "ceiling"] for line in stdout.splitlines())
    assert arm["agreement"] == 1.0 and arm["server_cmd"] is None
    assert all(len(r["output_ids"]) == 3 for r in arm["requests"])
    assert sorted(p.name for p in (tmp_path / "plots").iterdir()) == ["hit_rate.png", "ttft_cdf.png"]


def fake_server_command(fail: set[str], crash: frozenset[str] = frozenset()) -> Any:
    """Stand-in for arms.server_command: the fake server, salted per arm so outputs differ by arm."""
    def command(arm: Arm, model_path: Path, port: int, **_: object) -> list[str]:
        if arm.name in fail:
            return [sys.executable, "-c", f"import sys; print('cannot start {arm.name}'); sys.exit(1)"]
        salt = "" if arm.name != "plugin" else "diverge"
        return [sys.executable, fake_server.__file__, "--port", str(port),
                "--model-path", str(model_path), "--vocab-size", "300", "--salt", salt,
                "--mamba-radix-cache-strategy", "x", *(["--exit-on-generate"] if arm.name in crash else [])]
    return command


def test_launched_arms_failed_arm_and_agreement(model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(launch, "server_command", fake_server_command(fail={"upstream"}))
    out = tmp_path / "r.json"
    rc = cli.main(["--model-path", str(model_dir), "--device", "cpu", "--json", str(out),
                   "--arms", "baseline,upstream,plugin", *SMALL])
    captured = capsys.readouterr()
    assert rc == 1
    failures = [line for line in captured.err.splitlines() if line.startswith("error:")]
    assert len(failures) == 1 and "upstream" in failures[0] and "exited with code 1" in failures[0]
    doc = read(out)
    assert doc["arm_order"] == ["baseline", "upstream", "plugin"]
    assert set(doc["arms"]) == {"baseline", "plugin"}
    assert "cannot start upstream" in doc["failed_arms"]["upstream"]["error"]
    base, plug = doc["arms"]["baseline"], doc["arms"]["plugin"]
    assert base["agreement"] == 1.0
    assert plug["agreement"] < 1.0
    assert plug["agreement_detail"]["reference"] == "baseline"
    assert plug["agreement_detail"]["first_diff_rid"] == "0.0"
    for name, arm in doc["arms"].items():
        assert "SGLANG_PLUGINS=replayssm_cpu,replayssm_radix " in arm["server_cmd"]
        # no launcher environment: the package sets the CPU runtime's variables in the server itself
        assert "SGLANG_USE_CPU_ENGINE" not in arm["server_cmd"] and "TRITON_INTERPRET" not in arm["server_cmd"]
        assert f"[{name}] server: {arm['server_cmd']}" in captured.out
        saved = (tmp_path / "r-logs" / f"server-{name}.cmd").read_text().strip()
        assert saved == arm["server_cmd"]
        assert Path(arm["log"]).is_file()
    assert "upstream: FAILED" in captured.out


def test_arms_that_ran_survive_an_interrupt(model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import sglang_replayssm.bench.runner as runner

    monkeypatch.setattr(launch, "server_command", fake_server_command(fail=set()))
    real = runner.run_arm
    calls = []

    def run_then_interrupt(*a: Any, **k: Any) -> Any:
        calls.append(k["label"])
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(runner, "run_arm", run_then_interrupt)
    out = tmp_path / "r.json"
    rc = cli.main(["--model-path", str(model_dir), "--device", "cpu", "--json", str(out), "--arms",
                   "plugin,baseline", *SMALL])
    assert rc == 130
    doc = read(out)
    assert set(doc["arms"]) == {"plugin"} and doc["error"] == "interrupted"


def test_server_crash_during_the_run_reports_the_log_tail(model_dir: Path, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(launch, "server_command", fake_server_command(fail=set(), crash=frozenset({"plugin"})))
    out = tmp_path / "r.json"
    rc = cli.main(["--model-path", str(model_dir), "--device", "cpu", "--json", str(out), "--arms",
                   "baseline,plugin", *SMALL])
    assert rc == 1
    err = capsys.readouterr().err
    assert "arm plugin failed" in err and "simulated crash" in err and "exited with code 3" in err
    doc = read(out)
    assert set(doc["arms"]) == {"baseline"}
    assert "simulated crash" in doc["failed_arms"]["plugin"]["error"]


def test_spec_acceptance_reaches_the_table_and_json(model_dir: Path, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """A server that reports SGLang's spec meta_info (4 tokens per verify): 9 output tokens = 1 from
    prefill + 2 verifies (4 + 4), 6 accepted drafts; a server without spec shows '-' / None."""
    argv = [*SMALL[:-3], "--gsp-output-len", "9", "--disable-tqdm", "--gsp-ordered"]
    for label, per_verify in (("spec", 4), ("plain", 0)):
        with FakeServer(model_path=str(model_dir), vocab_size=300, spec_tokens_per_verify=per_verify) as url:
            assert cli.main(["--url", url, "--arms", label, "--json", str(tmp_path / f"{label}.json"), *argv]) == 0
    table = {line.split()[0]: line.split() for line in capsys.readouterr().out.splitlines() if line.strip()}
    spec, plain = read(tmp_path / "spec.json")["arms"]["spec"], read(tmp_path / "plain.json")["arms"]["plain"]
    assert [(r["spec_verify_ct"], r["spec_correct_drafts"]) for r in spec["requests"]] == [(2, 6)] * 4
    assert spec["spec_accept_length_mean"] == pytest.approx(4.5)
    assert spec["spec_accepted_drafts_mean"] == pytest.approx(3.0)
    assert plain["spec_accept_length_mean"] is None and plain["spec_accepted_drafts_mean"] is None
    assert table["arm"][-5:-3] == ["accept", "agree"]  # rows end: accept, agree, first diff, ok/req
    assert table["spec"][-4] == "4.50" and table["plain"][-4] == "-"


def _mtp_model_dir(path: Path, name: str) -> Path:
    model = write_fake_model_dir(path, 2048)
    (model / "replayssm-model.json").write_text(json.dumps({"name": name}))
    return model


def test_mtp_fit_workload_sends_the_fitted_prompts(tmp_path: Path) -> None:
    from sglang_replayssm.models.mtp import FIT_PER_GROUP, FIT_PREFIX, fit_prompts
    from sglang_replayssm.models.specs import SPECS

    model = _mtp_model_dir(tmp_path / "tiny", "tiny-gdn")
    with FakeServer(model_path=str(model), vocab_size=2048) as url:
        rc = cli.main(["--url", url, "--dataset-name", "mtp-fit", "--gsp-output-len", "5", "--gsp-ordered",
                       "--json", str(tmp_path / "r.json"), "--disable-tqdm"])
    assert rc == 0
    arm = read(tmp_path / "r.json")["arms"]["url"]
    prompts = fit_prompts(SPECS["tiny-gdn"], 2048)
    assert [r["prompt_tokens"] for r in arm["requests"]] == [len(p) for p in prompts]
    # ordered, ideal cache: every prompt but a group's first hits the group's shared prefix
    shared = (len(prompts) - len(prompts) // FIT_PER_GROUP) * FIT_PREFIX
    assert arm["hit_rate"] == pytest.approx(shared / sum(len(p) for p in prompts))


@pytest.mark.parametrize("name", ["small-gdn", "someone-elses"])
def test_mtp_fit_workload_refuses_a_model_without_a_fitted_mtp_layer(
        name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(launch, "server_command", lambda *a, **k: pytest.fail("no server expected"))
    model = _mtp_model_dir(tmp_path / "m", name)
    rc = cli.main(["--model-path", str(model), "--dataset-name", "mtp-fit", "--json", str(tmp_path / "r.json")])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "needs an embedded model with a fitted MTP layer (tiny-gdn)" in err


def test_merge_flags_keeps_every_value_of_a_flag_and_drops_overridden_flags_whole() -> None:
    base = ["--cuda-graph-bs-decode", "64", "256", "--mem-fraction-static", "0.4"]
    extra = ["--max-running-requests", "256", "--cuda-graph-bs-decode", "1", "2", "4", "--enable-metrics",
             "--mem-fraction-static=0.85", "--chunked-prefill-size", "8192"]
    assert merge_flags(base, extra) == [*base, "--max-running-requests", "256", "--enable-metrics",
                                        "--chunked-prefill-size", "8192"]


def test_paired_arms_run_side_by_side_one_request_at_a_time(model_dir: Path, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """Both servers up at once; every request goes to each arm in turn (order rotating) before the next one; the
    arms' results as sequential arms have them, plus the per-request TTFT difference to the first arm."""
    monkeypatch.setattr(launch, "server_command", fake_server_command(fail={"upstream"}))
    out = tmp_path / "p.json"
    rc = cli.main(["--model-path", str(model_dir), "--device", "cpu", "--json", str(out), "--paired",
                   "--arms", "baseline,upstream,plugin", "--gsp-num-turns", "2", *SMALL])
    assert rc == 1  # upstream did not start; the other two ran paired
    doc, text = read(out), capsys.readouterr().out
    assert set(doc["arms"]) == {"baseline", "plugin"} and "upstream" in doc["failed_arms"]
    base, plug = doc["arms"]["baseline"]["requests"], doc["arms"]["plugin"]["requests"]
    assert [r["rid"] for r in base] == [r["rid"] for r in plug] and len(base) == 8
    assert [r["turn"] for r in base] == [0, 0, 0, 0, 1, 1, 1, 1]  # every first turn, then every second
    starts = sorted((r["start_s"], arm, r["rid"]) for arm, reqs in (("b", base), ("p", plug)) for r in reqs)
    assert [rid for _, _, rid in starts][::2] == [r["rid"] for r in base]  # request k on both arms before k + 1
    assert [arm for _, arm, _ in starts][:4] == ["b", "p", "p", "b"]  # the order rotates
    assert doc["arms"]["plugin"]["hit_rate"] == doc["arms"]["baseline"]["hit_rate"] > 0  # the same ideal cache
    paired = doc["arms"]["plugin"]["paired"]
    assert paired["all"]["n"] == 7 and paired["same_hit"]["n"] == 7
    assert doc["arms"]["baseline"]["paired"]["all"]["p50_ms"] == 0.0
    assert "plugin     TTFT - first arm per request: p50" in text


@pytest.mark.parametrize("extra", [["--url", "http://127.0.0.1:9"], ["--max-concurrency", "2"],
                                   ["--request-rate", "5"]])
def test_paired_refuses_what_cannot_be_sent_one_request_at_a_time(model_dir: Path, extra: list[str],
                                                                 monkeypatch: pytest.MonkeyPatch,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(launch, "server_command", lambda *a, **k: pytest.fail("no server expected"))
    assert cli.main(["--model-path", str(model_dir), "--paired", *extra, *SMALL]) == 2
    assert "--paired sends one request at a time" in capsys.readouterr().err
