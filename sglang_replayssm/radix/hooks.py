"""Every hook the radix adapter installs into SGLang 0.5.23, one place, each naming its target file."""

from __future__ import annotations


def register() -> str:
    """Register the adapter's hooks with SGLang's HookRegistry; return what was enabled."""
    return "off (not implemented yet)"
