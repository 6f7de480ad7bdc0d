"""The settings registry (sglang_replayssm/settings.py): every variable of ours is registered and read
through it, a bad value is refused in one line naming the variable and what it accepts, and README's
switch table is the registry's."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import sglang_replayssm
from sglang_replayssm import plugin, settings
from sglang_replayssm.radix import config

PACKAGE = Path(sglang_replayssm.__file__).parent
REPO = PACKAGE.parent
NAME = re.compile(settings.PREFIX + r"[A-Z0-9_]*[A-Z0-9]")
BEGIN, END = "<!-- settings:begin", "<!-- settings:end -->"


def _names_in(paths: list[Path]) -> dict[str, set[str]]:
    """Every ``SGLANG_REPLAYSSM_*`` name written in ``paths`` -> the files that write it."""
    found: dict[str, set[str]] = {}
    for path in paths:
        for name in NAME.findall(path.read_text()):
            found.setdefault(name, set()).add(str(path.relative_to(REPO)))
    return found


def test_every_name_in_the_product_is_registered():
    registered = {s.name for s in settings.SETTINGS}
    found = _names_in(sorted(PACKAGE.rglob("*.py")))
    assert {k: v for k, v in found.items() if k not in registered} == {}


def test_every_name_in_lab_tests_and_scripts_is_registered():
    registered = {s.name for s in settings.SETTINGS}
    paths = [p for folder in ("lab", "tests", "scripts") for p in (REPO / folder).rglob("*")
             if p.suffix in (".py", ".sh") and p.is_file()] + [REPO / "Makefile"]
    found = _names_in(paths)
    assert {k: v for k, v in found.items() if k not in registered} == {}


def _environ_reads(tree: ast.AST) -> list[ast.AST]:
    """``os.environ.get(x)``, ``os.environ[x]``, ``os.getenv(x)`` / ``environ.get(x)``: the ``x`` nodes."""
    keys: list[ast.AST] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and node.args and isinstance(node.func, ast.Attribute):
            owner = ast.unparse(node.func.value)
            if (node.func.attr in ("get", "pop", "setdefault") and owner.endswith("environ")) or \
                    (node.func.attr == "getenv" and owner == "os"):
                keys.append(node.args[0])
        elif isinstance(node, ast.Subscript) and ast.unparse(node.value).endswith("environ"):
            keys.append(node.slice)
    return keys


def test_every_environment_read_of_ours_goes_through_settings():
    """No product module but settings.py reads an ``SGLANG_REPLAYSSM_*`` variable (a literal, or a
    ``*_ENV`` constant) from ``os.environ`` (reads of SGLang's or other tools' variables stay)."""
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE)
        if rel.parts[0] == "testing" or path.name == "settings.py":
            continue
        for key in _environ_reads(ast.parse(path.read_text())):
            text = ast.unparse(key)
            if settings.PREFIX in text or text.endswith("_ENV") or ".name" in text:
                offenders.append(f"{rel}:{key.lineno}: {text}")
    assert offenders == []


def test_the_scan_sees_reads():
    """The checker itself: a read of ours is found."""
    keys = _environ_reads(ast.parse('import os\nos.environ.get("SGLANG_REPLAYSSM_SLOW", "1")\nos.environ[A_ENV]'))
    assert [ast.unparse(k) for k in keys] == ["'SGLANG_REPLAYSSM_SLOW'", "A_ENV"]


def test_readme_table_is_the_registry():
    """README's switch table, between its markers, is :func:`settings.markdown_table` (regenerate it
    with ``sglang-replayssm settings`` when this fails)."""
    text = (REPO / "README.md").read_text()
    assert text.count(BEGIN) == 1 and text.count(END) == 1
    body = text[text.index(BEGIN):text.index(END)].split("\n", 1)[1]
    assert body == settings.markdown_table()


def test_cli_prints_the_table(capsys):
    from sglang_replayssm import cli

    assert cli.main(["settings"]) == 0
    assert capsys.readouterr().out == settings.markdown_table()


@pytest.mark.parametrize(("name", "text", "accepted"), [
    ("SGLANG_REPLAYSSM_RECORD_TOKENS", "lots", "expected a number of tokens (0 turns records off)"),
    ("SGLANG_REPLAYSSM_RECORD_TOKENS", "-5", "expected >= 0 tokens"),
    ("SGLANG_REPLAYSSM_STATE_INTERVAL", "100", "expected 0 or a positive multiple of 64 tokens"),
    ("SGLANG_REPLAYSSM_READ_COPY", "fp4", "expected one of off, bf16, fp8"),
    ("SGLANG_REPLAYSSM_ADAPTER", "maybe", "expected one of 1, true, on, yes, 0, false, off, no"),
    ("SGLANG_REPLAYSSM_DISABLE_FIXES", "cursor_reset,no_such_fix", "unknown fix name(s) ['no_such_fix']"),
])  # fmt: skip
def test_a_bad_value_refuses_the_start_in_one_line(monkeypatch, name, text, accepted):
    """The plugin's startup check (run by both entry points, before anything is registered): a
    SystemExit whose one line names the variable, the value and what is accepted."""
    monkeypatch.setenv(name, text)
    with pytest.raises(SystemExit) as info:
        plugin.check_settings()
    line = str(info.value)
    assert "\n" not in line and line.startswith(f"sglang-replayssm: {name}={text!r}: ") and accepted in line
    if name.endswith("DISABLE_FIXES"):
        assert all(f.name in line for f in settings.FIXES)  # the accepted names
    monkeypatch.delenv(name)
    plugin.check_settings()


def test_entry_point_refuses_a_bad_value(monkeypatch):
    monkeypatch.setenv("SGLANG_REPLAYSSM_HOST_RECORD_TOKENS", "1e6")
    called = []
    monkeypatch.setattr("sglang_replayssm.radix.hooks.register", lambda: called.append(1) or "on")
    with pytest.raises(SystemExit, match="SGLANG_REPLAYSSM_HOST_RECORD_TOKENS='1e6': expected a number"):
        plugin.register_radix_adapter()
    assert not called


def test_unset_or_empty_is_the_default(monkeypatch):
    for s in settings.SETTINGS:
        monkeypatch.setenv(s.name, "  ")
        assert s.value() == s.default and not s.is_set()
        monkeypatch.delenv(s.name)
        assert s.value() == s.default


def test_flags_and_fixes_parse(monkeypatch):
    for text, on in (("0", False), ("off", False), ("No", False), ("1", True), ("TRUE", True)):
        monkeypatch.setenv(settings.CUDA_KERNELS.name, text)
        assert settings.CUDA_KERNELS.value() is on
    monkeypatch.setenv(settings.DISABLE_FIXES.name, " ring_budget, ,lost_hit_metric ")
    assert settings.DISABLE_FIXES.value() == {"ring_budget", "lost_hit_metric"}


def test_registry_shape():
    names = [s.name for s in settings.SETTINGS]
    assert len(names) == len(set(names)) and all(n.startswith(settings.PREFIX) for n in names)
    fixes = [f.name for f in settings.FIXES]
    assert len(fixes) == len(set(fixes))
    for item in (*settings.SETTINGS, *settings.FIXES):
        assert item.doc and "\n" not in item.doc and item.group
    # radix/config.py's API is the registry's
    assert list(config.FIXES) == fixes and config.RUNTIME_FIXES == ("pd_host_indices", "pd_early_send_event")
    assert config.ADAPTER_ENV == settings.ADAPTER.name and config.READ_COPY_MODES == settings.READ_COPY_MODES


def test_defaults_agree_with_the_modules_that_use_them():
    from sglang_replayssm.radix.records import interval_states
    from sglang_replayssm.radix.records import pool as records

    assert settings._CHUNK == interval_states.CHUNK
    assert f"{records.DEFAULT_CAPACITY}" in settings.RECORD_TOKENS.shown_default
