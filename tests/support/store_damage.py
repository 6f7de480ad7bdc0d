"""Damage a stored file the two ways a crash or a bad disk does: one flipped bit, a torn (half) write."""

from __future__ import annotations

from pathlib import Path


def flip(path: Path, offset: int) -> None:
    """Flip bit 4 of the byte at ``offset`` of ``path``."""
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x10
    path.write_bytes(bytes(data))


def truncate(path: Path) -> None:
    """Keep the first half of ``path``."""
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
