"""CPU reference runtime: lets real SGLang 0.5.23 serve GDN/KDA hybrids on a machine without CUDA."""

from __future__ import annotations


def activate() -> str:
    """Register the CPU runtime's hooks if no CUDA device exists; return what was enabled."""
    return "off (not implemented yet)"
