"""TP=2 against TP=1 through `sglang-replayssm bench` (issue 16): for each model x workload, ReplaySSM off
(arm `baseline`) and on (arm `plugin`), greedy tokens and per-request cached tokens must be equal.

    python lab/scripts/tp_parity.py --models tiny-gdn tiny-kda --out notes/tp-parity.json

Runs one bench per (model, workload, tp), every server launched as a user would (`--tp 2`, no
environment); writes the JSON after every bench and prints one line per (model, workload, arm).
Slow: 16 CPU servers (a TP=2 one takes minutes to start on a loaded 2-core box).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

WORKLOADS = {
    "gsp": ["--gsp-num-groups", "2", "--gsp-prompts-per-group", "2", "--gsp-system-prompt-len", "256",
            "--gsp-question-len", "32", "--gsp-output-len", "8", "--max-concurrency", "1"],
    "rag": ["--dataset-name", "rag", "--gsp-range-ratio", "0.5", "--rag-num-docs", "4", "--rag-doc-len", "384",
            "--rag-system-prompt-len", "200", "--rag-num-conversations", "3", "--rag-num-turns", "2",
            "--rag-question-len", "32", "--rag-output-len", "8", "--max-concurrency", "1"],
}  # fmt: skip


def _per_request(arm: dict) -> list[tuple]:
    return [(r["rid"], r["cached_tokens"], tuple(r["output_ids"] or ())) for r in arm["requests"]]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=["tiny-gdn", "tiny-kda"])
    ap.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS))
    ap.add_argument("--arms", default="baseline,plugin")
    ap.add_argument("--out", type=Path, default=Path("notes/tp-parity.json"))
    ap.add_argument("--work", type=Path, default=Path("out/tp-parity"))
    args = ap.parse_args()
    res: dict = {"started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "cases": []}
    ok = True
    for model in args.models:
        for wl in args.workloads:
            runs = {}
            for tp in (1, 2):
                js = args.work / f"{model}-{wl}-tp{tp}.json"
                js.parent.mkdir(parents=True, exist_ok=True)
                cmd = [sys.executable, "-m", "sglang_replayssm.cli", "bench", "--tp", str(tp), "--arms", args.arms,
                       "--model-path", model, "--json", str(js), "--disable-tqdm", *WORKLOADS[wl]]  # fmt: skip
                t0 = time.time()
                rc = subprocess.call(cmd)
                runs[tp] = json.loads(js.read_text()) if js.exists() else {}
                print(f"[tp-parity] {model} {wl} tp={tp} rc={rc} {time.time() - t0:.0f}s", flush=True)
            for arm in args.arms.split(","):
                a1, a2 = (runs[tp].get("arms", {}).get(arm) for tp in (1, 2))
                case = {"model": model, "workload": wl, "arm": arm}
                if not a1 or not a2:
                    case["error"] = "an arm did not run"
                    ok = False
                else:
                    p1, p2 = _per_request(a1), _per_request(a2)
                    case.update(requests=len(p1), tokens_equal=[x[2] for x in p1] == [x[2] for x in p2],
                                cached_equal=[x[1] for x in p1] == [x[1] for x in p2],
                                cached_tp1=[x[1] for x in p1], cached_tp2=[x[1] for x in p2],
                                hit_rate_tp1=a1["hit_rate"], hit_rate_tp2=a2["hit_rate"])  # fmt: skip
                    ok = ok and case["tokens_equal"] and case["cached_equal"] and len(p1) > 0
                print(f"[tp-parity] {json.dumps(case)}", flush=True)
                res["cases"].append(case)
            args.out.write_text(json.dumps(res, indent=1))
    res["all_equal"] = ok
    args.out.write_text(json.dumps(res, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
