"""Switches for the radix adapter: one per fix, so every fix can be A/B'd against SGLang.

The names, types, defaults and docs live in the registry, :mod:`sglang_replayssm.settings`; this
module holds the process's state of the fixes and the read-copy mode on top of it.

Environment (read once per process, inherited by SGLang's spawned scheduler processes):

* ``SGLANG_REPLAYSSM_ADAPTER=0`` turns the whole adapter off: :func:`hooks.register` installs
  nothing, so SGLang runs exactly as shipped (the CPU runtime's own fixes, :data:`RUNTIME_FIXES`, stay on).
* ``SGLANG_REPLAYSSM_DISABLE_FIXES=a,b`` turns single fixes off (names in :data:`FIXES`); a
  disabled fix's hook calls straight through to SGLang's function with the same arguments.

* ``SGLANG_REPLAYSSM_READ_COPY=off|bf16|fp8`` (default ``off``): the decode ring's non-flush steps
  read a low-precision read copy of each slot's fp32 checkpoint (bf16, or fp8 e4m3 with fp32
  per-row scales); flushes replay the raw records against the fp32 checkpoint, so flushed
  checkpoints are those of fp32 decode (:mod:`read_copy`). Refused at startup in one line where
  it cannot be exact or run (:func:`sglang_replayssm.radix.read_copy.refusal`).

Tests flip fixes at run time with :func:`override` (the read copy with :func:`override_read_copy`);
hooks read :func:`enabled` on every call, so an installed hook with its fix off is a pure
pass-through (SGLang's behaviour).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from sglang_replayssm import settings

__all__ = [
    "ADAPTER_ENV",
    "DISABLE_ENV",
    "FIXES",
    "RUNTIME_FIXES",
    "READ_COPY_ENV",
    "READ_COPY_MODES",
    "adapter_enabled",
    "cuda_kernels_enabled",
    "enabled",
    "enabled_fixes",
    "override",
    "override_read_copy",
    "read_copy_mode",
    "reload",
]

ADAPTER_ENV = settings.ADAPTER.name
READ_COPY_ENV = settings.READ_COPY.name
#: The values of :data:`READ_COPY_ENV` (``off``: no read copy, today's fp32 ring decode).
READ_COPY_MODES = settings.READ_COPY_MODES
DISABLE_ENV = settings.DISABLE_FIXES.name

#: Every fix the adapter can make, with what it changes (the keys are the switch names; the registry,
#: with each fix's group, is :data:`sglang_replayssm.settings.FIXES`).
FIXES: dict[str, str] = {fix.name: fix.doc for fix in settings.FIXES}

_state: dict[str, bool] | None = None
_read_copy: str | None = None


def cuda_kernels_enabled() -> bool:
    """False when ``SGLANG_REPLAYSSM_CUDA_KERNELS`` is ``0``: the ring decode's default launch then
    never picks the CUDA passes (read on every call)."""
    return settings.CUDA_KERNELS.value()


def adapter_enabled() -> bool:
    """False when ``SGLANG_REPLAYSSM_ADAPTER`` is ``0``/``false``/``off``/``no``."""
    return settings.ADAPTER.value()


#: Fixes of the CPU runtime (cpu/), not of the adapter: ``SGLANG_REPLAYSSM_ADAPTER=0`` leaves them on (without
#: them SGLang cannot serve that path on CPU at all); only ``SGLANG_REPLAYSSM_DISABLE_FIXES`` turns them off.
RUNTIME_FIXES = tuple(fix.name for fix in settings.FIXES if fix.runtime)


def read_copy_mode() -> str:
    """The read-copy mode of this process (:data:`READ_COPY_MODES`), read once from
    :data:`READ_COPY_ENV`; an unknown value is a ``ValueError`` naming the valid ones (a startup
    refusal: :func:`sglang_replayssm.radix.read_copy.refusal`). ``off`` while the adapter is off."""
    global _read_copy
    if _read_copy is None:
        value = settings.READ_COPY.value()
        _read_copy = value if adapter_enabled() else "off"
    return _read_copy


@contextmanager
def override_read_copy(mode: str) -> Iterator[None]:
    """Temporarily set the read-copy mode (tests); restores the previous one on exit."""
    global _read_copy
    if mode not in READ_COPY_MODES:
        raise ValueError(f"unknown read-copy mode {mode!r}")
    saved = _read_copy
    _read_copy = mode
    try:
        yield
    finally:
        _read_copy = saved


def _from_env() -> dict[str, bool]:
    disabled = settings.DISABLE_FIXES.value()
    on = adapter_enabled()
    return {name: (on or name in RUNTIME_FIXES) and name not in disabled for name in FIXES}


def _current() -> dict[str, bool]:
    global _state
    if _state is None:
        _state = _from_env()
    return _state


def reload() -> list[str]:
    """Re-read the environment (e.g. after a test changed it); returns the enabled fixes."""
    global _state, _read_copy
    _state = _from_env()
    _read_copy = None
    return enabled_fixes()


def enabled(fix: str) -> bool:
    """Whether ``fix`` is on in this process (a KeyError for an unknown name is a bug)."""
    return _current()[fix]


def enabled_fixes() -> list[str]:
    """Names of the fixes that are on, in :data:`FIXES` order."""
    state = _current()
    return [name for name in FIXES if state[name]]


@contextmanager
def override(all_fixes: bool | None = None, **fixes: bool) -> Iterator[None]:
    """Temporarily set fixes: ``override(False)`` is SGLang's behaviour, ``override(True,
    cursor_reset=False)`` everything but one fix. Restores the previous state on exit."""
    global _state
    unknown = set(fixes) - set(FIXES)
    if unknown:
        raise KeyError(f"unknown fix name(s) {sorted(unknown)}")
    saved = dict(_current())
    new = dict(saved) if all_fixes is None else dict.fromkeys(FIXES, bool(all_fixes))
    new.update({k: bool(v) for k, v in fixes.items()})
    _state = new
    try:
        yield
    finally:
        _state = saved
