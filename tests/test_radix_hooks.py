"""The adapter's hook table: every hook targets the SGLang file:line it names, installs once,
passes straight through when its fix is off, and the environment switches work."""

from __future__ import annotations

import inspect
import os

import pytest

from sglang_replayssm.radix import config, hooks


@pytest.fixture(scope="module", autouse=True)
def _adapter_installed():
    hooks.install()


def _chain_count(live, fn) -> int:
    n, cur = 0, live
    while cur is not None:
        for cell in getattr(cur, "__closure__", None) or ():
            try:
                n += cell.cell_contents is fn
            except ValueError:
                pass
        cur = getattr(cur, "__wrapped__", None)
    return n


def _original(live):
    while getattr(live, "__wrapped__", None) is not None:
        live = live.__wrapped__
    return live


@pytest.mark.parametrize("hook", hooks.HOOKS, ids=lambda h: h.target.rsplit(".", 2)[-2] + "." + h.fn.__name__)
def test_hook_targets_the_named_sglang_file_and_line(hook):
    import sglang

    original = _original(hooks._live_attr(hook.target))
    path, line = hook.sglang_file.rsplit(":", 1)
    source = inspect.getsourcefile(original)
    assert source == os.path.join(os.path.dirname(sglang.__file__), path.removeprefix("sglang/"))
    lines, first = inspect.getsourcelines(original)
    decorators = sum(1 for text in lines if text.lstrip().startswith("@"))
    assert first + decorators == int(line) or first == int(line)
    assert f"sglang/{path.removeprefix('sglang/')}" in inspect.getsource(hooks)  # named in hooks.py


def test_install_is_idempotent_across_registry_resets():
    from sglang.srt.plugins.hook_registry import HookRegistry

    for _ in range(3):
        hooks.install()
        HookRegistry.reset()
        hooks.register()
        HookRegistry.apply_hooks()
    for hook in hooks.HOOKS:
        assert _chain_count(hooks._live_attr(hook.target), hook.fn) == 1, hook.target
    HookRegistry.reset()


def test_adapter_off_registers_nothing(monkeypatch):
    from sglang.srt.plugins.hook_registry import HookRegistry

    HookRegistry.reset()
    monkeypatch.setenv(config.ADAPTER_ENV, "0")
    assert hooks.register().startswith("nothing")
    assert not any(HookRegistry._hooks.get(h.target) for h in hooks.HOOKS)
    assert config.reload() == []
    monkeypatch.delenv(config.ADAPTER_ENV)
    assert config.reload() == list(config.FIXES)


def test_disable_fixes_env(monkeypatch):
    monkeypatch.setenv(config.DISABLE_ENV, "ring_budget, lost_hit_metric")
    try:
        assert config.reload() == [f for f in config.FIXES if f not in ("ring_budget", "lost_hit_metric")]
        monkeypatch.setenv(config.DISABLE_ENV, "no_such_fix")
        with pytest.raises(ValueError, match="no_such_fix"):
            config.reload()
    finally:
        monkeypatch.delenv(config.DISABLE_ENV)
        config.reload()


class _Untouchable:
    """An argument that fails the test if a disabled hook looks at it."""

    def __getattr__(self, name):
        raise AssertionError(f"a disabled hook read .{name}")


@pytest.mark.parametrize("hook", hooks.HOOKS, ids=lambda h: h.fn.__name__)
def test_disabled_fix_is_a_pure_pass_through(hook):
    params = list(inspect.signature(hook.fn).parameters.values())
    positional = [p for p in params[1:] if p.kind is p.POSITIONAL_OR_KEYWORD]
    args = [_Untouchable() for _ in positional]
    calls = []

    def original(*a, **k):
        calls.append((a, k))
        return "sglang-result"

    with config.override(False):
        if hook.kind == "AROUND":
            assert hook.fn(original, *args) == "sglang-result"
            assert len(calls) == 1 and list(calls[0][0]) == args and calls[0][1] == {}
        elif hook.fix != "cursor_reset" or hook.fn is not hooks.link_slot_allocator:
            assert hook.fn(_Untouchable(), *args) is None


def test_plugin_entry_point_reports_what_it_enabled():
    from sglang_replayssm import plugin

    plugin.register_radix_adapter()
    n = len(config.FIXES)
    assert plugin._enabled["replayssm_radix"].startswith(f"radix adapter ({n}/{n} fixes")
