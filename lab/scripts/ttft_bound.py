"""The TTFT an arm's prefix hits allow (:mod:`sglang_replayssm.bench.ttft_bound`), from a bench JSON on file.

    python lab/scripts/ttft_bound.py notes/bench-mem-rows-2026-12-05.json --key "run 7" --arm plugin --ref baseline
    python lab/scripts/ttft_bound.py notes/gpu-serve-h200-2026-12-03.json --key "2026-12-06 13:05" \
        --at result/main/0/rag --arm plugin-rec32k

A JSON of ``sglang-replayssm bench`` (``arms`` at the top) or a notes file holding several under keys (``--key``: the
first key starting with it; ``--at``: a path below it), or a workload of ``lab/gpu_serve/main_ab.py`` (``requests``:
per arm, rows of rid, prompt tokens, cached tokens, TTFT ms). ``sglang-replayssm bench`` and ``main_ab.py`` print the
same lines after their tables.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root

from sglang_replayssm.bench.ttft_bound import bound, format_bounds  # noqa: E402


def requests_of(rows: list[Any]) -> list[dict[str, Any]]:
    """Bench records as they are; ``main_ab.py``'s rows ``[rid, prompt, cached, ttft_ms]`` as records."""
    return [r if isinstance(r, dict) else
            {"rid": r[0], "prompt_tokens": r[1], "cached_tokens": r[2], "ttft_s": None if r[3] is None else r[3] / 1e3}
            for r in rows]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("json", type=Path)
    ap.add_argument("--key", default=None, help="in a notes file: the first top-level key starting with this")
    ap.add_argument("--at", default=None, help="then this path of keys / list indexes (a/0/b)")
    ap.add_argument("--arm", default="plugin")
    ap.add_argument("--ref", default="baseline")
    args = ap.parse_args(argv)
    data = json.loads(args.json.read_text())
    if args.key is not None:
        data = data[next(k for k in data if k.startswith(args.key))]
    for part in (args.at or "").split("/"):
        if part:
            data = data[int(part)] if isinstance(data, list) else data[part]
    if isinstance(data.get("requests"), dict):  # main_ab.py: per arm, its rows
        arms = {arm: {"requests": rows} for arm, rows in data["requests"].items()}
    else:
        arms = data.get("arms", data)
    res = bound(requests_of(arms[args.ref]["requests"]), requests_of(arms[args.arm]["requests"]))
    print(json.dumps(res, indent=1))
    print(format_bounds({args.arm: res}, args.ref))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
