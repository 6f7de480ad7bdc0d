"""One record for every change the package makes to SGLang 0.5.23 at run time, and the code that makes it.

Two kinds of record, each naming its SGLang anchor once (``at``, ``"sglang/<file>.py:<line>"``):

* :class:`Hook`: a function/method hook through SGLang's ``HookRegistry`` (BEFORE / AFTER / AROUND /
  REPLACE). ``at`` is the line of the target's ``def`` in the installed SGLang.
* :class:`Patch`: a direct attribute assignment, only where ``HookRegistry`` cannot express the change
  (a class attribute, a method of torch's C tensor type). ``at`` is the SGLang line that makes it
  necessary (the attribute's definition, or the call that needs it) and mentions the attribute.

``tests/test_hook_table.py`` checks every record of ``cpu/`` and ``radix/`` against the installed
SGLang. The tables live beside their hook functions (each radix room's ``hooks.py``, ``cpu/hooks*.py``).

One hook per target: where several hooks share a target (:data:`hook_order.ORDER`), :func:`register`
gives HookRegistry one AROUND :class:`ComposedHook` for it, which runs them in the written order with
HookRegistry's own semantics, so SGLang sees one hook per target. Hooks of one target registered by
different calls (the CPU runtime's and the radix adapter's entry points) join the same composed hook
until it is applied.

Idempotence: :func:`register` skips a hook that is already applied (found in the live wrapper chain)
or that this process registered and has not applied yet, so registering twice, or again after
``HookRegistry.reset()`` (which forgets registrations but does not undo patches), wraps nothing twice.
"""

from __future__ import annotations

import functools
import inspect
import pkgutil
import sys
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from sglang_replayssm.hook_order import ORDER

__all__ = [
    "ComposedHook",
    "Hook",
    "HookKind",
    "Patch",
    "applied",
    "apply_patches",
    "install",
    "live_attr",
    "register",
    "wrapped_hooks",
]

HookKind = Literal["AROUND", "BEFORE", "AFTER", "REPLACE"]


@dataclass(frozen=True)
class Hook:
    """One HookRegistry hook.

    ``target``: the dotted path HookRegistry resolves; ``kind``: a ``HookType`` member name; ``fn``: the
    hook function (signature per ``HookType``); ``at``: ``"sglang/<file>.py:<line>"`` of the target's
    ``def``; ``name``: a short name for the load log line; ``fix``: the radix fix switch
    (``radix/config.py``) without which the hook is not registered, None for always.
    """

    target: str
    kind: HookKind
    fn: Callable[..., Any]
    at: str
    name: str
    fix: str | None = None


@dataclass(frozen=True)
class Patch:
    """One direct attribute assignment: ``target`` (dotted path of the attribute) is set to ``value``.

    ``at``: ``"sglang/<file>.py:<line>"`` of the SGLang line that needs it (it mentions the attribute);
    ``name``: a short name for the load log line.
    """

    target: str
    value: Any
    at: str
    name: str


def _wrap(kind: HookKind, fn: Callable[..., Any], inner: Callable[..., Any]) -> Callable[..., Any]:
    """``inner`` wrapped by one hook, with HookRegistry's semantics for its kind: BEFORE may return
    ``(args, kwargs)`` to change the call, AFTER may return a new result (None keeps it), AROUND
    receives ``inner`` first."""
    if kind == "BEFORE":

        def before(*args: Any, **kwargs: Any) -> Any:
            changed = fn(*args, **kwargs)
            if changed is not None:
                args, kwargs = changed
            return inner(*args, **kwargs)

        wrapper = before
    elif kind == "AFTER":

        def after(*args: Any, **kwargs: Any) -> Any:
            result = inner(*args, **kwargs)
            modified = fn(result, *args, **kwargs)
            return modified if modified is not None else result

        wrapper = after
    elif kind == "AROUND":

        def around(*args: Any, **kwargs: Any) -> Any:
            return fn(inner, *args, **kwargs)

        wrapper = around
    else:
        raise ValueError(f"a {kind} hook cannot be composed")
    return functools.wraps(inner)(wrapper)


