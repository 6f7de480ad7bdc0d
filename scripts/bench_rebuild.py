"""Record-rebuild kernels on the GPU (issue 12): :func:`sglang_replayssm.testing.rebuild_bench.main`.

    python scripts/bench_rebuild.py --sglang-root .devcarry --json notes/rebuild-h200.json
"""

from __future__ import annotations

from sglang_replayssm.testing.rebuild_bench import main

if __name__ == "__main__":
    main()
