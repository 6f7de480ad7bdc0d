"""The bytes model behind the read-copy floors (notes/read-copy.md), by hand at a tiny shape and in order at the real ones."""

from __future__ import annotations

import pytest

from tests.support.kernel_bench import MODELS
from tests.support.read_copy_bench import window_bytes


def test_window_bytes_by_hand() -> None:
    # H=HV=1, K=V=2, L=2 (E=4): the non-flush step (m=0) reads the bf16 copy (8) and writes one full
    # record (d~ 4 + k 8 + g 4 + v 4 + beta 4 = 24); the flush reads the fp32 checkpoint (16) and one raw
    # record (k 8 + g 4 + v 4 + beta 4 = 20) and writes checkpoint (16) and copy (8).
    assert window_bytes("copy_bf16", 1, 1, 2, 2, 2, False) == pytest.approx((32 + 60) / 2)
    assert window_bytes("sglang_packed_bf16", 1, 1, 2, 2, 2, False) == 16


@pytest.mark.parametrize("model", ["gdn", "kda"])
def test_window_bytes_order(model: str) -> None:
    p = MODELS[model]

    def wb(arm: str) -> float:
        return window_bytes(arm, p["H"], p["HV"], p["K"], p["V"], 16, bool(p["is_kda"]))

    assert wb("copy_fp8") < wb("copy_bf16") < wb("ours_fp32") < wb("sglang_packed_fp32")
    # a bf16 copy moves more than SGLang's shared bf16 state and ring: the fp32 flush and the raw records
    assert wb("sglang_rs_bf16") < wb("copy_bf16") < wb("sglang_packed_bf16")
