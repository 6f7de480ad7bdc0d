"""Prefill and decode client times of bench arms on CPU, one server at a time in the order given (repeat an
arm to bracket drift: ``plugin-slots,plugin,plugin-slots,plugin``), the same seeded prompts for every arm.

    PYTHONPATH=. python lab/scripts/ttft_arms_cpu.py --arms plugin-slots,plugin,plugin-slots,plugin --reps 6

Per repetition: a cold 1,088-token prompt (1,024 shared + 64), two hits at 1,024 (new 64-token suffixes) with
max_new_tokens 1, and a 16-token decode behind the same prefix. Prints, per server in order, the median and
every time (ms); ``--json`` writes them.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gpu_serve"))

from profile_step import _generate  # noqa: E402

from sglang_replayssm.bench.arms import ARMS, server_command, server_env  # noqa: E402
from sglang_replayssm.bench.server import ServerProcess, pick_port  # noqa: E402

FLAGS = ["--disable-overlap-schedule", "--enable-metrics", "--skip-server-warmup", "--mem-fraction-static", "0.1",
         "--max-total-tokens", "16384", "--max-running-requests", "16", "--max-mamba-cache-size", "64"]


def times_of(url: str, reps: int) -> dict[str, list[float]]:
    rng = random.Random(3)  # every arm sees the same prompts
    out: dict[str, list[float]] = {"cold": [], "hit": [], "decode16": []}
    for _ in range(reps):
        prefix = [rng.randrange(10, 2000) for _ in range(1024)]
        cold, hit_a, hit_b, tail = ([rng.randrange(10, 2000) for _ in range(64)] for _ in range(4))
        out["cold"].append(1e3 * _generate(url, prefix + cold, 1)["client_s"])
        out["hit"] += [1e3 * _generate(url, prefix + q, 1)["client_s"] for q in (hit_a, hit_b)]
        out["decode16"].append(1e3 * _generate(url, prefix + tail, 16)["client_s"])
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--arms", required=True)
    p.add_argument("--reps", type=int, default=6)
    p.add_argument("--model-path", type=Path, default=Path.home() / ".cache/sglang-replayssm/models/small-gdn")
    p.add_argument("--logs", type=Path, default=Path("out/ttft-arms"))
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    args.logs.mkdir(parents=True, exist_ok=True)
    runs = []
    for i, arm in enumerate(a for a in args.arms.split(",") if a):
        port = pick_port()
        cmd = server_command(ARMS[arm], args.model_path, port, device="cpu", tp=1, extra_args=FLAGS)
        with contextlib.ExitStack() as stack:
            srv = stack.enter_context(ServerProcess(cmd, server_env(ARMS[arm], "cpu"), args.logs / f"{i}-{arm}.log",
                                                    f"http://127.0.0.1:{port}", 600))
            got = times_of(srv.base_url, args.reps)
        runs.append({"arm": arm, "ms": got, "median_ms": {k: statistics.median(v) for k, v in got.items()}})
        print(i, arm, {k: round(v, 1) for k, v in runs[-1]["median_ms"].items()}, flush=True)
    if args.json:
        args.json.write_text(json.dumps(runs, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
