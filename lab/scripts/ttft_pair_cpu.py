"""Paired one-token prefill times of bench arms on CPU: every arm's server up at once (idle ones sleep), the
same prompts sent to each in rotating order, so host drift hits every arm alike (``decode_ab.prefill_times``:
a 32-token floor, a cold 3,482-token prompt, a hit at 3,332 + 150 new tokens).

    PYTHONPATH=. python lab/scripts/ttft_pair_cpu.py --arms baseline,plugin-norec \
        --variant plugin-norec=plugin:SGLANG_REPLAYSSM_RECORD_TOKENS=0 --reps 10

Prints per arm and kind the median (p10-p90) client ms and, for every arm after the first, the median of its
per-rotation difference to the first arm (ms) with the range of the middle half; ``--json`` writes them all.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gpu_serve"))

from decode_ab import add_variant, prefill_times  # noqa: E402
from ttft_arms_cpu import FLAGS as ONE_AT_A_TIME_FLAGS  # noqa: E402

from sglang_replayssm.bench.arms import ARMS, server_command, server_env  # noqa: E402
from sglang_replayssm.bench.server import ServerProcess, pick_port  # noqa: E402

FLAGS = [*ONE_AT_A_TIME_FLAGS, "--sleep-on-idle"]  # ttft_arms_cpu.py's servers; idle ones sleep while another serves


def paired(times: dict[str, dict[str, list[float]]], ref: str) -> dict[str, dict[str, list[float]]]:
    """Per arm but ``ref`` and kind: [median, p25, p75] of the per-rotation difference to ``ref`` (ms)."""
    out: dict[str, dict[str, list[float]]] = {}
    for arm, kinds in times.items():
        if arm == ref:
            continue
        for kind, ms in kinds.items():
            diffs = [a - b for a, b in zip(ms, times[ref].get(kind, []))]
            if len(diffs) >= 2:
                q = statistics.quantiles(diffs, n=4)
                out.setdefault(arm, {})[kind] = [round(statistics.median(diffs), 2), round(q[0], 2), round(q[2], 2)]
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--arms", required=True, help="the first is the reference of the differences")
    p.add_argument("--variant", action="append", default=[], help="NAME=BASE:VAR=VALUE[,VAR=VALUE] (repeatable)")
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--model-path", type=Path, default=Path.home() / ".cache/sglang-replayssm/models/small-gdn")
    p.add_argument("--logs", type=Path, default=Path("out/ttft-pair"))
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    for spec in args.variant:
        add_variant(spec)
    arms = [a for a in args.arms.split(",") if a]
    args.logs.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        servers: dict[str, tuple[str, Path]] = {}
        for arm in arms:
            port = pick_port()
            log = args.logs / f"{arm}.log"
            cmd = server_command(ARMS[arm], args.model_path, port, device="cpu", tp=1, extra_args=FLAGS)
            srv = stack.enter_context(ServerProcess(cmd, server_env(ARMS[arm], "cpu"), log,
                                                    f"http://127.0.0.1:{port}", 600))
            servers[arm] = (srv.base_url, log)
        result = prefill_times(servers, arms, args.reps)
    result["paired_ms"] = paired(result["all_ms"], arms[0])
    for arm in arms:
        row = {k: f"{v[0]} ({v[1]}-{v[2]})" for k, v in result["summary"][arm].items()}
        print(arm, row, "vs", arms[0], result["paired_ms"].get(arm, "-"), flush=True)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
