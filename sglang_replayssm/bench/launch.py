"""One launched arm's server: its command line (the arm's flags, its equal-memory budget, the common flags), its
environment, its log and command files, and the lines the bench prints before it starts."""

from __future__ import annotations

import argparse
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sglang_replayssm.bench.arms import ARMS, command_line, server_command, server_env


@dataclass(frozen=True)
class ArmLaunch:
    """What starts arm ``name``'s server at ``base_url`` (``cmd`` with ``env``, logging to ``log_path``)."""

    name: str
    cmd: list[str]
    env: dict[str, str]
    cmd_str: str
    log_path: Path
    base_url: str
    budget: Any  # memory.ArmBudget under equal memory, else None


def log_dir_of(args: argparse.Namespace) -> Path:
    """Where the servers' logs go: ``--log-dir``, else beside ``--json``, else a fixed folder."""
    if args.log_dir is not None:
        return Path(args.log_dir)
    if args.json is not None:
        return args.json.parent / f"{args.json.stem}-logs"
    return Path("sglang-replayssm-bench-logs")


def arm_launch(args: argparse.Namespace, name: str, model_dir: Path, device: str, port: int,
               budgets: dict[str, Any], common: tuple[str, ...] = ()) -> ArmLaunch:
    """Arm ``name``'s server on ``port`` (``common``: flags every arm of the run gets, before ``--server-args``):
    writes its ``.cmd`` file and prints what it is and how it starts."""
    arm = ARMS[name]
    budget = budgets.get(name)
    extra = [*common, *(tok for s in args.server_args for tok in shlex.split(s))]
    cmd = server_command(arm, model_dir, port, device=device, tp=args.tp,
                         extra_args=[*(budget.flags if budget else ()), *extra])
    env = {**server_env(arm, device), **dict(budget.env if budget else ())}
    cmd_str = command_line(cmd, env)
    log_dir = log_dir_of(args)
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"server-{name}.log"
    (log_dir / f"server-{name}.cmd").write_text(cmd_str + "\n")
    print(f"[{name}] {arm.description}\n[{name}] server: {cmd_str}\n[{name}] log: {log_path}\n"
          f"[{name}] waiting for /health (up to {args.ready_check_timeout_sec:.0f} s) ...", flush=True)
    return ArmLaunch(name, cmd, env, cmd_str, log_path, f"http://127.0.0.1:{port}", budget)
