"""The whole user-launch matrix of issue 17 (opt-in, slow: GDN ~1.5 min, KDA ~6-8 min a cell on 2 cores).

    SGLANG_REPLAYSSM_MATRIX=1 PYTHONPATH=$PWD .venv/bin/python -m pytest -q tests/test_launch_matrix.py

GDN, KDA x --dtype auto/float16/bfloat16/float32 x no_buffer/extra_buffer x ReplaySSM off/on, each a
plain `python -m sglang.launch_server` with user flags only (sizes, --chunked-prefill-size 512 so the
2048-token prompt is prefilled in chunks), prompts of 280-2048 tokens sharing a prefix. Each cell is
served in full or refused at startup in one line without a traceback; with extra_buffer the later
prompts hit the prefix cache; ReplaySSM on agrees with off (same model/dtype/strategy) within the
dtype's tolerance (fp32: the same tokens). Cells run fp32 first (per model), so every other cell also
records how it compares with the fp32 cell of the same strategy and ReplaySSM setting (``vs_fp32``,
information: fp16/bf16 against fp32 is precision, not the acceptance). SGLANG_REPLAYSSM_MATRIX_OUT (default
/tmp/launch_matrix.json) receives one record per cell.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from sglang_replayssm.bench.server import ServerStartError, log_tail
from sglang_replayssm.models import make_models
from tests.launch_cases import TOLERANCE, differences, serve, user_flags
from tests.support.serve import user_server

pytestmark = [pytest.mark.server,
              pytest.mark.skipif(os.environ.get("SGLANG_REPLAYSSM_MATRIX") != "1",
                                 reason="opt-in: SGLANG_REPLAYSSM_MATRIX=1")]

LENGTHS = [280, 700, 1100, 2048]
OUT = Path(os.environ.get("SGLANG_REPLAYSSM_MATRIX_OUT", "/tmp/launch_matrix.json"))
CELLS = [(m, d, s, r) for m in ("tiny-gdn", "tiny-kda") for d in ("float32", "bfloat16", "float16", "auto")
         for s in ("no_buffer", "extra_buffer") for r in (False, True)]
_results: dict[tuple, dict] = {}


@pytest.fixture(scope="module")
def models() -> dict[str, Path]:
    return make_models(names=["tiny-gdn", "tiny-kda"], log=lambda *a: None)


def _record(cell: tuple, record: dict) -> None:
    _results[cell] = record
    rows = [{"model": c[0], "dtype": c[1], "strategy": c[2], "replayssm": c[3],
             **{k: v for k, v in r.items() if k != "served"}} for c, r in _results.items()]
    OUT.write_text(json.dumps(rows, indent=1) + "\n")


@pytest.mark.parametrize(("model", "dtype", "strategy", "replayssm"), CELLS,
                         ids=[f"{m}-{d}-{s}-{'on' if r else 'off'}" for m, d, s, r in CELLS])
def test_cell(models, tmp_path, model, dtype, strategy, replayssm):
    cell = (model, dtype, strategy, replayssm)
    flags = user_flags(strategy, replayssm, dtype, ["--chunked-prefill-size", "512"])
    log = tmp_path / "server.log"
    try:
        with user_server(models[model], flags, log, timeout_s=600) as url:
            served = serve(url, LENGTHS)
    except ServerStartError:
        last = log_tail(log, 1)
        _record(cell, {"outcome": f"refused: {last}"})
        assert last.startswith("sglang-replayssm") and "Traceback" not in log.read_text(), log_tail(log)
        return
    record: dict = {"outcome": "served", "cached_tokens": [r["cached_tokens"] for r in served], "served": served}
    if strategy == "extra_buffer":
        assert max(record["cached_tokens"][1:]) > 0, record
    off = _results.get((model, dtype, strategy, False))
    if replayssm and off is not None and off.get("served"):
        diff = differences(served, off["served"], TOLERANCE[dtype])
        record["vs_off"] = diff or "agree"
        record["same_tokens_as_off"] = [r["output_ids"] for r in served] == [r["output_ids"] for r in off["served"]]
        if dtype == "float32":
            assert record["same_tokens_as_off"]
        assert diff == [], diff
    fp32 = _results.get((model, "float32", strategy, replayssm))
    if dtype != "float32" and fp32 is not None and fp32.get("served"):
        record["vs_fp32"] = differences(served, fp32["served"], TOLERANCE[dtype]) or "agree"
        record["same_tokens_as_fp32"] = [r["output_ids"] for r in served] == [r["output_ids"] for r in fp32["served"]]
    _record(cell, record)
