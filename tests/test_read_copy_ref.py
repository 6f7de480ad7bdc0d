"""read_copy_decode_torch against the fp64 oracle: exact checkpoints at every flush, non-flush outputs
within the copy's precision, error flat with length while a shared low-precision state drifts.

Rows at staggered cursors (every step has flush and non-flush rows), NaN in every ring record that
is not yet valid, realistic gates (decays 0.9-0.9999), q/k normalised in the kernel.
"""

from __future__ import annotations

import pytest
import torch

from sglang_replayssm.kernels.read_copy_format import FP8_MAX, alloc_read_copy, dequantize, quantize
from sglang_replayssm.kernels.read_copy_ref import read_copy_decode_torch
from tests.support.read_copy_bench_drift import make_inputs, rel, run_copy, run_oracle, run_shared

#: Bound on the relative error of one element's read-copy value (bf16: 2**-8; e4m3: 2**-4).
COPY_EPS = {"bf16": 2.0**-8, "fp8": 2.0**-4}


@pytest.fixture(autouse=True, scope="module")
def _one_thread() -> object:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("is_kda", [False, True])
@pytest.mark.parametrize("fmt", ["bf16", "fp8"])
def test_quantize_roundtrip_and_scale_axis(fmt: str, is_kda: bool) -> None:
    S = torch.randn(3, 2, 8, 16) * torch.logspace(-6, 0, 16)  # K columns over six decades
    S[1, 1] = 0.0  # an all-zero head: scale 1, copy 0
    q, sc = quantize(S, fmt, is_kda)  # type: ignore[arg-type]
    back = dequantize(q, sc, is_kda)
    assert torch.all(back[1, 1] == 0)
    if fmt == "bf16":
        assert sc is None and q.dtype == torch.bfloat16
        assert torch.all((back - S).abs() <= S.abs() * COPY_EPS["bf16"])
        return
    assert sc is not None and q.dtype == torch.float8_e4m3fn
    assert tuple(sc.shape) == (3, 2, 8)  # one scale per V row, both models
    group_max = S.abs().amax(dim=-1, keepdim=True)
    assert torch.all(q.float().abs() <= FP8_MAX)
    # every element within half an fp8 step of its group's max, and the group max itself near exact
    assert torch.all((back - S).abs() <= group_max * COPY_EPS["fp8"])
    kept = S.abs() == group_max
    assert torch.all((back - S).abs()[kept] <= S.abs()[kept] * COPY_EPS["fp8"])


@pytest.mark.parametrize("is_kda", [False, True])
@pytest.mark.parametrize("fmt", ["bf16", "fp8"])
def test_flush_exact_and_nonflush_within_copy_precision(fmt: str, is_kda: bool) -> None:
    L = 4
    inp = make_inputs(4 * L + 3, 6, 1, 2, 16, 16, is_kda, seed=1)
    run = run_copy(inp, fmt, L)  # type: ignore[arg-type]
    ref, states = run_oracle(inp, states_at={t for t, _, _ in run.flushed})
    assert len(run.flushed) >= 4 * 6
    for t, r, ckpt in run.flushed:
        assert float(rel(ckpt, states[t][r])) <= 1e-6, (t, r)
    # output error per (step, row): flush rows are exact; non-flush rows carry only the copy's rounding
    err = rel(run.out, ref, (2, 3))  # [T, B]
    flush_mask = torch.zeros_like(err, dtype=torch.bool)
    for t, r, _ in run.flushed:
        flush_mask[t, r] = True
    assert float(err[flush_mask].max()) <= 1e-5
    assert float(err[~flush_mask].max()) <= 4 * COPY_EPS[fmt]
    assert float(err[~flush_mask].max()) > 1e-5  # the copy is really read on non-flush steps


@pytest.mark.parametrize(("fmt", "is_kda"), [("bf16", False), ("fp8", True)])
def test_long_recurrence_copy_flat_shared_drifts(fmt: str, is_kda: bool) -> None:
    T, L = 4096, 16
    inp = make_inputs(T, 2, 1, 1, 32, 32, is_kda, seed=2, b_mean=-4.0)
    run = run_copy(inp, fmt, L)  # type: ignore[arg-type]
    flush_steps = {t for t, _, _ in run.flushed}
    ref, states = run_oracle(inp, states_at=flush_steps)
    _, states32 = run_oracle(inp, torch.float32, states_at=flush_steps)
    # every flushed checkpoint is fp32 decode's; fp32 decode's own distance to fp64 grows with length
    assert max(float(rel(c, states32[t][r])) for t, r, c in run.flushed) <= 1e-6
    fp32_vs_fp64 = max(float(rel(states32[t][r], states[t][r])) for t, r, _ in run.flushed)
    assert max(float(rel(c, states[t][r])) for t, r, c in run.flushed) <= 1.5 * fp32_vs_fp64 + 1e-7
    e_copy = rel(run.out, ref, (1, 2, 3))
    e_shared = rel(run_shared(inp, fmt), ref, (1, 2, 3))  # type: ignore[arg-type]
    first, last = slice(0, T // 32), slice(T - T // 8, T)
    copy_growth = float(e_copy[last].mean() / e_copy[first].mean())
    shared_growth = float(e_shared[last].mean() / e_shared[first].mean())
    assert copy_growth < 1.15, copy_growth  # measured ~1.03 (bf16 GDN)
    assert shared_growth > 1.4, shared_growth  # measured ~1.8 (bf16 GDN), still rising at T
    assert float(e_shared[last].mean()) > 5.0 * float(e_copy[last].mean())


def test_refusals() -> None:
    inp = make_inputs(1, 1, 1, 1, 8, 8, False)
    n, L = 2, 4
    args = dict(
        d_cache=torch.zeros(n, 1, L, 8), k_cache=torch.zeros(n, 1, L, 8), g_cache=torch.zeros(n, 1, L),
        v_cache=torch.zeros(n, 1, L, 8), beta_cache=torch.zeros(n, 1, L), out=torch.empty(1, 1, 1, 8),
        ssm_state_indices=torch.ones(1, dtype=torch.int32), write_pos=torch.zeros(1, dtype=torch.int32),
    )  # fmt: skip
    copy, scales = alloc_read_copy(n, 1, 8, 8, "fp8", False)
    base = (inp.qkv[0], inp.a[0], inp.b[0], inp.A_log, inp.dt_bias, 8**-0.5)
    with pytest.raises(ValueError, match="float32"):
        read_copy_decode_torch(*base, torch.zeros(n, 1, 8, 8, dtype=torch.bfloat16), copy, scales, **args)
    with pytest.raises(ValueError, match="read_copy_scales"):
        read_copy_decode_torch(*base, torch.zeros(n, 1, 8, 8), copy, None, **args)
    with pytest.raises(ValueError, match="v_cache"):
        read_copy_decode_torch(*base, torch.zeros(n, 1, 8, 8), copy, scales, **{**args, "v_cache": torch.zeros(n, 1, 8)})
    read_copy_decode_torch(*base, torch.zeros(n, 1, 8, 8), copy, scales, **args)  # the same call, valid
