"""Load SGLang 0.5.23's own Triton ReplaySSM decode kernel, compiled on a GPU or interpreted on CPU.

Triton decides at *decoration* time (``@triton.jit``) whether a kernel is compiled
(``JITFunction``) or interpreted (``InterpretedFunction``): it reads ``TRITON_INTERPRET`` when the
defining module is imported. On a GPU-less machine a module that was imported without the variable
holds kernels that can never run ("0 active drivers"). Without editing SGLang's files,
:func:`load_sglang_triton_module` forces ``triton.knobs.runtime.interpret`` on for the duration of
an import: if the SGLang module is not imported yet, it is imported that way (so SGLang's own
callers get the interpreted kernel as well); if it was already imported in compiled mode, a
*private copy* (same source file, another ``sys.modules`` name) is executed instead and SGLang's
module object is left as it is.

What keeps a Triton kernel from running interpreted, and how each applies here:

* decoration-time interpret switch: handled as above;
* Triton's own ``triton.language.standard`` helpers (``tl.sigmoid``, ``tl.sum``, ``tl.cumsum``...)
  are ``@triton.jit`` functions too; if ``triton`` itself was imported before ``TRITON_INTERPRET``
  was set they are compiled-mode objects and an interpreted kernel calling them fails with
  "Cannot call @triton.jit'd outside of the scope of a kernel". :func:`interpreted_stdlib` makes
  such calls run interpreted for the duration of a launch; the returned decode wrapper uses it;
* ``exp = tl.exp``-style aliases, ``libdevice`` externs, ``@triton.autotune``: the ReplaySSM kernel
  module uses none of them (checked by :func:`interpretable_kernel_names`, which only accepts
  modules whose kernels all became ``InterpretedFunction``);
* ``BKT >= 16`` for ``tl.dot``: with the wrapper's default ``nk=2`` the head dim K must be >= 32
  (the wrapper raises ``ValueError`` otherwise);
* bf16 scalars in the interpreter: use fp32 tensors.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import ModuleType
from typing import Any

import torch

__all__ = [
    "REPLAYSSM_MODULE",
    "interpretable_kernel_names",
    "interpreted_stdlib",
    "load_sglang_triton_module",
    "sglang_replayssm_decode",
    "should_interpret",
]

#: SGLang module holding ``fused_recurrent_linear_replayssm_decode`` and its kernel.
REPLAYSSM_MODULE: str = "sglang.kernels.ops.attention.linear.fused_recurrent_linear_replayssm"
_PRIVATE_PREFIX = "sglang_replayssm._interpreted."

_lock = threading.Lock()
_cache: dict[str, ModuleType] = {}


def should_interpret() -> bool:
    """True when Triton kernels must be interpreted: no CUDA device, or ``TRITON_INTERPRET`` is set."""
    import triton

    return (not torch.cuda.is_available()) or bool(triton.knobs.runtime.interpret)


_stdlib_lock = threading.RLock()
_stdlib_depth = 0
_stdlib_saved_call: Any = None


@contextmanager
def interpreted_stdlib() -> Iterator[None]:
    """Within this context, calling a compiled-mode ``JITFunction`` runs it in the interpreter.

    Needed only when ``triton`` was imported without ``TRITON_INTERPRET`` (then the standard
    library's jit helpers are ``JITFunction`` objects whose ``__call__`` only raises). Compiled
    kernels never go through ``JITFunction.__call__``, so they are unaffected. Re-entrant; the
    original ``__call__`` is restored when the outermost context exits.
    """
    global _stdlib_depth, _stdlib_saved_call
    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    if isinstance(tl.standard.sigmoid, InterpretedFunction):  # triton imported in interpret mode
        yield
        return
    with _stdlib_lock:
        if _stdlib_depth == 0:
            _stdlib_saved_call = JITFunction.__call__

            def _interpreted_call(self: Any, *args: Any, **kwargs: Any) -> Any:
                return _interpreted_twin(self.fn)(*args, **kwargs)

            JITFunction.__call__ = _interpreted_call
        _stdlib_depth += 1
    try:
        yield
    finally:
        with _stdlib_lock:
            _stdlib_depth -= 1
            if _stdlib_depth == 0:
                JITFunction.__call__ = _stdlib_saved_call
                _stdlib_saved_call = None


@functools.cache
def _interpreted_twin(fn: Callable[..., Any]) -> Any:
    from triton.runtime.interpreter import InterpretedFunction

    return InterpretedFunction(fn)


def _kernel_objects(module: ModuleType) -> dict[str, Any]:
    """Triton kernels (jit or interpreted) defined at module level, by global name."""
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    return {
        name: obj
        for name, obj in vars(module).items()
        if isinstance(obj, (JITFunction, InterpretedFunction))
    }


def interpretable_kernel_names(module: ModuleType) -> list[str]:
    """Names of the module's kernels; raises if any of them is not an ``InterpretedFunction``."""
    from triton.runtime.interpreter import InterpretedFunction

    kernels = _kernel_objects(module)
    bad = [n for n, k in kernels.items() if not isinstance(k, InterpretedFunction)]
    if bad:
        raise RuntimeError(f"{module.__name__}: kernels {bad} are compiled, not interpreted")
    return sorted(kernels)


def _exec_private_copy(module_name: str) -> ModuleType:
    import triton

    spec = importlib.util.find_spec(module_name)
    if spec is None or spec.origin is None:
        raise ImportError(f"cannot find {module_name}")
    private_name = _PRIVATE_PREFIX + module_name
    private_spec = importlib.util.spec_from_file_location(private_name, spec.origin)
    assert private_spec is not None and private_spec.loader is not None
    module = importlib.util.module_from_spec(private_spec)
    # Relative imports inside the copy resolve against SGLang's real package.
    module.__package__ = module_name.rpartition(".")[0]
    sys.modules[private_name] = module
    try:
        with triton.knobs.runtime.scope():
            triton.knobs.runtime.interpret = True
            private_spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(private_name, None)
        raise
    interpretable_kernel_names(module)
    return module


def load_sglang_triton_module(module_name: str = REPLAYSSM_MODULE, *, interpret: bool | None = None) -> ModuleType:
    """Import an SGLang Triton-kernel module so that its kernels can run here.

    ``interpret=None`` means :func:`should_interpret`. Without interpretation this is a plain
    ``importlib.import_module``. With it, the already-imported SGLang module is returned if all its
    kernels are interpreted; otherwise a private interpreted copy is built once and cached.
    The returned module's kernels only accept tensors the interpreter can read (CPU tensors, or
    CUDA tensors that it copies to the host).
    """
    if interpret is None:
        interpret = should_interpret()
    if not interpret:
        return importlib.import_module(module_name)
    with _lock:
        if module_name in _cache:
            return _cache[module_name]
        module = sys.modules.get(module_name)
        if module is None:
            import triton

            with triton.knobs.runtime.scope():
                triton.knobs.runtime.interpret = True
                module = importlib.import_module(module_name)
        try:
            interpretable_kernel_names(module)
        except RuntimeError:
            module = _exec_private_copy(module_name)
        _cache[module_name] = module
        return module


def sglang_replayssm_decode(*, interpret: bool | None = None) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    """SGLang's ``fused_recurrent_linear_replayssm_decode`` wrapper, runnable here (see module doc)."""
    if interpret is None:
        interpret = should_interpret()
    module = load_sglang_triton_module(REPLAYSSM_MODULE, interpret=interpret)
    fn = module.fused_recurrent_linear_replayssm_decode
    if not interpret:
        return fn

    @functools.wraps(fn)
    def _decode(*args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        with interpreted_stdlib():
            return fn(*args, **kwargs)

    return _decode
