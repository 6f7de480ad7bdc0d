"""The adapter's switches: the environment turns the adapter or single fixes off, and the plugin
entry point reports what it enabled (the hook table itself: tests/test_hook_table.py)."""

from __future__ import annotations

import pytest

from sglang_replayssm.radix import config, hooks


@pytest.fixture(scope="module", autouse=True)
def _adapter_installed():
    hooks.install()


def test_adapter_off_registers_nothing(monkeypatch):
    from sglang.srt.plugins.hook_registry import HookRegistry

    HookRegistry.reset()
    monkeypatch.setenv(config.ADAPTER_ENV, "0")
    registered = []
    monkeypatch.setattr(HookRegistry, "register", lambda *a, **k: registered.append(a))
    assert hooks.register().startswith("nothing")
    assert registered == []
    assert config.reload() == list(config.RUNTIME_FIXES)  # the CPU runtime's fixes are not the adapter's
    monkeypatch.setenv(config.DISABLE_ENV, ",".join(config.RUNTIME_FIXES))
    assert config.reload() == []
    monkeypatch.delenv(config.DISABLE_ENV)
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


def test_plugin_entry_point_reports_what_it_enabled():
    from sglang_replayssm import plugin

    plugin.register_radix_adapter()
    n = len(config.FIXES)
    assert plugin._enabled["replayssm_radix"].startswith(f"radix adapter ({n}/{n} fixes")
