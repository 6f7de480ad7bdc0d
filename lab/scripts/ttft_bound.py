"""The TTFT an arm's prefix hits allow (:mod:`sglang_replayssm.bench.ttft_bound`), from a bench JSON on file.

    python lab/scripts/ttft_bound.py notes/bench-mem-rows-2026-12-05.json --key "run 7" --arm plugin --ref baseline

A JSON of ``sglang-replayssm bench`` (``arms`` at the top) or a notes file holding several under keys (``--key``: the
first key starting with it). ``sglang-replayssm bench`` prints the same lines after its table.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root

from sglang_replayssm.bench.ttft_bound import bound, format_bounds  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("json", type=Path)
    ap.add_argument("--key", default=None, help="in a notes file: the first top-level key starting with this")
    ap.add_argument("--arm", default="plugin")
    ap.add_argument("--ref", default="baseline")
    args = ap.parse_args(argv)
    data = json.loads(args.json.read_text())
    if args.key is not None:
        data = data[next(k for k in data if k.startswith(args.key))]
    arms = data.get("arms", data)
    res = bound(arms[args.ref]["requests"], arms[args.arm]["requests"])
    print(json.dumps(res, indent=1))
    print(format_bounds({args.arm: res}, args.ref))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
