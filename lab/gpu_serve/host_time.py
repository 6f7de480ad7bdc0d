"""Where a prefill's host time goes in a real server, by plugin function (lab only; on a GPU ``CHECK=host_time bash
scripts/gpu_serve.sh [--arms plugin,baseline] [--reps 10]``, on CPU ``--device cpu``).

Per arm, one server alone (``lab_host_timers.py`` on: every plugin function timed, exclusive of the plugin
functions it calls), one request at a time (``max_new_tokens`` 1) in the phases of ``host_time_cpu.prompts``:
``floor`` (32-token prompts), ``cold`` (664 tokens: two kept interval states), ``hit`` (a cold prompt, then a
branch off its first 600 tokens: 88 records rebuilt from the state at 512; the branch's time is reported). Per
phase: the client's median ms a request, and the plugin's host ms a request (the scheduler process, by function,
exclusive), with the calls that took them; SGLang's functions that AROUND hooks call show as ``sglang:<name>``
and are not the plugin's. ``--prefill-graph``: SGLang's prefill CUDA graphs on (its CUDA default). ``tables.md``
and ``serve_check.json`` under ``--out``.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shlex
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from host_time_cpu import prompts  # noqa: E402
from profile_step import _generate  # noqa: E402
from serve_check import PREFILL_GRAPH_HELP, lab_flags  # noqa: E402

from sglang_replayssm.bench.arms import ARMS, merge_flags, server_command, server_env  # noqa: E402
from sglang_replayssm.bench.server import ServerProcess, pick_port  # noqa: E402

SHIM = Path(__file__).resolve().parent / "shim"
GPU_FLAGS = ("--max-running-requests 16 --max-mamba-cache-size 200 --chunked-prefill-size 8192 "
             "--mem-fraction-static 0.5 --cuda-graph-bs-decode 1 2 4")
CPU_FLAGS = ("--disable-overlap-schedule --mem-fraction-static 0.1 --max-total-tokens 16384 --max-running-requests 16 "
             "--max-mamba-cache-size 64")


def _timers(folder: Path) -> dict[str, list[float]]:
    """The server processes' timers, summed by function (each process writes its own file)."""
    time.sleep(1.2)  # every half second
    total: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0])
    for f in folder.glob("timers-*.json"):
        for name, (calls, secs) in json.loads(f.read_text()).items():
            total[name][0] += calls
            total[name][1] += secs
    return total


def _diff(after: dict[str, list[float]], before: dict[str, list[float]], per: int) -> dict[str, tuple[float, float]]:
    """``{function: (calls a request, exclusive ms a request)}`` of what ran between two reads."""
    out = {}
    for name, (calls, secs) in after.items():
        c0, s0 = before.get(name, (0, 0.0))
        if calls > c0:
            out[name] = ((calls - c0) / per, 1e3 * (secs - s0) / per)
    return out


def run_arm(spec: str, model: Path, reps: int, out: Path, device: str, extra: list[str]) -> dict[str, Any]:
    """One arm, ``NAME[+VAR=VALUE...]``: the ARMS entry and that server's extra environment."""
    name, *envs = spec.split("+")
    env_extra = dict(e.split("=", 1) for e in envs)
    port = pick_port()
    flags = shlex.split(CPU_FLAGS if device == "cpu" else GPU_FLAGS)
    arm = ARMS[name]
    cmd = server_command(arm, model, port, device=device, tp=1, extra_args=merge_flags(extra, flags))
    folder = out / f"timers-{spec}"
    folder.mkdir(parents=True, exist_ok=True)
    path = os.pathsep.join(p for p in (str(SHIM), os.environ.get("PYTHONPATH", "")) if p)
    env = {**server_env(arm, device), "LAB_HOST_TIMERS": str(folder), "PYTHONPATH": path, **env_extra}
    res: dict[str, Any] = {"server_cmd": " ".join(cmd), "env": env_extra}
    with ServerProcess(cmd, env, out / f"server-{spec}.log", f"http://127.0.0.1:{port}", 900.0) as srv:
        for work in prompts(2, seed=4).values():  # first-use costs, compiles, the warm-up rebuild
            for ids in work:
                _generate(srv.base_url, ids, 1)
        for kind, work in prompts(reps).items():
            before = _timers(folder)
            times, cached = [], []
            for ids in work:
                got = _generate(srv.base_url, ids, 1)
                times.append(1e3 * got["client_s"])
                cached.append(int(got.get("meta_info", {}).get("cached_tokens", 0)))
            per = len(work) // 2 if kind == "hit" else len(work)
            measured = times[1::2] if kind == "hit" else times
            funcs = _diff(_timers(folder), before, per)
            res[kind] = {"client_ms_median": round(statistics.median(measured), 2),
                         "client_ms": [round(t, 2) for t in measured],
                         "cached_tokens": sorted(set(cached[1::2] if kind == "hit" else cached)),
                         "plugin_ms": round(sum(ms for k, (_, ms) in funcs.items() if not k.startswith("sglang:")), 3),
                         "plugin_calls": round(sum(c for k, (c, _) in funcs.items() if not k.startswith("sglang:")), 1),
                         "functions": sorted(((k, round(c, 2), round(ms, 4)) for k, (c, ms) in funcs.items()),
                                             key=lambda r: -r[2])}
            print(f"[{spec}] {kind}: client median {res[kind]['client_ms_median']} ms, plugin host "
                  f"{res[kind]['plugin_ms']} ms in {res[kind]['plugin_calls']} calls a request", flush=True)
    return res


def table(result: dict[str, Any], top: int) -> str:
    lines = ["| arm | phase | client ms (median) | plugin host ms | calls |", "|---|---|---|---|---|"]
    for arm, res in result["arms"].items():
        for kind in ("floor", "cold", "hit"):
            r = res[kind]
            lines.append(f"| {arm} | {kind} | {r['client_ms_median']} | {r['plugin_ms']} | {r['plugin_calls']} |")
    for arm, res in result["arms"].items():
        for kind in ("floor", "cold", "hit"):
            lines += ["", f"{arm}, {kind}: the plugin's functions (exclusive ms a request, calls a request)", ""]
            lines += [f"    {ms:8.3f} {c:7.1f}  {name}" for name, c, ms in res[kind]["functions"][:top]]
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model-path", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--arms", default="plugin,baseline",
                   help="ARMS names; NAME+VAR=VALUE sets an environment variable of that server")
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--device", default="cuda")
    p.add_argument("--lab", action="store_true", help="the lab GPU's flags (scripts/gpu_serve.sh)")
    p.add_argument("--server-args", default="")
    p.add_argument("--prefill-graph", action="store_true", help=f"with --lab: {PREFILL_GRAPH_HELP}")
    p.add_argument("--budget-s", type=float, default=0.0, help="unused (gpu_serve.sh passes it)")
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    extra = (lab_flags(args.prefill_graph) if args.lab else []) + shlex.split(args.server_args)
    result: dict[str, Any] = {"model": str(args.model_path), "reps": args.reps, "arms": {}}
    for spec in args.arms.split(","):
        result["arms"][spec] = run_arm(spec, args.model_path, args.reps, args.out, args.device, extra)
    (args.out / "serve_check.json").write_text(json.dumps(result, indent=1))
    text = table(result, args.top)
    (args.out / "tables.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
