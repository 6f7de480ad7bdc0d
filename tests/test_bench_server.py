"""Server subprocess lifecycle and each arm's launch command/environment."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from sglang_replayssm.bench.arms import (
    ARMS,
    command_line,
    common_flags,
    parse_arms,
    server_command,
    server_env,
)
from sglang_replayssm.bench.server import ServerProcess, ServerStartError, _group_alive, pick_port, probe
from sglang_replayssm.cpu.launch import cpu_server_args
from tests.support import fake_server


def flag_value(cmd: list[str], flag: str) -> str | None:
    return cmd[cmd.index(flag) + 1] if flag in cmd else None


def test_server_process_becomes_healthy_and_is_stopped(tmp_path: Path) -> None:
    port = pick_port()
    cmd = [sys.executable, fake_server.__file__, "--port", str(port)]
    srv = ServerProcess(cmd, dict(os.environ), tmp_path / "s.log", f"http://127.0.0.1:{port}", 60,
                        poll_s=0.2)
    with srv:
        assert srv.startup_s is not None
        assert probe(srv.base_url + "/health", 5)[0]
        pid = srv.proc.pid if srv.proc else -1
    assert srv.proc is None
    assert not _group_alive(pid)
    assert not probe(f"http://127.0.0.1:{port}/health", 2)[0]
    assert (tmp_path / "s.log").read_text().startswith("$ ")


def test_picked_ports_are_free_and_outside_the_ephemeral_range() -> None:
    """Ports come from below the kernel's ephemeral range (where outgoing connections take theirs), bindable,
    and drawn at random (two pickers rarely meet)."""
    import socket

    from sglang_replayssm.bench.server import PORT_RANGE, _ephemeral_range

    lo, hi = _ephemeral_range()
    ports = [pick_port() for _ in range(20)]
    assert all(PORT_RANGE[0] <= p < PORT_RANGE[1] and not lo <= p <= hi for p in ports)
    assert len(set(ports)) > 10
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", ports[0]))


def test_server_that_exits_reports_code_and_log_tail(tmp_path: Path) -> None:
    cmd = [sys.executable, "-c", "import sys; print('ValueError: no linear layers here'); sys.exit(3)"]
    with pytest.raises(ServerStartError) as info:
        with ServerProcess(cmd, {}, tmp_path / "s.log", f"http://127.0.0.1:{pick_port()}", 60, poll_s=0.1):
            pass
    msg = str(info.value)
    assert "exited with code 3" in msg
    assert "no linear layers here" in msg
    assert str(tmp_path / "s.log") in msg


def test_server_that_never_answers_times_out_and_its_process_group_is_killed(tmp_path: Path) -> None:
    code = ("import subprocess, sys, time; "
            "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)']); time.sleep(120)")
    srv = ServerProcess([sys.executable, "-c", code], {}, tmp_path / "s.log",
                        f"http://127.0.0.1:{pick_port()}", 1.5, poll_s=0.1)
    srv.start()
    assert srv.proc is not None
    pgid = srv.proc.pid
    try:
        with pytest.raises(ServerStartError, match="not healthy after"):
            srv.wait_healthy()
    finally:
        srv.stop(grace_s=5)
    assert srv.proc is None
    assert not _group_alive(pgid)  # the grandchild went with the group


@pytest.mark.parametrize("name", list(ARMS))
def test_each_arm_command_has_its_flags_and_the_common_ones(name: str) -> None:
    arm = ARMS[name]
    cmd = server_command(arm, Path("/m"), 1234, device="cuda", tp=2, extra_args=[])
    assert cmd[1:3] == ["-m", "sglang.launch_server"]
    assert flag_value(cmd, "--model-path") == "/m" and flag_value(cmd, "--port") == "1234"
    assert flag_value(cmd, "--tp-size") == "2" and flag_value(cmd, "--device") == "cuda"
    for flag in common_flags(arm, "cuda"):
        assert flag in cmd
    # On a GPU the overlap scheduler stays on, except where no_buffer needs it off.
    assert ("--disable-overlap-schedule" in cmd) == (name == "upstream")
    strategy = flag_value(cmd, "--mamba-radix-cache-strategy")
    assert strategy == ("no_buffer" if name == "upstream" else "extra_buffer")
    assert ("--enable-linear-replayssm" in cmd) == (name in ("upstream", "plugin", "nextn-ring", "plugin-bf16",
                                                              "plugin-fp8", "plugin-rows", "plugin-slots"))
    spec = name.startswith("nextn")
    assert (flag_value(cmd, "--speculative-algorithm") == "NEXTN") == spec
    assert ("--enable-linear-replayssm-spec" in cmd) == (name == "nextn-plugin")
    if spec:  # chain drafts: the only shape the CPU runtime serves
        assert flag_value(cmd, "--speculative-eagle-topk") == "1"


def test_cpu_command_uses_the_cpu_runtime_flags_once() -> None:
    cmd = server_command(ARMS["plugin"], Path("/m"), 1, device="cpu", tp=1, extra_args=[])
    cpu = cpu_server_args()
    for tok in cpu:
        if tok.startswith("--"):
            assert cmd.count(tok) == 1, tok
    assert flag_value(cmd, "--device") == "cpu"
    assert "--tp-size" not in cmd


def test_extra_server_args_win_over_arm_and_cpu_flags() -> None:
    extra = ["--mamba-radix-cache-strategy", "extra_buffer_lazy", "--max-total-tokens=999", "--log-level", "debug"]
    cmd = server_command(ARMS["baseline"], Path("/m"), 1, device="cpu", tp=1, extra_args=extra)
    assert cmd.count("--mamba-radix-cache-strategy") == 1
    assert flag_value(cmd, "--mamba-radix-cache-strategy") == "extra_buffer_lazy"
    assert "--max-total-tokens=999" in cmd and "--max-total-tokens" not in cmd
    assert flag_value(cmd, "--log-level") == "debug"


def test_arm_environment_whitelists_plugins() -> None:
    assert server_env(ARMS["upstream"], "cuda")["SGLANG_PLUGINS"] == "replayssm_cpu"
    for name in ("baseline", "plugin", "nextn", "nextn-plugin"):
        assert server_env(ARMS[name], "cuda")["SGLANG_PLUGINS"] == "replayssm_cpu,replayssm_radix"
    # On CPU the package sets the CPU runtime's variables in the server itself (cpu/launch_env.py).
    assert server_env(ARMS["plugin"], "cpu") == {**os.environ, "SGLANG_PLUGINS": "replayssm_cpu,replayssm_radix"}


def test_parse_arms() -> None:
    assert parse_arms("plugin, baseline,plugin") == ["plugin", "baseline"]
    with pytest.raises(ValueError, match="unknown arm"):
        parse_arms("baseline,turbo")
    with pytest.raises(ValueError):
        parse_arms(" , ")


def test_command_line_shows_only_the_environment_the_launch_changes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KEEP", "same")
    monkeypatch.delenv("SGLANG_PLUGINS", raising=False)
    env = {**os.environ, "SGLANG_PLUGINS": "replayssm_cpu", "X": "a b"}
    line = command_line(["python", "-m", "sglang.launch_server", "--model-path", "/m dir"], env)
    assert line == "SGLANG_PLUGINS=replayssm_cpu X='a b' python -m sglang.launch_server --model-path '/m dir'"
