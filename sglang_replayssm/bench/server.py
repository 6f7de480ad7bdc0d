"""One SGLang server subprocess: start it, wait until it answers, always stop it, keep its log."""

from __future__ import annotations

import os
import random
import shlex
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType


class ServerStartError(RuntimeError):
    """The server exited or did not become healthy in time; the message holds its log tail."""


#: Where :func:`pick_port` draws from: below Linux's default ephemeral range (32768-60999), which the kernel hands
#: to every outgoing connection (a port found free by binding port 0 is drawn from that range, and a client
#: socket may take it before the server binds it: "address already in use").
PORT_RANGE = (20000, 32000)


def _ephemeral_range() -> tuple[int, int]:
    try:
        lo, hi = (int(v) for v in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
        return lo, hi
    except (OSError, ValueError):
        return 32768, 60999


def pick_port(host: str = "127.0.0.1", tries: int = 200) -> int:
    """A TCP port that was free a moment ago, outside the kernel's ephemeral range (:data:`PORT_RANGE`,
    less any overlap with that range), drawn at random so that processes picking at once rarely meet."""
    lo, hi = PORT_RANGE
    eph_lo, eph_hi = _ephemeral_range()
    candidates = [p for p in range(lo, hi) if not eph_lo <= p <= eph_hi]
    rng = random.SystemRandom()
    for port in rng.sample(candidates, min(tries, len(candidates))):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:  # every candidate taken: any free port
        s.bind((host, 0))
        return int(s.getsockname()[1])


def log_tail(path: Path, lines: int = 40) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def probe(url: str, timeout: float) -> tuple[bool, str]:
    """GET ``url``: (answered 2xx, reason when not)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return 200 <= resp.status < 300, f"HTTP {resp.status}"
    except urllib.error.HTTPError as exc:
        return False, f"HTTP {exc.code}"
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        return False, str(reason)


class ServerProcess:
    """``with ServerProcess(cmd, env, log_path, base_url, timeout) as srv:`` -- healthy inside."""

    def __init__(self, cmd: list[str], env: dict[str, str], log_path: Path, base_url: str,
                 timeout_s: float, poll_s: float = 1.0) -> None:
        self.cmd = cmd
        self.env = env
        self.log_path = log_path
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self.poll_s = poll_s
        self.proc: subprocess.Popen[bytes] | None = None
        self.startup_s: float | None = None

    def __enter__(self) -> ServerProcess:
        self.start()
        try:
            self.wait_healthy()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "wb") as log:
            log.write(f"$ {shlex.join(self.cmd)}\n".encode())
            log.flush()
            # Own session: stopping the group reaches the scheduler/detokenizer children too.
            self.proc = subprocess.Popen(self.cmd, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)

    def wait_healthy(self) -> None:
        assert self.proc is not None
        t0 = time.monotonic()
        reason = "no answer yet"
        while True:
            code = self.proc.poll()
            if code is not None:
                raise ServerStartError(self._failure(f"the server exited with code {code} during startup"))
            ok, reason = probe(self.base_url + "/health", timeout=5.0)
            if ok:
                self.startup_s = time.monotonic() - t0
                return
            if time.monotonic() - t0 > self.timeout_s:
                raise ServerStartError(self._failure(
                    f"the server was not healthy after {self.timeout_s:.0f} s (last /health: {reason})"))
            time.sleep(self.poll_s)

    def diagnosis(self, lines: int = 25, settle_s: float = 10.0) -> str:
        """Whether the server is still up, its log path and the log's last lines.

        A crashing SGLang server takes a few seconds to go down; give it ``settle_s`` to do so.
        """
        code = None
        if self.proc is not None:
            try:
                code = self.proc.wait(timeout=settle_s)
            except subprocess.TimeoutExpired:
                code = None
        state = f"the server exited with code {code}" if code is not None else "the server is still running"
        return f"{state}; log {self.log_path}, last lines:\n{log_tail(self.log_path, lines)}"

    def _failure(self, what: str) -> str:
        return f"{what}; log {self.log_path}, last lines:\n{log_tail(self.log_path)}"

    def stop(self, grace_s: float = 20.0) -> None:
        """SIGTERM the server's process group, then SIGKILL what is left after ``grace_s``."""
        proc = self.proc
        if proc is None:
            return
        for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                proc.wait(timeout=wait_s)
                # The leader is gone; children of the group may linger a moment.
                deadline = time.monotonic() + wait_s
                while _group_alive(proc.pid) and time.monotonic() < deadline:
                    time.sleep(0.2)
                if not _group_alive(proc.pid):
                    break
            except subprocess.TimeoutExpired:
                continue
        self.proc = None


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
