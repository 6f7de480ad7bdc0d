"""The index math of the read copy's tensor-core flush (``lab/kernels/csrc/read_copy.cu`` ``flush_item_tc``),
emulated lane by lane with PTX's mma fragment layouts (``testing/read_copy_tc_emulator.py``), equals
the sequential exact replay, for every record count a window allows, rings past the cursor garbage."""

from __future__ import annotations

import numpy as np
import pytest

from tests.support.read_copy_tc_emulator import flush_item_sequential, flush_item_tc_emulated


@pytest.mark.parametrize("m", [0, 1, 7, 8, 15])
def test_gram_flush_equals_the_sequential_replay(m: int) -> None:
    rng = np.random.default_rng(m)
    S0 = rng.standard_normal((128, 128)) * 0.3
    K = rng.standard_normal((16, 128))
    K /= np.linalg.norm(K, axis=1, keepdims=True)
    v = rng.standard_normal((16, 128))
    beta = rng.uniform(0.05, 1.0, 16)
    g = np.log(rng.uniform(0.9, 0.9999, 16))
    q = rng.standard_normal(128) / np.sqrt(128)
    live = np.arange(16) <= m
    garbage = np.where(live[:, None], 0.0, 1e30)  # steps past m: what the kernel must not read
    o, S = flush_item_tc_emulated(S0, K + garbage, v + garbage, np.where(live, beta, 7.0), np.where(live, g, 3.0), q, m)
    o_ref, S_ref = flush_item_sequential(S0, K, v, beta, g, q, m)
    assert np.linalg.norm(S - S_ref) / np.linalg.norm(S_ref) < 1e-12
    assert np.linalg.norm(o - o_ref) / np.linalg.norm(o_ref) < 1e-12
