"""Refuse any SGLang other than the pinned one: every hook targets 0.5.23's internals."""

from __future__ import annotations

from importlib import metadata

from sglang_replayssm import SGLANG_PINNED_VERSION, __version__


class SGLangVersionError(RuntimeError):
    """Raised when the installed SGLang is not the release the hooks were written for."""


def installed_sglang_version() -> str | None:
    try:
        return metadata.version("sglang")
    except metadata.PackageNotFoundError:
        return None


def require_pinned_sglang(found: str | None = None) -> None:
    """Raise SGLangVersionError naming both versions unless SGLang is exactly the pinned release."""
    found = installed_sglang_version() if found is None else found
    if found != SGLANG_PINNED_VERSION:
        raise SGLangVersionError(
            f"sglang-replayssm {__version__} hooks SGLang {SGLANG_PINNED_VERSION} internals, but SGLang "
            f"{found or '(not installed)'} is installed. Install sglang=={SGLANG_PINNED_VERSION} "
            f"or uninstall sglang-replayssm."
        )
