"""Decode throughput side by side: every arm's server up at once on one GPU, bursts in rotation.

    python lab/gpu_serve/decode_ab.py --model-path M --out DIR [--arms baseline,plugin] [--rounds 5]

On the lab H200 a full-batch decode step of an 8-layer model is host-bound and the host's speed drifts
between calls and arms (the same baseline logged 3.35 and 5.61 ms per step in two calls), so arms
measured one after another compare hosts, not kernels. Here the servers start one after another (each
given ``--static-gib`` of GPU memory for its pools),
then each round sends one burst to every arm in turn (the order rotates every round); only one server
decodes at a time. Per arm: SGLang's per-step time of each burst (bench/decode.py) and tokens/s =
concurrency / step; per round the ratio to the first arm; medians and ranges in DIR/decode_ab.json
and DIR/decode_ab.md. ``--floor-reps``: paired prefill times after the rounds; ``--main-workloads``: then the
main job, paired (main_ab.py).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from main_ab import run_main_pairs
from main_ab import table as main_table
from serve_check import GSP_ARGS, PREFILL_GRAPH_HELP, RAG_ARGS, SERVE_FLAGS, lab_flags

from sglang_replayssm.bench.arms import ARMS, merge_flags, parse_arms, server_command, server_env
from sglang_replayssm.bench.decode import run_decode
from sglang_replayssm.bench.metrics import percentile
from sglang_replayssm.bench.paired import IDLE_FLAGS
from sglang_replayssm.bench.server import ServerProcess, pick_port


def mem_fraction_for(static_gib: float) -> float:
    """``--mem-fraction-static`` that gives this server about ``static_gib`` (weights, mamba and KV
    pools): SGLang 0.5.23 sizes them as ``free * f`` of the memory free when it starts
    (kv_cache_configurator.py ``_profile_available_bytes``), whoever else holds the rest."""
    out = subprocess.run(["nvidia-smi", "--query-gpu=memory.free", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, check=True).stdout.splitlines()[0]
    return round(min(0.9, static_gib / (float(out) / 1024)), 3)


#: Lines a server log must not hold (counted per arm): a stacked-hook warning, a read copy that does not
#: reach its layer, a traceback.
LOG_FLAGS = {"multiple_around": "Multiple AROUND", "read_copy_unlinked": "reaches no copy of its layer",
             "traceback": "Traceback (most recent call last)"}


def log_flags(log: Path) -> dict[str, int]:
    text = log.read_text(errors="replace") if log.exists() else ""
    return {key: text.count(needle) for key, needle in LOG_FLAGS.items()}


RUNNING_CAP = re.compile(r"max_running_requests=(\d+)")


def running_cap(log: Path) -> int | None:
    """The most requests SGLang will run at once, from its startup log line (``max_running_requests=N``: after any
    cap the mamba state cache puts on it), or None before that line."""
    text = log.read_text(errors="replace") if log.exists() else ""
    found = RUNNING_CAP.findall(text)
    return int(found[-1]) if found else None


def full_batches(cap: int | None, concurrencies: list[int]) -> tuple[list[int], str]:
    """The burst sizes a server that runs at most ``cap`` requests at once can decode as one full batch (a larger
    burst never fills it, so SGLang's step lines of a full batch never come), and a one-line reason for the rest."""
    if cap is None:
        return concurrencies, ""
    kept = [c for c in concurrencies if c <= cap]
    dropped = [c for c in concurrencies if c > cap]
    why = (f"bursts of {', '.join(map(str, dropped))} skipped: SGLang runs at most {cap} requests at once here "
           f"(its log says why: raise --max-mamba-cache-size or the static GiB)") if dropped else ""
    return kept, why


def write(doc: dict[str, Any], groups: list[dict[int, dict[str, list[float]]]], dirs: list[Path]) -> str:
    """Summary of the rounds so far, one table per group and concurrency (arms paired over the rounds
    all of them finished, ratios to the group's first arm), to every dir."""
    doc["summary"], texts = [], []
    for by_conc in groups:
        for concurrency, steps in by_conc.items():
            n = min((len(v) for v in steps.values()), default=0)
            summary = summarize({a: v[:n] for a, v in steps.items()}, concurrency) if steps else {}
            doc["summary"].append({"concurrency": concurrency, "arms": summary})
            texts.append(table(summary, concurrency) if n else "")  # no round ran: no decode table
    for prefill in doc.get("prefill", []):
        texts.append(prefill_table(prefill.get("summary", {}), prefill.get("reps", 0)))
    for main_job in doc.get("main", []):
        texts.append(main_table(main_job))
    text = "\n".join(t for t in texts if t)
    for d in dirs:
        d.mkdir(parents=True, exist_ok=True)
        (d / "decode_ab.json").write_text(json.dumps(doc, indent=1))
        (d / "decode_ab.md").write_text(text)
    return text


def summarize(steps: dict[str, list[float]], concurrency: int) -> dict[str, Any]:
    """Per arm: median / min / max step ms and tokens/s; paired per-round ratios to the first arm."""
    first = next(iter(steps))
    out: dict[str, Any] = {}
    for arm, xs in steps.items():
        ratios = [b / a for a, b in zip(xs, steps[first], strict=False) if a > 0]
        out[arm] = {"step_ms": xs, "step_ms_median": statistics.median(xs) if xs else float("nan"),
                    "tok_s_median": concurrency * 1000.0 / statistics.median(xs) if xs else float("nan"),
                    "speedup_vs_first_median": statistics.median(ratios) if ratios else float("nan"),
                    "speedup_vs_first_range": [min(ratios), max(ratios)] if ratios else None}
    return out


def table(summary: dict[str, Any], concurrency: int) -> str:
    first = next(iter(summary))
    rows = [f"| arm | decode tok/s at {concurrency} (median) | step ms median | step ms per round | "
            f"x {first} (median of rounds, range) |", "|---|---|---|---|---|"]
    for arm, s in summary.items():
        rng = s["speedup_vs_first_range"]
        rows.append(f"| {arm} | {s['tok_s_median']:.0f} | {s['step_ms_median']:.2f} | "
                    f"{' '.join(f'{x:.2f}' for x in s['step_ms'])} | {s['speedup_vs_first_median']:.2f}x"
                    f"{f' ({rng[0]:.2f}-{rng[1]:.2f})' if rng else ''} |")
    return "\n".join(rows) + "\n"


def prefill_table(summary: dict[str, dict[str, list[float]]], reps: int) -> str:
    """The prefill times (:func:`prefill_times`): per arm and kind, the client's p50 ms (p10-p90)."""
    kinds = list(dict.fromkeys(k for by_kind in summary.values() for k in by_kind))
    if not kinds:
        return ""
    rows = [f"| arm (client ms, p50 (p10-p90) of {reps} rotations) | " + " | ".join(kinds) + " |",
            "|---|" + "---|" * len(kinds)]
    for arm, by_kind in summary.items():
        cells = [f"{v[0]:.1f} ({v[1]:.1f}-{v[2]:.1f})" if (v := by_kind.get(k)) else "-" for k in kinds]
        rows.append(f"| {arm} | " + " | ".join(cells) + " |")
    spread = max((v[2] - v[1] for by_kind in summary.values() if (v := by_kind.get("floor"))), default=0.0)
    rows.append(f"\nhost noise: the widest floor p10-p90 is {spread:.1f} ms"
                + (" (differences below it are not resolved)" if spread > 2.0 else ""))
    return "\n".join(rows) + "\n"


#: The cores this process may use when it starts (pinning narrows its own affinity to the client's core).
ALL_CORES = sorted(os.sched_getaffinity(0))


def physical_cores(cores: list[int], topology: Path = Path("/sys/devices/system/cpu")) -> list[list[int]]:
    """``cores`` grouped by physical core (SMT siblings together, from sysfs ``thread_siblings_list``), in the
    order of each group's lowest core; a core whose topology cannot be read is its own group."""
    groups: dict[tuple[int, ...], list[int]] = {}
    allowed = set(cores)
    for c in sorted(cores):
        try:
            text = (topology / f"cpu{c}" / "topology" / "thread_siblings_list").read_text().strip()
            siblings = tuple(sorted(allowed & set(_cpu_list(text)))) or (c,)
        except (OSError, ValueError):
            siblings = (c,)
        groups.setdefault(siblings, [])
        if c not in groups[siblings]:
            groups[siblings].append(c)
    return sorted(groups.values(), key=min)


def _cpu_list(text: str) -> list[int]:
    """Linux's CPU list syntax (``0-3,8,10-11``) as numbers."""
    out: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return out


def core_blocks(cores: list[int], n: int, topology: Path = Path("/sys/devices/system/cpu")) -> tuple[list[int], list[list[int]]]:
    """``cores`` split for ``n`` servers by whole physical cores (SMT siblings never split between two servers, or a
    server and the client): the first physical core for the client, the rest in ``n`` equal contiguous blocks (the
    remainder unused), so no server's processes share a core, nor a core's execution units, with another's."""
    phys = physical_cores(cores, topology)
    per = (len(phys) - 1) // n
    if per < 1:
        raise SystemExit(f"--pin-cores: {len(phys)} physical cores cannot give {n} servers one each beside the client")
    blocks = [sorted(c for group in phys[1 + i * per:1 + (i + 1) * per] for c in group) for i in range(n)]
    return phys[0], blocks


def pinned(cmd: list[str], cores: list[int]) -> list[str]:
    """``cmd`` run with its CPU affinity (inherited by every process it starts) set to ``cores``."""
    code = f"import os, sys; os.sched_setaffinity(0, {sorted(cores)}); os.execvp(sys.argv[1], sys.argv[1:])"
    return [sys.executable, "-c", code, *cmd]


def add_variant(spec: str) -> str:
    """``NAME=BASE:VAR=VALUE[,VAR=VALUE]``: an arm ``NAME`` = arm ``BASE`` with those environment
    variables added (e.g. a fix turned off), registered in ``ARMS`` for this run; returns ``NAME``."""
    name, _, rest = spec.partition("=")
    base, _, env = rest.partition(":")
    if not name or base not in ARMS or not env:
        raise SystemExit(f"--variant {spec!r}: want NAME=BASE:VAR=VALUE with BASE one of {', '.join(ARMS)}")
    pairs = tuple(tuple(kv.split("=", 1)) for kv in env.split(","))
    ARMS[name] = dataclasses.replace(ARMS[base], name=name, description=f"{ARMS[base].description} + {env}",
                                     env=ARMS[base].env + pairs)  # type: ignore[arg-type]
    return name


def static_gib_of(spec: str) -> tuple[float, dict[str, float]]:
    """``"26"`` or ``"26,plugin-fp8=32"``: the default GiB and per-arm overrides."""
    default, per_arm = 26.0, {}
    for part in filter(None, spec.split(",")):
        if "=" in part:
            arm, gib = part.split("=", 1)
            per_arm[arm.strip()] = float(gib)
        else:
            default = float(part)
    return default, per_arm


def prefill_times(servers: dict[str, tuple[str, Path]], live: list[str], reps: int,
                  stream: bool = False, on_rep: Any = None, long_hit: int = 0) -> dict[str, Any]:
    """Client time of one-token requests, one at a time, the arms interleaved (rotating) so host drift hits
    every arm alike: a 32-token cold prompt (the fixed floor), a 3,482-token cold prompt, and a hit (3,332
    tokens seeded by an untimed request, then the same prefix + 150 new tokens); the first rotation
    unmeasured. With ``stream``, the three again (a new prefix) with 32 new tokens, streamed: the client's
    time to the first token (``floor32``, ``cold32``, ``hit32``), which holds the first decode step's launch
    (SGLang's overlap scheduler sends a prefill's token after launching the next batch). Per arm and kind:
    every time, the median and p10 / p90 (ms), and the hits' cached tokens; ``on_rep`` gets that summary
    after every measured rotation (a call cut at its time limit keeps the rotations done). ``long_hit``: also
    a hit at that depth (``long``: seeded like ``hit``), which the plugin rebuilds over more records."""
    import random

    from profile_step import _generate, _stream_ttft_ms

    rng = random.Random(7)

    def ids(n: int) -> list[int]:
        return [rng.randrange(10, 2000) for _ in range(n)]

    times: dict[str, dict[str, list[float]]] = {n: {"floor": [], "cold": [], "hit": [], "long": []} for n in live}
    cached: dict[str, list[int]] = {n: [] for n in live}
    for rep in range(reps + 1):
        for name in live[rep % len(live):] + live[:rep % len(live)]:
            url = servers[name][0]
            # one-token requests; with ``stream`` the same again (a new prefix), streamed with 32 new tokens
            for suffix in ("", "32") if stream else ("",):
                prefix, longer = ids(3332), ids(long_hit)
                _generate(url, prefix + ids(150), 1)  # the seed of the hit
                kinds = [("floor", ids(32)), ("cold", ids(3482)), ("hit", prefix + ids(150))]
                if long_hit:
                    _generate(url, longer + ids(150), 1)
                    kinds.append(("long", longer + ids(150)))
                for kind, prompt in kinds:
                    if suffix:
                        ms = _stream_ttft_ms(url, prompt, 32)
                    else:
                        out = _generate(url, prompt, 1)
                        ms = round(1e3 * out["client_s"], 2)
                        if rep and kind in ("hit", "long"):
                            cached[name].append(int(out.get("meta_info", {}).get("cached_tokens", 0)))
                    if rep:
                        times[name].setdefault(kind + suffix, []).append(ms)
        if rep and on_rep is not None:
            on_rep(_prefill_summary(rep, times, cached))
    return _prefill_summary(reps, times, cached)


def _prefill_summary(reps: int, times: dict[str, dict[str, list[float]]], cached: dict[str, list[int]]) -> dict[str, Any]:
    summary = {n: {k: [round(percentile(v, q), 2) for q in (50, 10, 90)] for k, v in kinds.items() if v}
               for n, kinds in times.items()}
    return {"reps": reps, "all_ms": times, "summary": summary, "hit_cached_tokens": cached}


def run_group(args: argparse.Namespace, arms: list[str], steps: dict[int, dict[str, list[float]]],
              doc: dict[str, Any], write_all: Any, t_end: float) -> None:
    """Start ``arms``' servers (one after another, each with its static GiB), then rounds of one burst per
    arm and concurrency in rotating arm order until ``--rounds`` or the budget; the servers stop at the end."""
    default_gib, per_arm_gib = static_gib_of(args.static_gib)
    blocks: list[list[int]] = []
    if args.pin_cores:
        client, blocks = core_blocks(ALL_CORES, len(arms))
        os.sched_setaffinity(0, client)
        doc["pinned_cores"] = {"client": client, **dict(zip(arms, blocks)),
                               "physical": physical_cores(ALL_CORES)}
    with contextlib.ExitStack() as stack:
        servers: dict[str, tuple[str, Path]] = {}
        for i, name in enumerate(arms):
            frac = mem_fraction_for(per_arm_gib.get(name, default_gib))
            # Idle servers sleep (SGLang's --sleep-on-idle, bench/paired.py): an idle scheduler otherwise spins a core
            # while another arm serves.
            extra = merge_flags(["--mem-fraction-static", str(frac), *IDLE_FLAGS, *shlex.split(args.server_flags)],
                                lab_flags(args.prefill_graph) + shlex.split(SERVE_FLAGS))
            port = pick_port()
            cmd = server_command(ARMS[name], args.model_path, port, device="cuda", tp=1, extra_args=extra)
            if blocks:
                cmd = pinned(cmd, blocks[i])
            log = args.out / "logs" / f"server-ab-{name}.log"
            try:
                srv = stack.enter_context(ServerProcess(cmd, server_env(ARMS[name], "cuda"), log,
                                                        f"http://127.0.0.1:{port}", 300.0))
            except Exception as exc:  # one arm that does not start does not cost the others
                tail = log.read_text(errors="replace").splitlines()[-15:] if log.exists() else []
                doc["servers"][name] = {"mem_fraction_static": frac, "error": str(exc), "log_tail": tail}
                print(f"[ab] {name} did not start: {exc}\n" + "\n".join(tail), flush=True)
                for by_arm in steps.values():
                    del by_arm[name]
                continue
            servers[name] = (srv.base_url, log)
            doc["servers"][name] = {"mem_fraction_static": frac, "startup_s": srv.startup_s}
            write_all()
            print(f"[ab] {name} healthy after {srv.startup_s:.0f} s (mem fraction {frac})", flush=True)
            kept, why = full_batches(running_cap(log), list(steps))
            if why:  # no full-batch step line would ever come: spend no device time on those bursts
                print(f"[ab] {name}: {why}", flush=True)
                doc["servers"][name]["skipped_bursts"] = why
                for c in [c for c in list(steps) if c not in kept]:
                    del steps[c]
            for concurrency in steps:  # first-use costs
                run_decode(srv.base_url, concurrency, args.prompt_len, 24, seed=5)
        live = [a for a in arms if a in servers]
        for r in range(args.rounds):
            if time.monotonic() > t_end or not live:
                break
            order = live[r % len(live):] + live[:r % len(live)]
            row: dict[str, Any] = {}
            for concurrency, by_arm in steps.items():
                for name in order:
                    url, log = servers[name]
                    res = run_decode(url, concurrency, args.prompt_len, args.output_len, log_path=log,
                                     seed=100 + r)
                    row[f"{name}@{concurrency}"] = res
                    if res["step_lines"]:
                        by_arm[name].append(res["step_ms_p50"])
            doc["rounds"].append(row)
            print(f"[ab] round {r}: " + ", ".join(f"{n} {v['step_ms_p50']:.2f} ms" for n, v in row.items()),
                  flush=True)
            write_all()
        if args.floor_reps and live:
            doc.setdefault("prefill", []).append({})

            def keep(partial: dict[str, Any]) -> None:
                doc["prefill"][-1] = partial
                write_all()

            keep(prefill_times(servers, live, args.floor_reps, args.stream, on_rep=keep, long_hit=args.long_hit))
            print("[ab] prefill ms (median, p10-p90): " + json.dumps(doc["prefill"][-1]["summary"]), flush=True)
            write_all()
        if args.main_workloads and live and time.monotonic() < t_end:
            bench_args = {"rag": args.rag_args, "gsp": args.gsp_args, **dict(w.split("=", 1) for w in args.workload)}
            doc.setdefault("main", []).append(run_main_pairs(
                {n: servers[n][0] for n in live}, {w: bench_args[w] for w in args.main_workloads.split(",")},
                args.model_path))
            print(main_table(doc["main"][-1]), flush=True)
            write_all()
        for name, (_, log) in servers.items():
            doc["servers"][name]["log_flags"] = log_flags(log)
            doc["servers"][name]["pools"] = [ln.split("] ", 1)[-1] for ln in log.read_text(errors="replace")
                                             .splitlines() if "is allocated" in ln or "sglang-replayssm" in ln
                                             and ("MiB" in ln or "records:" in ln)][:8]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model-path", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--arms", default="baseline,plugin,plugin-fp8,bf16-state",
                   help="arms up at once; ';' separates groups run one after another (ratios within a group)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--concurrency", default="256", help="requests per burst; a list (256,64) bursts at each")
    p.add_argument("--prompt-len", type=int, default=512)
    p.add_argument("--output-len", type=int, default=512)
    p.add_argument("--static-gib", default="26", help="GiB per server, e.g. 26 or 52,plugin-fp8=64")
    p.add_argument("--server-flags", default="", help="flags every server gets (over the serving flags)")
    p.add_argument("--variant", action="append", default=[],
                   help="NAME=BASE:VAR=VALUE: an extra arm, BASE with those variables (repeatable)")
    p.add_argument("--floor-reps", type=int, default=0,
                   help="after the rounds: this many interleaved one-token prefills per arm (32 and 3,482 cold, a hit)")
    p.add_argument("--stream", action="store_true",
                   help="--floor-reps also streams each kind with 32 new tokens (TTFT with the first decode launch)")
    p.add_argument("--long-hit", type=int, default=0,
                   help="--floor-reps also times a hit at this depth (+ 150 new tokens): a longer rebuild")
    p.add_argument("--main-workloads", default="", help="after the prefill times: the main job, paired "
                   "(main_ab.py), on these workloads (rag, gsp, --workload names)")
    p.add_argument("--rag-args", default=RAG_ARGS, help="bench arguments of the paired main job's RAG workload")
    p.add_argument("--gsp-args", default=GSP_ARGS, help="bench arguments of the paired main job's gsp workload")
    p.add_argument("--workload", action="append", default=[],
                   help="NAME=BENCH_ARGS: one more workload --main-workloads may name (repeatable)")
    p.add_argument("--pin-cores", action="store_true", help="each server of a group on its own equal block of "
                   "cores, the client on another (no server's host work shares a core with another's)")
    p.add_argument("--prefill-graph", action="store_true", help=PREFILL_GRAPH_HELP)
    p.add_argument("--budget-s", type=float, default=480.0)
    p.add_argument("--lab", action="store_true", help="accepted for scripts/gpu_serve.sh; the lab flags are always on")
    args = p.parse_args(argv)
    for spec in args.variant:
        add_variant(spec)
    args.out.mkdir(parents=True, exist_ok=True)
    t_end = time.monotonic() + args.budget_s
    groups = [parse_arms(g) for g in args.arms.split(";") if g.strip()]
    concurrencies = [int(c) for c in str(args.concurrency).split(",") if c.strip()]
    steps: list[dict[int, dict[str, list[float]]]] = [{c: {a: [] for a in g} for c in concurrencies}
                                                       for g in groups]
    # $OUT too (the device call's folder): a call cut at its time limit still brings the rounds back
    dirs = [args.out, *([Path(os.environ["OUT"])] if os.environ.get("OUT") else [])]
    doc: dict[str, Any] = {"argv": argv, "servers": {}, "rounds": []}
    for arms, group_steps in zip(groups, steps, strict=True):
        # a group gets its share of what is left, so a slow first group cannot starve the next
        left = len(groups) - groups.index(arms)
        share_end = time.monotonic() + (t_end - time.monotonic()) / left
        run_group(args, arms, group_steps, doc, lambda: write(doc, steps, dirs), share_end)
    print(write(doc, steps, dirs), flush=True)
    print("[ab] server log flags: " + json.dumps({a: s.get("log_flags") for a, s in doc["servers"].items()}),
          flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
