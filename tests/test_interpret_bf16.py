"""bfloat16 under Triton's interpreter (cpu/interpret_bf16.py): dot, casts and arithmetic as compiled Triton
computes them. Without the patches a 16x16x16 bf16 ``tl.dot`` is off by ~2e10 (the bit patterns are
multiplied as integers), which made Kimi-Linear's interpreted MLA prefill wrong at --dtype bfloat16."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
import torch
import triton
import triton.language as tl

from sglang_replayssm import hook_table
from sglang_replayssm.cpu import interpret_bf16

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="the Triton interpreter runs on CPU tensors")


@triton.jit
def _dot_kernel(a_ptr, b_ptr, o_ptr, N: tl.constexpr):
    r = tl.arange(0, N)
    a = tl.load(a_ptr + r[:, None] * N + r[None, :])
    b = tl.load(b_ptr + r[:, None] * N + r[None, :])
    tl.store(o_ptr + r[:, None] * N + r[None, :], tl.dot(a, b))


@triton.jit
def _cast_add_kernel(x_ptr, y_ptr, cast_ptr, sum_ptr, N: tl.constexpr):
    r = tl.arange(0, N)
    x = tl.load(x_ptr + r)  # fp32
    y = tl.load(y_ptr + r)  # bf16
    xb = x.to(tl.bfloat16)
    tl.store(cast_ptr + r, xb)
    tl.store(sum_ptr + r, xb + y)


@pytest.fixture(scope="module", autouse=True)
def patched() -> None:
    hook_table.apply_patches(interpret_bf16.PATCHES)


def test_bf16_dot_accumulates_the_values_in_fp32():
    gen = torch.Generator().manual_seed(0)
    a, b = (torch.randn(16, 16, generator=gen).bfloat16() for _ in range(2))
    out = torch.empty(16, 16)
    _dot_kernel[(1,)](a, b, out, 16)
    torch.testing.assert_close(out, a.float() @ b.float(), rtol=1e-5, atol=1e-5)


def test_bf16_casts_round_to_nearest_even_and_arithmetic_uses_the_values():
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(64, generator=gen) * 3
    y = torch.randn(64, generator=gen).bfloat16()
    cast, total = torch.empty(64, dtype=torch.bfloat16), torch.empty(64, dtype=torch.bfloat16)
    _cast_add_kernel[(1,)](x, y, cast, total, 64)
    assert torch.equal(cast, x.bfloat16())  # torch rounds to nearest even, as compiled Triton does
    assert torch.equal(total, (x.bfloat16().float() + y.float()).bfloat16())


def test_rtz_cast_truncates():
    x = torch.tensor([1.0 + 2 ** -8 + 2 ** -9, -(1.0 + 2 ** -8 + 2 ** -9)])  # above the bf16 halfway point
    bits = interpret_bf16.f32_to_bf16(x.numpy(), toward_zero=True)
    assert torch.from_numpy(interpret_bf16.bf16_to_f32(bits)).tolist() == [1.0, -1.0]
    assert torch.equal(torch.from_numpy(interpret_bf16.bf16_to_f32(interpret_bf16.f32_to_bf16(x.numpy()))),
                       x.bfloat16().float())


ORIGINALS = {"create_dot": interpret_bf16._ORIGINAL_DOT, "cast_impl": interpret_bf16._ORIGINAL_CAST,
             "create_fp_to_fp": interpret_bf16._ORIGINAL_FP_TO_FP, "binary_op": interpret_bf16._ORIGINAL_BINARY}


@pytest.mark.parametrize("patch", interpret_bf16.PATCHES, ids=lambda p: p.name)
def test_patch_names_the_triton_def_line(patch):
    owner, attr = patch.target.rsplit(".", 1)
    original = ORIGINALS[attr]
    path, line = patch.at.rsplit(":", 1)
    assert inspect.getsourcefile(original) == str(Path(triton.__file__).parent.parent / path)
    assert inspect.getsourcelines(original)[1] == int(line), patch.at
    assert hook_table.live_attr(patch.target) is patch.value
