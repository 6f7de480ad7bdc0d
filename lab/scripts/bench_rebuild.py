"""Record-rebuild kernels on the GPU (issue 12): :func:`tests.support.rebuild_bench.main`.

    python lab/scripts/bench_rebuild.py --sglang-root .devcarry --json notes/rebuild-h200.json
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: the product, tests.support, lab
from tests.support.rebuild_bench import main  # noqa: E402

if __name__ == "__main__":
    main()