class ComposedHook:
    """One AROUND hook that runs the hooks of one target in a written order (``order``: their names,
    outermost first), as HookRegistry would have stacked them had they been registered innermost first.

    ``members`` (outermost first) may grow until the hook is applied; the wrapper chain around SGLang's
    function is built on the first call and rebuilt only if that function changes.
    """

    def __init__(self, target: str, order: Sequence[str]) -> None:
        self.target = target
        self.order = tuple(order)
        self.members: tuple[Hook, ...] = ()
        self._chain: tuple[Callable[..., Any], Callable[..., Any]] | None = None
        self.__name__ = self.__qualname__ = f"composed[{', '.join(self.order)}]"

    def add(self, hook: Hook) -> None:
        """Put ``hook`` at its place in :attr:`order` (a name not listed there is refused)."""
        if hook.target != self.target or hook.name not in self.order:
            raise ValueError(f"{hook.name} on {hook.target} is not in the hook order of {self.target}")
        self.members = tuple(sorted((*self.members, hook), key=lambda h: self.order.index(h.name)))
        self._chain = None

    def chain(self, original: Callable[..., Any]) -> Callable[..., Any]:
        """``original`` wrapped by every member, the first member outermost."""
        cached = self._chain
        if cached is None or cached[0] is not original:
            wrapped = original
            for member in reversed(self.members):
                wrapped = _wrap(member.kind, member.fn, wrapped)
            cached = self._chain = (original, wrapped)
        return cached[1]

    def __call__(self, original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return self.chain(original)(*args, **kwargs)


#: (target, hook function) pairs registered by this process and not applied by :func:`install` yet.
_pending: set[tuple[str, Callable[..., Any]]] = set()
#: target -> the composed hook registered for it by this process, while members may still join it.
_composed: dict[str, ComposedHook] = {}


def live_attr(target: str, *, import_modules: bool = True) -> Any:
    """The object currently at ``target`` (a classmethod/staticmethod unwrapped to its function).

    With ``import_modules=False`` nothing is imported: a target whose module is not imported yet
    cannot have been patched, and None is returned (keeps :func:`register` cheap in processes that
    never import the runtime, e.g. the detokenizer). None also when an attribute on the way is missing.
    """
    owner_path, name = target.rsplit(".", 1)
    owner: Any
    if import_modules:
        owner = pkgutil.resolve_name(owner_path)
    else:
        parts = owner_path.split(".")
        for i in range(len(parts), 0, -1):
            module = sys.modules.get(".".join(parts[:i]))
            if module is not None:
                break
        else:
            return None
        owner = module
        for attr in parts[i:]:
            owner = getattr(owner, attr, None)
            if owner is None:
                return None
    raw = owner.__dict__.get(name) if isinstance(owner, type) else None
    if isinstance(raw, (classmethod, staticmethod)):
        return raw.__func__
    return getattr(owner, name, None)


def wrapped_hooks(live: Any) -> list[Callable[..., Any]]:
    """The hook functions in the wrapper chain HookRegistry built at ``live``, outermost first.

    HookRegistry keeps no public record of what it applied (its ``_hooks`` are pending registrations,
    cleared by ``reset()``; the wrappers are the only trace of an applied hook). Each wrapper of
    ``hook_registry._wrap_fn`` sets ``__wrapped__`` (the functools convention) and holds its hook as a
    closure variable, read here through ``inspect.getclosurevars``. This is the one place that
    knows that shape. A :class:`ComposedHook` is listed, then its members, outermost first.
    """
    found: list[Callable[..., Any]] = []
    fn, depth = live, 0
    while callable(fn) and depth < 64:
        if inspect.isfunction(fn):
            try:
                hook = inspect.getclosurevars(fn).nonlocals.get("hook")
            except ValueError:  # an empty closure cell: not a HookRegistry wrapper
                hook = None
            if hook is not None:
                found.append(hook)
                if isinstance(hook, ComposedHook):
                    found.extend(member.fn for member in hook.members)
        fn, depth = getattr(fn, "__wrapped__", None), depth + 1
    return found


def applied(hooks: Iterable[Hook], *, import_modules: bool = True) -> list[Hook]:
    """The hooks of ``hooks`` currently patched into SGLang in this process
    (``import_modules=False``: looking only at modules already imported)."""
    out = []
    for hook in hooks:
        try:
            live = live_attr(hook.target, import_modules=import_modules)
        except (ImportError, AttributeError, ValueError):
            continue
        if live is not None and any(fn is hook.fn for fn in wrapped_hooks(live)):
            out.append(hook)
    return out


def register(hooks: Iterable[Hook], fixes: Collection[str] | None = None) -> list[Hook]:
    """Register with HookRegistry every hook whose fix is in ``fixes`` (None: every hook); returns
    the hooks registered now.

    Idempotent: a hook already applied, or registered by this process and not yet applied, is
    skipped. A hook whose target is in :data:`hook_order.ORDER` joins that target's composed hook. SGLang applies the registry after its plugins have registered (``load_plugins``).
    """
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    wanted = [h for h in hooks if fixes is None or h.fix is None or h.fix in fixes]
    live = {id(h) for h in applied(wanted, import_modules=False)}
    out = []
    for hook in wanted:
        key = (hook.target, hook.fn)
        if id(hook) in live or key in _pending:
            continue
        if hook.target in ORDER:
            _composed_for(hook.target).add(hook)
        else:
            HookRegistry.register(hook.target, hook.fn, HookType[hook.kind])
        _pending.add(key)
        out.append(hook)
    return out


def _composed_for(target: str) -> ComposedHook:
    """The composed hook of ``target`` that new members join: the one registered by this process unless
    it is applied already (then a new one is registered)."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    composed = _composed.get(target)
    if composed is not None:
        live = live_attr(target, import_modules=False)
        if live is None or not any(fn is composed for fn in wrapped_hooks(live)):
            return composed
    composed = _composed[target] = ComposedHook(target, ORDER[target])
    HookRegistry.register(target, composed, HookType.AROUND)
    return composed


def install(hooks: Collection[Hook], fixes: Collection[str] | None = None) -> list[Hook]:
    """Register and apply ``hooks`` now, then clear the registry; returns those applied.

    For tests and scripts, where no ``load_plugins`` runs. Applying is permanent for the process
    (``HookRegistry.reset()`` forgets registrations, not patches). Idempotent like :func:`register`.
    """
    from sglang.srt.plugins.hook_registry import HookRegistry

    register(hooks, fixes)
    HookRegistry.apply_hooks()
    HookRegistry.reset()
    _pending.clear()
    _composed.clear()
    return applied(hooks)


def apply_patches(patches: Iterable[Patch]) -> list[str]:
    """Set every patch's attribute to its value (idempotent); returns their names."""
    names = []
    for patch in patches:
        owner_path, attr = patch.target.rsplit(".", 1)
        setattr(pkgutil.resolve_name(owner_path), attr, patch.value)
        names.append(patch.name)
    return names
