"""SGLang plugin entry points (group `sglang.srt.plugins`).

SGLang calls each entry point once per process (main, scheduler, detokenizer) before it
applies registered hooks. `SGLANG_PLUGINS` selects entry points by name, so the CPU
runtime (`replayssm_cpu`) and the radix adapter (`replayssm_radix`) can be enabled apart.
Each process logs exactly one line naming the package version and what it enabled. A bad value of
any of our environment variables (:mod:`sglang_replayssm.settings`) refuses the start in one line.
"""

from __future__ import annotations

import logging
import os
from importlib.metadata import entry_points

from sglang_replayssm import __version__, settings
from sglang_replayssm.version_check import SGLangVersionError, require_pinned_sglang

logger = logging.getLogger("sglang_replayssm")

_GROUP = "sglang.srt.plugins"
_DIST = "sglang-replayssm"
_enabled: dict[str, str] = {}


def _our_selected_entry_points() -> list[str]:
    """Names of this distribution's entry points that SGLang will run in this process."""
    allowed = os.environ.get("SGLANG_PLUGINS", "")
    allowed_set = {x.strip() for x in allowed.split(",") if x.strip()} or None
    names = []
    for ep in entry_points(group=_GROUP):
        if ep.dist is not None and ep.dist.name.replace("_", "-") != _DIST:
            continue
        if allowed_set is None or ep.name in allowed_set:
            names.append(ep.name)
    return names


def _record(entry: str, what: str) -> None:
    _enabled[entry] = what
    if set(_our_selected_entry_points()) <= set(_enabled):
        summary = "; ".join(f"{k}: {v}" for k, v in sorted(_enabled.items()))
        logger.warning("sglang-replayssm %s (pid %d) enabled %s", __version__, os.getpid(), summary)


class SettingsError(SystemExit):
    """A bad value of one of our environment variables: a SystemExit, so the launcher prints exactly
    its one line (``sglang-replayssm: NAME='text': expected ...``, no traceback) and exits 1; SGLang's
    plugin loader logs and swallows an Exception but not this."""

    def __str__(self) -> str:
        return str(self.code)


def check_settings() -> None:
    """Refuse the start on the first bad variable of :data:`sglang_replayssm.settings.SETTINGS`."""
    try:
        settings.validate()
    except ValueError as exc:
        raise SettingsError(f"sglang-replayssm: {exc}") from None


def _checked(entry: str) -> bool:
    try:
        require_pinned_sglang()
    except SGLangVersionError as exc:
        logger.error("%s", exc)
        _record(entry, "nothing (refused: SGLang version mismatch)")
        return False
    check_settings()
    return True


def register_cpu_runtime() -> None:
    """Entry point `replayssm_cpu`: the CPU reference runtime, active only without CUDA."""
    if not _checked("replayssm_cpu"):
        return
    from sglang_replayssm.cpu import activate

    _record("replayssm_cpu", activate())


def register_radix_adapter() -> None:
    """Entry point `replayssm_radix`: ring-aware radix cache, slot movers and kernels."""
    if not _checked("replayssm_radix"):
        return
    from sglang_replayssm.radix.hooks import register

    _record("replayssm_radix", register())
