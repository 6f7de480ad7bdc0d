"""Test-wide setup.

Without a CUDA device, Triton kernels can only run under the interpreter, so it is switched on
before anything imports triton. On a GPU machine the same tests run the compiled kernels.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
