"""bfloat16 in Triton's interpreter (``TRITON_INTERPRET=1``, how the CPU runtime runs SGLang's Triton kernels).

Triton 3.8's interpreter stores bfloat16 as its raw bits in ``np.uint16`` (runtime/interpreter.py:161)
and so, for bfloat16 operands:

* ``tl.dot`` multiplies the bit patterns as integers (``np.matmul`` on uint16, interpreter.py:705):
  a 16x16x16 bf16 dot is off by ~2e10 where the fp32 dot is exact to 2e-6;
* element-wise arithmetic (``a + b`` ...) is integer arithmetic on the bits;
* fp32 -> bf16 casts truncate (``_convert_float`` without a rounding mode) where compiled Triton
  rounds to nearest even.

That made every SGLang Triton kernel the CPU runtime interprets wrong at bfloat16: Kimi-Linear's MLA
prefill (Triton extend attention) gave first tokens outside fp32's top-5 (logprobs ~1 nat off), while
GDN, whose CPU kernels are torch, served bf16 within 0.04 of fp32. The replacements below compute as
compiled Triton does on a GPU: bf16 operands widened exactly to fp32, ``tl.dot`` accumulated in fp32
(the MMA's accumulator), element-wise results rounded back to bf16 (nearest even), casts rounded to
nearest even (toward zero only where the kernel asks for rtz). Other dtypes reach Triton's own code.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import triton.language as tl
from triton._C.libtriton import ir
from triton.runtime import interpreter

from sglang_replayssm.hook_table import Patch

_Builder = interpreter.InterpreterBuilder
_Handle = interpreter.TensorHandle
_ORIGINAL_DOT = _Builder.create_dot
_ORIGINAL_CAST = _Builder.cast_impl
_ORIGINAL_FP_TO_FP = _Builder.create_fp_to_fp
_ORIGINAL_BINARY = _Builder.binary_op


def bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    """bf16 bit patterns (uint16) -> the exact fp32 values."""
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16(values: np.ndarray, toward_zero: bool = False) -> np.ndarray:
    """fp32 values -> bf16 bit patterns (uint16), rounded to nearest even (torch's cast) or toward zero."""
    f32 = np.ascontiguousarray(values, dtype=np.float32)
    if toward_zero:
        return (f32.view(np.uint32) >> 16).astype(np.uint16)
    return torch.from_numpy(f32).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)


def _is_bf16(handle: Any) -> bool:
    return handle.dtype.scalar == tl.bfloat16


def create_dot(self: Any, a: Any, b: Any, d: Any, input_precision: Any, max_num_imprecise_acc: Any) -> Any:
    """``tl.dot``: bf16 operands widened to fp32 first (the product of two bf16 values is exact in fp32)."""
    if _is_bf16(a):
        a = _Handle(bf16_to_f32(a.data), tl.float32)
    if _is_bf16(b):
        b = _Handle(bf16_to_f32(b.data), tl.float32)
    return _ORIGINAL_DOT(self, a, b, d, input_precision, max_num_imprecise_acc)


def cast_impl(self: Any, src: Any, dst_type: Any) -> Any:
    """Casts between fp32 and bf16 exact (widening) or rounded to nearest even (narrowing)."""
    src_t, dst_t = src.dtype.scalar, dst_type.scalar
    if src_t == tl.float32 and dst_t == tl.bfloat16:
        return _Handle(f32_to_bf16(src.data), tl.bfloat16)
    if src_t == tl.bfloat16 and dst_t == tl.float32:
        return _Handle(bf16_to_f32(src.data), tl.float32)
    return _ORIGINAL_CAST(self, src, dst_type)


def create_fp_to_fp(self: Any, src: Any, dst_type: Any, rounding_mode: Any) -> Any:
    """Explicitly rounded fp32 -> bf16 casts (``fp_downcast_rounding``): rtne or rtz, done exactly."""
    if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
        return _Handle(f32_to_bf16(src.data, toward_zero=rounding_mode == ir.ROUNDING_MODE.RTZ), tl.bfloat16)
    return _ORIGINAL_FP_TO_FP(self, src, dst_type, rounding_mode)


def binary_op(self: Any, lhs: Any, rhs: Any, op: Any) -> Any:
    """bf16 (+ - * / ...) on the values, in fp32, rounded back to bf16 (not on the raw bits)."""
    if not (_is_bf16(lhs) and _is_bf16(rhs)):
        return _ORIGINAL_BINARY(self, lhs, rhs, op)
    out = op(bf16_to_f32(lhs.data), bf16_to_f32(rhs.data))
    if out.dtype == np.bool_:  # comparisons: typed as Triton's own binary_op types them
        return _Handle(out, lhs.dtype.scalar)
    return _Handle(f32_to_bf16(out), tl.bfloat16)


_AT = "triton/runtime/interpreter.py"
_TARGET = "triton.runtime.interpreter.InterpreterBuilder"

#: The interpreter methods replaced (``at``: the Triton line defining each, checked by the tests).
PATCHES: tuple[Patch, ...] = (
    Patch(f"{_TARGET}.create_dot", create_dot, f"{_AT}:705", "interpret-bf16-dot"),
    Patch(f"{_TARGET}.cast_impl", cast_impl, f"{_AT}:528", "interpret-bf16-cast"),
    Patch(f"{_TARGET}.create_fp_to_fp", create_fp_to_fp, f"{_AT}:546", "interpret-bf16-rounding"),
    Patch(f"{_TARGET}.binary_op", binary_op, f"{_AT}:556", "interpret-bf16-arith"),
)
