"""vLLM's packed GDN decode kernel (``fused_recurrent_gated_delta_rule_packed_decode``), loaded from a carry
folder for side-by-side benchmarks, with no vLLM install.

``lab/scripts/vllm_carry.sh`` builds the folder (default ``.gpucarry/vllm_fla``): the few ``.py`` files of
vLLM's wheel that define the kernel (its flash-linear-attention ops: ``fused_recurrent.py`` and the modules
it imports), under their real package path, beside a minimal stub of the vLLM modules they import
(``vllm.platforms.current_platform``, ``vllm.triton_utils``, ``vllm.utils.platform_utils``: answers from
torch and triton), and ``MODULE`` (the dotted name of the kernel's module). Nothing here is vLLM code: it
only imports and calls it. The stub package is what ``import vllm`` finds in this process afterwards, so
this refuses to run where a real vLLM is already imported.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

__all__ = ["DEFAULT_CARRY", "load_vllm_packed_decode"]

DEFAULT_CARRY = Path(".gpucarry/vllm_fla")


def load_vllm_packed_decode(carry: Path = DEFAULT_CARRY) -> Callable:
    """vLLM's ``fused_recurrent_gated_delta_rule_packed_decode(mixed_qkv, a, b, A_log, dt_bias, scale,
    initial_state, out, ssm_state_indices, use_qk_l2norm_in_kernel=False)`` from ``carry`` (SGLang's packed
    decode's signature). Its kernels are compiled or interpreted as ``TRITON_INTERPRET`` says at first load.
    ``FileNotFoundError`` when the carry is absent."""
    carry = Path(carry).resolve()
    marker = carry / "MODULE"
    if not marker.is_file():
        raise FileNotFoundError(f"{marker} not found: build the carry with lab/scripts/vllm_carry.sh")
    name = marker.read_text().strip()
    have = sys.modules.get("vllm")
    if have is not None and not getattr(have, "VLLM_FLA_STUB", False):
        raise RuntimeError("a real vllm is imported in this process: load its kernel from it instead")
    sys.path.insert(0, str(carry))
    try:
        mod = importlib.import_module(name)
    finally:
        sys.path.remove(str(carry))
    if _interpreting():
        _late_bound_aliases(mod)
    return mod.fused_recurrent_gated_delta_rule_packed_decode


def _interpreting() -> bool:
    import triton

    return bool(triton.knobs.runtime.interpret)


def _late_bound_aliases(mod: ModuleType) -> None:
    """Rebind the module's ``exp = tl.exp``-style aliases to look ``tl.<name>`` up at call time: the interpreter
    patches the attributes of ``triton.language`` for the duration of a launch, not copies taken at import."""
    import triton.language as tl

    for name, member in list(vars(mod).items()):
        if not tl.core.is_builtin(member):
            continue
        for ns in (tl, tl.math):
            attr = next((a for a, m in vars(ns).items() if m is member), None)
            if attr is not None:
                setattr(mod, name, lambda *a, _ns=ns, _attr=attr, **k: getattr(_ns, _attr)(*a, **k))
                break
