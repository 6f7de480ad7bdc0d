"""Lab only: the host time each function of the plugin takes in a server process, exclusive of the plugin's
functions it calls (``LAB_HOST_TIMERS`` = a folder; installed by this folder's ``sitecustomize.py``).

Every function and method defined in a module of ``sglang_replayssm`` (less its CPU runtime and the bench) is
wrapped, as its module is imported, by a timer that adds the wall time between its call and its return, less the
time of the wrapped functions it called, to ``(module:qualname)``. On CUDA the work a function launches runs
later on the device: what is counted is what the host spends (Python and op dispatch) and any host sync inside.
A daemon thread writes ``{name: [calls, exclusive_s]}`` to ``$LAB_HOST_TIMERS/timers-<pid>.json`` every half
second. References taken while a module executes (hook records built at import) keep the unwrapped function:
those calls count for their caller. SGLang's function an AROUND hook is given (its first argument) is timed as
``sglang:<qualname>``, so a hook's own time excludes it. A timer costs about a microsecond a call: ``calls`` says
how many.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import json
import os
import sys
import threading
import time
import types
from typing import Any

PREFIX = "sglang_replayssm."
SKIP = ("sglang_replayssm.cpu", "sglang_replayssm.bench", "sglang_replayssm.settings", "sglang_replayssm.state",
        "sglang_replayssm.hook_table")

_totals: dict[str, list[float]] = {}
_local = threading.local()


def _timed(fn: Any, name: str) -> Any:
    entry = _totals.setdefault(name, [0, 0.0])

    @functools.wraps(fn)
    def timed(*args: Any, **kwargs: Any) -> Any:
        stack = getattr(_local, "stack", None)
        if stack is None:
            stack = _local.stack = []
        stack.append(0.0)
        if args and _is_sglang(args[0]):  # an AROUND hook's original: SGLang's time, not the hook's
            args = (_original(args[0]), *args[1:])
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            dt = time.perf_counter() - t0
            inner = stack.pop()
            entry[0] += 1
            entry[1] += dt - inner
            if stack:
                stack[-1] += dt

    return timed


def _is_sglang(obj: Any) -> bool:
    return callable(obj) and not isinstance(obj, type) and str(getattr(obj, "__module__", "")).startswith("sglang.")


_originals: dict[Any, Any] = {}


def _original(fn: Any) -> Any:
    """SGLang's function an AROUND hook received, timed as ``sglang:<qualname>`` (one wrapper per function)."""
    key = getattr(fn, "__func__", fn)
    if key not in _originals:
        _originals[key] = _timed(key, f"sglang:{getattr(key, '__qualname__', repr(key))}")
    timed = _originals[key]
    owner = getattr(fn, "__self__", None)
    return timed if owner is None else types.MethodType(timed, owner)


def _wrap_module(module: types.ModuleType) -> None:
    name = module.__name__
    for attr, value in list(vars(module).items()):
        if isinstance(value, types.FunctionType) and value.__module__ == name:
            setattr(module, attr, _timed(value, f"{name}:{value.__qualname__}"))
        elif isinstance(value, type) and value.__module__ == name:
            for key, member in list(vars(value).items()):
                if isinstance(member, types.FunctionType) and not key.startswith("__"):
                    try:
                        setattr(value, key, _timed(member, f"{name}:{member.__qualname__}"))
                    except (AttributeError, TypeError):  # frozen or slotted classes keep theirs
                        pass


class _Loader(importlib.abc.Loader):
    def __init__(self, inner: importlib.abc.Loader) -> None:
        self.inner = inner

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return self.inner.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        self.inner.exec_module(module)
        _wrap_module(module)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if not fullname.startswith(PREFIX) or fullname.startswith(SKIP):
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _Loader(spec.loader)
                return spec
        return None


def _dump(folder: str) -> None:
    path = os.path.join(folder, f"timers-{os.getpid()}.json")
    while True:  # the copy: the timed threads add entries meanwhile
        time.sleep(0.5)
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            json.dump({k: list(v) for k, v in list(_totals.items())}, f)
        os.replace(tmp, path)


def install() -> None:
    """With ``LAB_HOST_TIMERS`` set: time every plugin function imported from now on."""
    folder = os.environ.get("LAB_HOST_TIMERS")
    if not folder:
        return
    sys.meta_path.insert(0, _Finder())
    threading.Thread(target=_dump, args=(folder,), daemon=True).start()
