"""The TTFT floor's dependence on depth, on any device: a 24-layer model with tiny-gdn's widths (18 GDN layers,
3:1, like qnext-gdn-24), one real server per arm, the client time of 32-token cold prompts (max_new_tokens 1,
one at a time, 5 unmeasured first), median / p10 / p90. A plugin cost paid per GDN layer shows 9x larger here
than on tiny-gdn (2 GDN layers); on CPU it separates the plugin's Python and torch work from the CUDA path's.

    PYTHONPATH=. python lab/gpu_serve/floor_depth.py --out /tmp/floor \\
        --arms "baseline,plugin,plugin:SGLANG_REPLAYSSM_RECORD_TOKENS=0,baseline"
    CHECK=floor_depth bash scripts/gpu_serve.sh --device cuda --arms ...     # on the lab H200 (--lab)

An arm is ``name[:VAR=value+VAR=value]`` (an arm of ``sglang_replayssm.bench.arms`` and its environment).
"""

from __future__ import annotations

import argparse
import json
import random
import shlex
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from profile_step import _generate  # noqa: E402
from serve_check import LAB_FLAGS  # noqa: E402

from sglang_replayssm.bench.arms import ARMS, server_command, server_env  # noqa: E402
from sglang_replayssm.bench.metrics import percentile  # noqa: E402
from sglang_replayssm.bench.server import ServerProcess, pick_port  # noqa: E402
from sglang_replayssm.models.build import build_model  # noqa: E402
from sglang_replayssm.models.specs import SPECS  # noqa: E402


def deep_model(out: Path) -> Path:
    base = SPECS["tiny-gdn"]
    spec = replace(base, name="deep-gdn-24", mtp=False,
                   shape={**base.shape, "num_hidden_layers": 24, "full_attention_interval": 4})
    return build_model(spec, out)


def floor(model: Path, arm: str, device: str, n: int, log: Path, extra: list[str]) -> dict[str, float | None]:
    name, _, envs = arm.partition(":")
    rng = random.Random(7)
    port = pick_port()
    cmd = server_command(ARMS[name], model, port, device=device, tp=1,
                         extra_args=["--disable-overlap-schedule", "--enable-metrics", "--skip-server-warmup", *extra])
    env = server_env(ARMS[name], device)
    for kv in filter(None, envs.split("+")):
        key, _, value = kv.partition("=")
        env[key] = value
    with ServerProcess(cmd, env, log, f"http://127.0.0.1:{port}", 300) as srv:
        times = [_generate(srv.base_url, [rng.randrange(10, 2000) for _ in range(32)], 1)["client_s"] * 1e3
                 for _ in range(n + 5)][5:]
    return {"p50_ms": percentile(times, 50.0), "p10_ms": percentile(times, 10.0), "p90_ms": percentile(times, 90.0),
            "requests": len(times)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--arms", default="baseline,plugin")
    p.add_argument("--device", default="cpu")
    p.add_argument("--requests", type=int, default=40)
    p.add_argument("--lab", action="store_true", help="the lab H200's flags (scripts/gpu_serve.sh passes it)")
    p.add_argument("--budget-s", type=float, default=1e9, help="start no arm after this many seconds")
    p.add_argument("--model-path", help="ignored (scripts/gpu_serve.sh passes it): the deep model is built here")
    args = p.parse_args(argv)
    t_end = time.monotonic() + args.budget_s
    extra = shlex.split(LAB_FLAGS) if args.lab else []
    args.out.mkdir(parents=True, exist_ok=True)
    model = deep_model(args.out / "models")
    res: dict[str, dict[str, float | None]] = {}
    for i, arm in enumerate(a for a in args.arms.split(",") if a):
        if time.monotonic() > t_end - 60:
            print(arm, "cut by the budget", flush=True)
            continue
        res[f"{i}:{arm}"] = floor(model, arm, args.device, args.requests, args.out / f"server-{i}.log", extra)
        print(arm, {k: round(v or 0.0, 2) for k, v in res[f"{i}:{arm}"].items()}, flush=True)
    (args.out / "floor_depth.json").write_text(json.dumps(res, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
