"""Where a request's host time goes, plugin against SGLang, on CPU: py-spy samples of real servers.

    PYTHONPATH=. python lab/scripts/host_time_cpu.py [--arms baseline,plugin] [--reps 8] [--json out.json]

Builds ``tiny-gdn-24`` (tiny-gdn's widths at qnext-gdn-24's depth: 24 layers, 3 GDN : 1 attention, so 18 GDN
layers run per forward as on the GPU check, on tensors small enough that the host's Python and op dispatch
dominate, as they do on the lab GPU host), starts each arm's server alone, and, per arm, samples every
process of the server with py-spy (``--subprocesses``, active threads only) while it serves one request at a
time (``max_new_tokens`` 1), in three phases of ``--reps`` each, sampled apart (:func:`prompts`): 32-token
prompts (the floor), cold 664-token prompts (two kept interval states), and a cold 664-token prompt with a branch
off its first 600 tokens (a hit: 88 records folded from the state at 512); ``hit_only`` is the third phase less
the second.

Each sample is owned by its deepest frame of the plugin, the CPU runtime or SGLang (:func:`kind_of`): torch
and library frames below count for the frame that called them, and SGLang's functions an AROUND hook calls
count for SGLang. Prints, per arm: client ms per kind (median), sampled ms per request by owner, and the
plugin's functions that own the most (deepest plugin frame). ``--ops``: instead of sampling, every server
process counts its aten ops by owner (``opcount_site/sitecustomize.py``; a CUDA server launches about one kernel an
op): ops per request by owner and the plugin's functions that issue them.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gpu_serve"))

from profile_step import _generate  # noqa: E402

from sglang_replayssm.bench.arms import ARMS, server_command, server_env  # noqa: E402
from sglang_replayssm.bench.server import ServerProcess, pick_port  # noqa: E402
from sglang_replayssm.models.build import build_model  # noqa: E402
from sglang_replayssm.models.specs import SPECS  # noqa: E402

FLAGS = ["--disable-overlap-schedule", "--enable-metrics", "--mem-fraction-static", "0.1", "--sleep-on-idle",
         "--max-total-tokens", "16384", "--max-running-requests", "16", "--max-mamba-cache-size", "64"]
RATE = 1000  # samples a second
PY_SPY = Path(sys.executable).with_name("py-spy")


def _sglang_suffixes() -> frozenset[str]:
    """Every trailing path of SGLang's Python files (``a/b/c.py``, ``b/c.py``, ``c.py``): py-spy names a file
    relative to a ``sys.path`` entry, which may sit inside SGLang's tree."""
    import sglang

    root = Path(sglang.__file__).parent
    out: set[str] = set()
    for f in root.rglob("*.py"):
        parts = f.relative_to(root).parts
        out.update("/".join(parts[i:]) for i in range(len(parts)))
    return frozenset(out)


SGLANG_FILES = _sglang_suffixes()


def kind_of(frame: str) -> str:
    """``plugin`` (the radix plugin and SGLang's hook wrappers, which exist for it), ``runtime`` (the CPU runtime's
    stand-in kernels, which every arm runs), ``sglang``, or ``other`` (torch, the standard library, ...): by the
    file py-spy names, relative to its ``sys.path`` entry (``sglang/srt/`` is cut from SGLang's)."""
    path = frame[frame.rfind("(") + 1:frame.rfind(":")]
    if path.startswith("sglang_replayssm/cpu/"):
        return "runtime"
    if path.startswith("sglang_replayssm/") or path.startswith("plugins/hook_registry"):
        return "plugin"
    if path in SGLANG_FILES:
        return "sglang"
    return "other"


def owner(stack: str) -> tuple[str, str]:
    """(owner of the sample: the kind of its deepest frame that is not ``other``, and that frame)."""
    frames = stack.split(";")
    for frame in reversed(frames):
        kind = kind_of(frame)
        if kind != "other":
            return kind, frame
    return "other", frames[-1] if frames else ""


def summarize(raw: Path, requests: int, top: int = 20) -> dict[str, Any]:
    """Sampled ms per request by owner, and the plugin's deepest frames by ms per request."""
    by_owner: collections.Counter[str] = collections.Counter()
    by_frame: collections.Counter[str] = collections.Counter()
    for line in raw.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        who, frame = owner(stack)
        by_owner[who] += int(count)
        if who == "plugin":
            by_frame[frame] += int(count)
    per = 1e3 / RATE / max(requests, 1)
    return {"ms_per_request": {k: round(v * per, 3) for k, v in by_owner.items()},
            "plugin_frames_ms_per_request": [(k, round(v * per, 3)) for k, v in by_frame.most_common(top)]}


def prompts(reps: int, seed: int = 3) -> dict[str, list[list[int]]]:
    """The same seeded prompts for every arm, per phase: ``floor`` (32-token prompts), ``cold`` (664-token
    prompts), ``hit`` (each a cold prompt, then a 64-token branch off its first 600 tokens)."""
    rng = random.Random(seed)

    def ids(n: int) -> list[int]:
        return [rng.randrange(10, 2000) for _ in range(n)]

    hits: list[list[int]] = []
    for _ in range(reps):
        prefix = ids(600)
        hits += [prefix + ids(64), prefix + ids(64)]
    return {"floor": [ids(32) for _ in range(reps)], "cold": [ids(664) for _ in range(reps)], "hit": hits}


def _send(url: str, work: list[list[int]]) -> tuple[list[float], list[int]]:
    times, cached = [], []
    for ids in work:
        got = _generate(url, ids, 1)
        times.append(1e3 * got["client_s"])
        cached.append(int(got.get("meta_info", {}).get("cached_tokens", 0)))
    return times, cached


