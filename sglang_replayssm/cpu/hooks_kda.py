"""CPU runtime hooks for Kimi-Linear (KDA + MLA + MoE) on CPU tensors; each hook names the SGLang file it targets."""

from __future__ import annotations


def register() -> list[str]:
    """Register this part's hooks; returns their short names for the load log line."""
    return []
