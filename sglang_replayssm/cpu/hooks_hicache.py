"""CPU runtime hooks for HiCache host pools and host<->device transfers on CPU; each hook names the SGLang file it targets."""

from __future__ import annotations


def register() -> list[str]:
    """Register this part's hooks; returns their short names for the load log line."""
    return []
