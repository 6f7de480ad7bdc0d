"""The record rebuild's kernels on the GPU (issue 12): SGLang's prefill kernels (Triton conv, GDN gates,
FLA chunk / KDA chunk) over spans of n records, as ``record_rebuild._fold_gdn_layer`` calls them,
against the fp64 oracle (``kernels/naive.py``), for Qwen3-Next GDN and Kimi-Linear KDA shapes.

Skips without CUDA. SGLang's kernel files come from ``SGLANG_REPLAYSSM_SGLANG_ROOT`` (a folder holding
``sglang/...``, ``.devcarry`` on the GPU box) or, unset, from the installed SGLang.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

#: bf16 operands in the chunk kernels' tensor-core products (k, w, u, the state in v_new = u - w h):
#: between 1e-3 and 1e-2 relative is what bf16 operands give (the fp32 recurrence is far below).
TOL = 1e-2


@pytest.fixture(scope="module")
def kern() -> Any:
    from tests.support.sglang_prefill_kernels import load_prefill_kernels

    root = os.environ.get("SGLANG_REPLAYSSM_SGLANG_ROOT")
    return load_prefill_kernels(Path(root) if root else None)


@pytest.mark.parametrize("model", ["gdn", "kda"])
@pytest.mark.parametrize("n", [1, 3, 4, 64, 65, 130])
def test_rebuild_from_a_state_matches_the_fp64_oracle(kern: Any, model: str, n: int) -> None:
    from tests.support.rebuild_bench import RebuildProblem

    pb = RebuildProblem(kern, model, B=4, n_max=130, sets=2, seed=n)
    pb.prepare(n)
    res = pb.check(1)
    print(model, n, res)
    assert res["finite"] and res["window_equal"]
    assert res["state_rel"] <= TOL and res["state_rel_worst_seq"] <= TOL
    assert res["state_rel"] <= 0.1 * res["state_change_rel"]  # the span's records were folded, in order


@pytest.mark.parametrize("model", ["gdn", "kda"])
def test_rebuild_from_the_root_matches_the_fp64_oracle(kern: Any, model: str) -> None:
    """A span from depth 0: the slot cleared (``clear_slots``), no initial conv window."""
    from tests.support.rebuild_bench import RebuildProblem

    pb = RebuildProblem(kern, model, B=3, n_max=70, sets=1, seed=11)
    pb.prepare(70)
    dst = pb.dst[0].long()
    pb.ssm[dst] = 0.0
    pb.conv_pool[dst] = float("nan")  # never read without an initial state
    pb.fold(0, has_state=torch.zeros(pb.B, dtype=torch.bool, device="cuda"))
    torch.cuda.synchronize()
    HV, V, K = pb.p["HV"], pb.p["V"], pb.p["K"]
    zero_state = torch.zeros(pb.B, HV, V, K, dtype=torch.float64, device="cuda")
    zero_win = torch.zeros(pb.B, pb.D, pb.p["W"] - 1, dtype=torch.bfloat16, device="cuda")
    want, want_win = pb.oracle(0, zero_state, zero_win)
    got = pb.ssm[dst].double()
    assert float((got - want).norm() / want.norm()) <= TOL
    assert torch.equal(pb.conv_states()[dst].double(), want_win)



@pytest.mark.parametrize("model", ["gdn", "kda"])
@pytest.mark.parametrize("n", [1, 4, 33, 64])
def test_sequential_rebuild_is_as_close_to_fp64_as_the_chunk_path(kern: Any, model: str, n: int) -> None:
    """The short-span path (``record_rebuild``: SGLang's decode kernel over the spans, gates fused, the
    state in fp32 token by token) on the same spans as the chunk path: no further from the fp64 oracle
    (both share the conv's bf16 output; the chunk kernels add bf16 tensor-core operands)."""
    from tests.support.rebuild_bench import RebuildProblem

    pb = RebuildProblem(kern, model, B=4, n_max=64, sets=2, seed=n)
    pb.prepare(n)
    chunk = pb.check(1)
    seq = pb.check(1, sequential=True)  # check() copies the ancestor first: the same start
    print(model, n, "chunk", chunk, "sequential", seq)
    assert seq["finite"] and seq["window_equal"]
    assert seq["state_rel"] <= TOL and seq["state_rel"] <= 0.1 * seq["state_change_rel"]
    assert seq["state_rel"] <= 1.25 * chunk["state_rel"]
