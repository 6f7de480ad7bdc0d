"""CPU end to end of the read copy (issue 15): off / bf16 / fp8 / bf16-state servers, one at a time.

    PYTHONPATH=$PWD nice -n 19 .venv/bin/python lab/scripts/read_copy_e2e.py --out notes/read-copy-e2e-cpu.json

Writes per model and arm: greedy agreement with ``off``, the approximate per-token KL from top-k
logprobs, hit rates (tests/support/read_copy_e2e.py says how each is computed).
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: the product, tests.support, lab
from sglang_replayssm.models import make_models  # noqa: E402
from tests.support.read_copy_e2e import ARMS, compare, run_arm  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=Path("notes/read-copy-e2e-cpu.json"))
    ap.add_argument("--models", nargs="+", default=["tiny-gdn", "tiny-kda"])
    ap.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--ring-len", type=int, default=16)
    ap.add_argument("--top-k", type=int, default=10)
    args = ap.parse_args(argv)
    models = make_models(names=args.models, log=lambda *a: None)
    report: dict = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                    "machine": f"{platform.node()} {platform.processor() or platform.machine()}",
                    "command": " ".join(sys.argv), "settings": vars(args) | {"out": str(args.out)}, "models": {}}
    tmp = Path(tempfile.mkdtemp(prefix="read-copy-e2e-"))
    for name in args.models:
        runs, rows = {}, {}
        for arm in ["off", *[a for a in args.arms if a != "off"]]:
            t0 = time.time()
            try:
                runs[arm] = run_arm(models[name], arm, tmp / f"{name}-{arm}.log", n_prompts=args.prompts,
                                    new_tokens=args.new_tokens, ring_len=args.ring_len, top_k=args.top_k)
            except Exception as exc:  # an arm SGLang's CPU path does not serve is reported, not fatal
                rows[arm] = {"error": f"{type(exc).__name__}: {exc}"[:400], "log": str(tmp / f"{name}-{arm}.log")}
                print(name, arm, rows[arm]["error"], flush=True)
                continue
            rows[arm] = compare(runs["off"], runs[arm]) | {"seconds": round(time.time() - t0, 1),
                                                            "read_copy_in_log": runs[arm]["read_copy_in_log"]}
            print(name, arm, {k: v for k, v in rows[arm].items() if k != "first_divergence"}, flush=True)
        report["models"][name] = rows
        args.out.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
