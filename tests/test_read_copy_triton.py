"""read_copy_decode_triton == read_copy_decode_torch, step by step (interpreted on CPU, compiled on a GPU).

Rows at staggered cursors (flush and non-flush rows in every step, forced flushes in the first
window), NaN in every ring record not yet valid, small shapes (H=1, HV=2, K=V=16, L=4).
"""

from __future__ import annotations

import os

import pytest
import torch

from lab.kernels.read_copy_triton import read_copy_decode_triton
from sglang_replayssm.kernels.read_copy_format import alloc_read_copy
from tests.support.read_copy_bench_drift import make_inputs, rel, run_copy

L = 4

# The inputs are CPU tensors: on CPU the kernel runs interpreted (conftest sets TRITON_INTERPRET=1). On a
# GPU box the compiled kernel is checked against the reference by `lab/scripts/bench_read_copy.py gpu`.
pytestmark = pytest.mark.skipif(
    torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1",
    reason="CPU-interpreter test (GPU check: lab/scripts/bench_read_copy.py gpu)",
)


def _fmt_ok(fmt: str) -> None:
    if fmt == "fp8" and not torch.cuda.is_available():
        try:  # the interpreter needs numpy-side fp8 support
            x = torch.zeros(2, dtype=torch.float8_e4m3fn)
            x.numpy()
        except Exception as e:  # pragma: no cover - depends on the numpy/torch build
            pytest.skip(f"fp8 not available to the Triton interpreter here: {e}")


@pytest.mark.parametrize("is_kda", [False, True])
@pytest.mark.parametrize("fmt", ["bf16", "fp8"])
def test_triton_matches_reference(fmt: str, is_kda: bool) -> None:
    _fmt_ok(fmt)
    inp = make_inputs(2 * L + 3, 4, 1, 2, 16, 16, is_kda, seed=3)
    ref = run_copy(inp, fmt, L)  # type: ignore[arg-type]

    def tri(*args: object, **kw: object) -> object:
        return read_copy_decode_triton(*args, block_v=8, **kw)  # type: ignore[arg-type]

    got = run_copy(inp, fmt, L, decode=tri)  # type: ignore[arg-type]
    err = rel(got.out, ref.out, (3,))  # [T, B, HV]
    flush = torch.zeros(err.shape[:2], dtype=torch.bool)
    for t, r, _ in ref.flushed:
        flush[t, r] = True
    assert float(err[flush].max()) <= 1e-5
    # Non-flush rows read the copy; a checkpoint element within fp32 rounding of a rounding boundary
    # can land one copy ulp apart (2**-8 relative for bf16, one element of K*V): a few such flips.
    assert float(err[~flush].median()) <= 1e-5
    assert float(err[~flush].max()) <= (2e-3 if fmt == "bf16" else 3e-2)
    assert len(got.flushed) == len(ref.flushed) >= 4 * 2
    for (t, r, c), (t2, r2, c2) in zip(got.flushed, ref.flushed, strict=True):
        assert (t, r) == (t2, r2)
        assert float(rel(c, c2)) <= 1e-6


def test_padding_row_zero_and_untouched() -> None:
    inp = make_inputs(1, 2, 1, 2, 16, 16, False)
    n = 3
    state = torch.randn(n, 2, 16, 16)
    copy, _ = alloc_read_copy(n, 2, 16, 16, "bf16", False)
    rings = [torch.full(s, float("nan")) for s in ((n, 2, L, 16), (n, 1, L, 16), (n, 2, L), (n, 2, L, 16), (n, 2, L))]
    before = [t.clone() for t in (state, copy, *rings)]
    out = torch.full((2, 1, 2, 16), 7.0)
    slots = torch.tensor([-1, -1], dtype=torch.int32)
    wp = torch.tensor([0, L - 1], dtype=torch.int32)
    read_copy_decode_triton(inp.qkv[0], inp.a[0], inp.b[0], inp.A_log, inp.dt_bias, 0.25, state, copy, None,
                            *rings, out, slots, wp, use_qk_l2norm_in_kernel=True)  # fmt: skip
    assert torch.all(out == 0)
    for x, y in zip((state, copy, *rings), before, strict=True):
        assert torch.equal(x.nan_to_num(1.5), y.nan_to_num(1.5))
