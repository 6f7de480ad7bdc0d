"""SGLang 0.5.23's prefill kernels that a record rebuild runs, loaded by path (no SGLang install).

A rebuild (:mod:`sglang_replayssm.radix.records.rebuild`) calls, per GDN layer, SGLang's
``causal_conv1d_fn``, ``fused_gdn_gating`` (the GDN backend's ``_prefill_gates``) and the extend
kernel, FLA's ``chunk_gated_delta_rule`` (``TritonGDNKernel.extend``); KDA's extend is
``chunk_kda`` (``kda_triton.extend``, gates fused in); short spans fold token by token through the
decode kernel ``fused_sigmoid_gating_delta_rule_update`` (GDN and KDA). The GPU box has no SGLang, so, as
:mod:`.ring_decode_baselines` does for the decode kernels, this module imports the Triton files
under their real module names below *stub parent packages* (``sglang/__init__.py`` never runs) from
a folder holding ``sglang/...`` (``.devcarry`` on the GPU box). The conv is SGLang's Triton kernel
(``sglang.kernels.ops.mamba.causal_conv1d_triton``); on CUDA SGLang's ``gdn_backend`` calls its
JIT-built CUDA conv (``sgl_kernel``-style, ``causal_conv1d_fwd``), which needs SGLang's JIT stack
and is not loaded here. Nothing here is SGLang code: it only locates, imports and calls it.

Files a root must hold (relative to ``<root>/sglang/kernels/ops``): ``attention/fla/{utils, op,
index, cumsum, l2norm, wy_fast, chunk_fwd, chunk_delta_h, chunk_o, chunk, chunk_intra,
chunk_intra_token_parallel, fused_norm_gate, fused_recurrent, kda}.py``,
``attention/linear/{fused_gdn_gating, fused_sigmoid_gating_recurrent}.py``,
``mamba/causal_conv1d_triton.py``.
"""

from __future__ import annotations

import importlib
import sys
import types
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

__all__ = ["PREFILL_FILES", "PrefillKernels", "load_prefill_kernels"]

_OPS = "sglang.kernels.ops"
PREFILL_FILES: tuple[str, ...] = tuple(
    f"sglang/kernels/ops/{p}.py"
    for p in (
        *(f"attention/fla/{n}" for n in (
            "utils", "op", "index", "cumsum", "l2norm", "wy_fast", "chunk_fwd", "chunk_delta_h", "chunk_o",
            "chunk", "chunk_intra", "chunk_intra_token_parallel", "fused_norm_gate", "fused_recurrent", "kda")),
        "attention/linear/fused_gdn_gating",
        "attention/linear/fused_sigmoid_gating_recurrent",
        "mamba/causal_conv1d_triton",
    )
)  # fmt: skip


@dataclass
class PrefillKernels:
    """SGLang's callables with their own signatures; ``source`` says where they came from."""

    causal_conv1d_fn: Callable
    fused_gdn_gating: Callable
    chunk_gated_delta_rule: Callable
    chunk_kda: Callable
    fused_sigmoid_gating_delta_rule_update: Callable
    source: str


def _stub(name: str, path: Path | None) -> types.ModuleType:
    mod = sys.modules.get(name)
    if mod is None:
        mod = types.ModuleType(name)
        mod.__path__ = [str(path)] if path is not None else []
        sys.modules[name] = mod
    return mod


def _install_stubs(root: Path) -> None:
    from tests.support.ring_decode_baselines import _install_stubs as decode_stubs

    decode_stubs(root)  # sglang, sglang.kernels(.ops(.attention(.fla|.linear))), sglang.srt(.utils(.common))
    _stub(f"{_OPS}.mamba", root / "sglang/kernels/ops/mamba")
    _stub("sglang.kernels.jit", None)
    jit_utils = _stub("sglang.kernels.jit.utils", None)
    if not hasattr(jit_utils, "is_arch_support_pdl"):
        # What SGLang's versions answer on a CUDA GPU (kernels/jit/utils/arch.py): PDL from sm_90 on.
        def arch() -> types.SimpleNamespace:
            major, minor = torch.cuda.get_device_capability() if torch.cuda.is_available() else (0, 0)
            return types.SimpleNamespace(major=major, minor=minor)

        jit_utils.get_jit_cuda_arch = arch  # type: ignore[attr-defined]
        jit_utils.is_arch_support_pdl = lambda: arch().major >= 9  # type: ignore[attr-defined]
    utils = sys.modules["sglang.srt.utils"]
    if not hasattr(utils, "cdiv"):  # what fused_norm_gate.py imports from sglang.srt.utils
        utils.cdiv = lambda a, b: -(a // -b)  # type: ignore[attr-defined]
        utils.next_power_of_2 = lambda n: 1 << max(0, int(n) - 1).bit_length()  # type: ignore[attr-defined]
        utils.cpu_has_amx_support = lambda: False  # type: ignore[attr-defined]
        utils.is_cpu = lambda: False  # type: ignore[attr-defined]
        utils.is_npu = lambda: False  # type: ignore[attr-defined]
    if not hasattr(utils, "is_sm90_supported"):  # what fused_sigmoid_gating_recurrent.py imports
        cap = torch.cuda.get_device_capability() if torch.cuda.is_available() else (0, 0)
        utils.get_device_sm = lambda: 10 * cap[0] + cap[1]  # type: ignore[attr-defined]
        utils.is_cuda = lambda: torch.cuda.is_available()  # type: ignore[attr-defined]
        utils.is_hip = lambda: False  # type: ignore[attr-defined]
        utils.is_gfx95_supported = lambda: False  # type: ignore[attr-defined]
        utils.is_sm90_supported = lambda: cap[0] == 9  # type: ignore[attr-defined]


def load_prefill_kernels(root: Path | None = None) -> PrefillKernels:
    """SGLang's rebuild kernels: from ``root`` (a folder holding ``sglang/...``) by path, or, with
    ``root=None``, from the installed SGLang package (a normal import)."""
    if root is None:
        source = "installed"
    else:
        root = Path(root).resolve()
        missing = [f for f in PREFILL_FILES if not (root / f).is_file()]
        if missing:
            raise FileNotFoundError(f"{root}: missing SGLang kernel files {missing}")
        _install_stubs(root)
        source = str(root)
    conv = importlib.import_module(f"{_OPS}.mamba.causal_conv1d_triton")
    gating = importlib.import_module(f"{_OPS}.attention.linear.fused_gdn_gating")
    chunk = importlib.import_module(f"{_OPS}.attention.fla.chunk")
    kda = importlib.import_module(f"{_OPS}.attention.fla.kda")
    recurrent = importlib.import_module(f"{_OPS}.attention.linear.fused_sigmoid_gating_recurrent")
    return PrefillKernels(
        causal_conv1d_fn=conv.causal_conv1d_fn,
        fused_gdn_gating=gating.fused_gdn_gating,
        chunk_gated_delta_rule=chunk.chunk_gated_delta_rule,
        chunk_kda=kda.chunk_kda,
        fused_sigmoid_gating_delta_rule_update=recurrent.fused_sigmoid_gating_delta_rule_update,
        source=source,
    )
