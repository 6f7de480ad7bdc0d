"""Every hook and patch of cpu/ and radix/ against the installed SGLang: each target resolves, its
``at`` names the SGLang file and def line (a patch: a line mentioning the attribute), installing is
idempotent, and a radix hook with its fix off passes straight through to SGLang."""

from __future__ import annotations

import inspect
import json
import os
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest
import sglang
from sglang.srt.plugins.hook_registry import HookRegistry

from sglang_replayssm import hook_table
from sglang_replayssm.cpu import hooks as cpu_hooks
from sglang_replayssm.cpu import hooks_dtype, hooks_hicache, hooks_kda, hooks_launch, hooks_pd, hooks_spec
from sglang_replayssm.hook_table import Hook, Patch
from sglang_replayssm.radix import config
from sglang_replayssm.radix import hooks as radix_hooks
from sglang_replayssm.radix.ring import hooks as ring_hooks

CPU_TABLES = ("sglang_replayssm.cpu.hooks", "sglang_replayssm.cpu.hooks_kda", "sglang_replayssm.cpu.hooks_hicache",
              "sglang_replayssm.cpu.hooks_spec")
ALL_HOOKS: tuple[Hook, ...] = (radix_hooks.HOOKS + cpu_hooks.HOOKS + hooks_kda.HOOKS + hooks_hicache.HOOKS
                               + hooks_dtype.HOOKS + hooks_launch.HOOKS + hooks_spec.HOOKS + hooks_pd.HOOKS)
ALL_PATCHES: tuple[Patch, ...] = cpu_hooks.PATCHES + hooks_kda.PATCHES
SGLANG_ROOT = Path(sglang.__file__).parent.parent


def _split_at(at: str) -> tuple[Path, int]:
    path, line = at.rsplit(":", 1)
    assert path.startswith("sglang/") and path.endswith(".py"), at
    return SGLANG_ROOT / path, int(line)


def _hook_id(hook: Hook) -> str:
    return f"{hook.target.rsplit('.', 2)[-2]}.{hook.name}"


@pytest.mark.parametrize("hook", ALL_HOOKS, ids=_hook_id)
def test_hook_at_names_the_target_def_line(hook: Hook) -> None:
    original = inspect.unwrap(hook_table.live_attr(hook.target))
    path, line = _split_at(hook.at)
    assert inspect.getsourcefile(original) == str(path)
    lines, first = inspect.getsourcelines(original)
    def_index = next(i for i, text in enumerate(lines) if text.lstrip().startswith(("def ", "async def ")))
    assert first + def_index == line, f"{hook.target} is defined at line {first + def_index}"


@pytest.mark.parametrize("patch", ALL_PATCHES, ids=lambda p: p.name)
def test_patch_at_names_a_line_using_the_attribute(patch: Patch) -> None:
    owner_path, attr = patch.target.rsplit(".", 1)
    assert hasattr(pkgutil.resolve_name(owner_path), attr), patch.target
    path, line = _split_at(patch.at)
    assert attr in path.read_text().splitlines()[line - 1], f"{patch.at} does not mention {attr}"


def test_names_and_targets_are_unique_per_table() -> None:
    for table in (radix_hooks.HOOKS, cpu_hooks.HOOKS, hooks_kda.HOOKS):
        assert len({h.name for h in table}) == len(table)
    assert len({(h.target, h.fn) for h in ALL_HOOKS}) == len(ALL_HOOKS)
    assert {h.fix for h in radix_hooks.HOOKS} - {None} <= set(config.FIXES)


def test_radix_install_is_idempotent_across_registry_resets() -> None:
    for _ in range(3):
        radix_hooks.install()
        HookRegistry.reset()
        radix_hooks.register()
        HookRegistry.apply_hooks()
    HookRegistry.reset()
    assert radix_hooks.applied_hooks() == list(radix_hooks.HOOKS)
    for hook in radix_hooks.HOOKS:
        chain = hook_table.wrapped_hooks(hook_table.live_attr(hook.target))
        assert chain.count(hook.fn) == 1, hook.target


_CPU_INSTALL = """
import json, sys
from sglang.srt.plugins.hook_registry import HookRegistry
from sglang_replayssm import hook_table
tables = [__import__(name, fromlist=["HOOKS"]) for name in sys.argv[1:]]
for _ in range(2):
    for table in tables:
        table.register()
    HookRegistry.apply_hooks()
    HookRegistry.reset()
    for table in tables:
        table.register()
    HookRegistry.apply_hooks()
hooks = [h for t in tables for h in t.HOOKS]
patches = [p for t in tables for p in getattr(t, "PATCHES", ())]
print(json.dumps({
    "counts": [hook_table.wrapped_hooks(hook_table.live_attr(h.target)).count(h.fn) for h in hooks],
    "patched": [hook_table.live_attr(p.target) is p.value for p in patches],
}))
"""


def test_cpu_install_is_idempotent_and_sets_every_patch() -> None:
    """In a fresh process (the CPU hooks replace torch.Tensor.pin_memory process-wide)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(__file__).parent.parent), *sys.path]))
    done = subprocess.run(
        [sys.executable, "-c", _CPU_INSTALL, *CPU_TABLES], capture_output=True, text=True, env=env, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    n_hooks = len(cpu_hooks.HOOKS) + len(hooks_kda.HOOKS) + len(hooks_hicache.HOOKS) + len(hooks_spec.HOOKS)
    assert result["counts"] == [1] * n_hooks
    assert result["patched"] == [True] * len(ALL_PATCHES)


class _Untouchable:
    """An argument that fails the test if a disabled hook looks at it."""

    def __getattr__(self, name: str) -> None:
        raise AssertionError(f"a disabled hook read .{name}")


@pytest.mark.parametrize("hook", radix_hooks.HOOKS, ids=_hook_id)
def test_radix_hook_with_its_fix_off_is_a_pure_pass_through(hook: Hook) -> None:
    params = list(inspect.signature(hook.fn).parameters.values())
    positional = [p for p in params[1:] if p.kind is p.POSITIONAL_OR_KEYWORD]
    args = [_Untouchable() for _ in positional]
    calls = []

    def original(*a: object, **k: object) -> str:
        calls.append((a, k))
        return "sglang-result"

    with config.override(False):
        if hook.kind == "AROUND":
            assert hook.fn(original, *args) == "sglang-result"
            assert len(calls) == 1 and list(calls[0][0]) == args and calls[0][1] == {}
        elif hook.fn not in (ring_hooks.link_slot_allocator, ring_hooks.link_decode_kernel):  # links, whatever the fixes
            assert hook.fn(_Untouchable(), *args) is None
