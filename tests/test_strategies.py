"""The feature rooms' strategies live in one typed object (``sglang_replayssm.strategies.STRATEGIES``):
installing the rooms fills it through the core's installers, and no core module keeps a strategy of its own."""

from __future__ import annotations

import ast

from sglang_replayssm.radix import hooks as radix_hooks
from sglang_replayssm.strategies import STRATEGIES
from tests.test_package_layout import MODULES

#: The module-level names the core's strategies lived in before they were gathered into one object.
_GATHERED = {"_slot_charges", "_reservations", "_checks", "_disaggregation", "_rebuild_of", "_record_pool_of",
             "_copies", "_end_state"}  # fmt: skip


def test_installing_the_rooms_fills_the_one_strategies_object():
    radix_hooks.install_rooms()
    assert "read_copy" in STRATEGIES.checks and "read_copy" in STRATEGIES.slot_charges
    assert "records" in STRATEGIES.reservations
    assert STRATEGIES.disaggregation is not None and STRATEGIES.end_state is not None
    assert STRATEGIES.rebuild_of.__module__ != "sglang_replayssm.strategies"
    assert STRATEGIES.record_pool_of.__module__ != "sglang_replayssm.strategies"


def test_no_core_module_keeps_a_strategy_global():
    offenders: dict[str, list[str]] = {}
    for name, path in MODULES.items():
        if not name.startswith("sglang_replayssm.radix"):
            continue
        for node in ast.parse(path.read_text()).body:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
                node, ast.AnnAssign) else []
            found = [t.id for t in targets if isinstance(t, ast.Name) and t.id in _GATHERED]
            if found:
                offenders.setdefault(name, []).extend(found)
    assert offenders == {}