def _sampled(pid: int, raw: Path, url: str, work: list[list[int]]) -> tuple[list[float], list[int]]:
    """Send ``work`` one request at a time while py-spy samples the server's processes into ``raw``."""
    spy = subprocess.Popen([str(PY_SPY), "record", "--subprocesses", "-r", str(RATE), "-f", "raw", "-o", str(raw),
                            "-p", str(pid)], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    time.sleep(2.0)  # py-spy attaches
    got = _send(url, work)
    spy.send_signal(signal.SIGINT)
    spy.wait(timeout=60)
    return got


#: ``--ops``: the folder whose ``sitecustomize.py`` counts every server process's aten ops by owner.
OPCOUNT_SITE = Path(__file__).resolve().parent / "opcount_site"


def _op_counts(folder: Path) -> collections.Counter[str]:
    time.sleep(1.5)  # the servers write their counts every half second
    total: collections.Counter[str] = collections.Counter()
    for f in folder.glob("ops-*.json"):
        total.update(json.loads(f.read_text()))
    return total


def _counted(folder: Path, url: str, work: list[list[int]], per: int) -> tuple[tuple[list[float], list[int]],
                                                                               dict[str, Any]]:
    """Send ``work`` and count the servers' aten ops meanwhile: per request, by owner, and the plugin's functions."""
    before = _op_counts(folder)
    got = _send(url, work)
    diff = _op_counts(folder) - before
    owners: collections.Counter[str] = collections.Counter()
    for key, n in diff.items():
        owners[key.split(" ", 1)[0]] += n
    top = [(k.split(" ", 1)[1], round(n / per, 2)) for k, n in diff.most_common() if k.startswith("plugin ")][:20]
    return got, {"ops_per_request": {k: round(n / per, 2) for k, n in owners.items()}, "plugin_ops_per_request": top}


def run_arm(name: str, model: Path, reps: int, out: Path, ops: bool = False) -> dict[str, Any]:
    """One arm's server alone: per phase, sampled ms per request by owner (the ``hit`` phase's requests are a
    cold prompt and its branch: ``hit_only`` is that phase less the ``cold`` phase, per branch)."""
    port = pick_port()
    cmd = server_command(ARMS[name], model, port, device="cpu", tp=1, extra_args=FLAGS)
    log = out / f"server-{name}.log"
    res: dict[str, Any] = {}
    env = server_env(ARMS[name], "cpu")
    counts = out / f"ops-{name}"
    if ops:
        counts.mkdir()
        path = os.pathsep.join(p for p in (str(OPCOUNT_SITE), env.get("PYTHONPATH", os.environ.get("PYTHONPATH", ""))) if p)
        env = {**env, "LAB_OPCOUNT_DIR": str(counts), "PYTHONPATH": path}
    with ServerProcess(cmd, env, log, f"http://127.0.0.1:{port}", 600.0) as srv:
        assert srv.proc is not None
        for work in prompts(1, seed=4).values():  # first-use costs, and the warm-up rebuild
            for ids in work:
                _generate(srv.base_url, ids, 1)
        for kind, work in prompts(reps).items():
            pairs = len(work) // 2 if kind == "hit" else len(work)
            if ops:
                (times, cached), measured = _counted(counts, srv.base_url, work, pairs)
            else:
                raw = out / f"spy-{name}-{kind}.txt"
                times, cached = _sampled(srv.proc.pid, raw, srv.base_url, work)
                measured = summarize(raw, pairs)
            res[kind] = {"client_ms_median": round(statistics.median(times[1::2] if kind == "hit" else times), 2),
                         "cached_tokens": sorted(set(cached[1::2] if kind == "hit" else cached)), **measured}
    key = "ops_per_request" if ops else "ms_per_request"
    cold, hit = res["cold"][key], res["hit"][key]
    res["hit_only"] = {key: {k: round(hit.get(k, 0.0) - cold.get(k, 0.0), 3) for k in hit}}
    return res


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--arms", default="baseline,plugin")
    p.add_argument("--reps", type=int, default=8)
    p.add_argument("--json", type=Path)
    p.add_argument("--ops", action="store_true", help="count the servers' aten ops by owner instead of sampling "
                   "(opcount_site/sitecustomize.py; a CUDA server launches about one kernel an op)")
    p.add_argument("--models", type=Path, default=Path(tempfile.gettempdir()) / "replayssm-host-time-models")
    args = p.parse_args()
    base = SPECS["tiny-gdn"]
    spec = dataclasses.replace(base, name="tiny-gdn-24", mtp=False,
                               shape={**base.shape, "num_hidden_layers": 24, "full_attention_interval": 4})
    model = build_model(spec, args.models)
    out = Path(tempfile.mkdtemp(prefix="host-time-"))
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    result: dict[str, Any] = {"model": str(model), "reps": args.reps, "rate": RATE, "arms": {}}
    for name in args.arms.split(","):
        result["arms"][name] = res = run_arm(name, model, args.reps, out, args.ops)
        for kind in ("floor", "cold", "hit", "hit_only"):
            r = res[kind]
            what = ("aten ops a request", r["ops_per_request"]) if args.ops else ("sampled ms a request",
                                                                                  r["ms_per_request"])
            print(f"[{name}] {kind}: client ms (median) {r.get('client_ms_median')}, cached {r.get('cached_tokens')}, "
                  f"{what[0]} {what[1]}", flush=True)
            for frame, v in r.get("plugin_ops_per_request" if args.ops else "plugin_frames_ms_per_request", [])[:12]:
                print(f"    {v:8.2f}  {frame}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    print(f"logs and samples: {out}")


if __name__ == "__main__":
    main()
