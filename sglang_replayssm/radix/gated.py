"""How every room writes its hooks: :func:`gated_hook` builds one :class:`~sglang_replayssm.hook_table.Hook`
record (target, SGLang ``file:line``, fix switch) whose function runs behind its fix switch, and
:func:`lazy` names a body in a module imported on first use (hooks are registered in processes that
never run them, e.g. the detokenizer, so a room's logic is imported only when a hook fires).

A gated hook with its fix off is SGLang's function: AROUND calls the original with the same
arguments, AFTER changes nothing. ``gate=False`` registers the function as it is (it switches itself).
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from typing import Any

from sglang_replayssm.hook_table import Hook, HookKind
from sglang_replayssm.radix import config

__all__ = ["gated_hook", "lazy"]


def _gated(body: Callable[..., Any], kind: HookKind, fix: str) -> Callable[..., Any]:
    """``body`` behind its fix switch: while ``fix`` is off an AROUND hook calls SGLang's function
    with the same arguments and an AFTER hook changes nothing (SGLang's behaviour)."""
    if kind == "AROUND":

        @functools.wraps(body)
        def around(original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
            if not config.enabled(fix):
                return original(*args, **kwargs)
            return body(original, *args, **kwargs)

        return around
    if kind != "AFTER":
        raise ValueError(f"no switch for a {kind} hook")

    @functools.wraps(body)
    def after(result: Any, *args: Any, **kwargs: Any) -> Any:
        return body(result, *args, **kwargs) if config.enabled(fix) else None

    return after


def gated_hook(target: str, kind: HookKind, body: Callable[..., Any], *, at: str, fix: str | None = None,
               gate: bool = True, name: str | None = None) -> Hook:
    """The :class:`Hook` of ``body`` on ``target`` (registered only while ``fix`` is on) and, with
    ``gate``, run behind that switch; ``name`` defaults to the body's name."""
    fn = _gated(body, kind, fix) if fix is not None and gate else body
    return Hook(target, kind, fn, at, name or body.__name__, fix)


def lazy(module: str, body: str, name: str, doc: str) -> Callable[..., Any]:
    """A hook function named ``name`` that calls ``module.body`` (the module imported on first call)."""

    def hook(*args: Any, **kwargs: Any) -> Any:
        return getattr(importlib.import_module(module), body)(*args, **kwargs)

    hook.__name__, hook.__qualname__, hook.__doc__ = name, name, doc
    return hook
