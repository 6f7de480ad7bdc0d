"""`sglang-replayssm info`: versions, and what the plugin enables on this machine."""

from __future__ import annotations

from sglang_replayssm import SGLANG_PINNED_VERSION, __version__
from sglang_replayssm.cpu.autoload import libcuda_loadable, standin_wanted
from sglang_replayssm.version_check import installed_sglang_version


def main(argv: list[str]) -> int:
    found = installed_sglang_version()
    print(f"sglang-replayssm {__version__}")
    print(f"sglang {found or '(not installed)'} (pinned: {SGLANG_PINNED_VERSION}"
          f"{'' if found == SGLANG_PINNED_VERSION else ', MISMATCH: the plugin will refuse to load'})")
    print(f"CUDA driver: {'yes' if libcuda_loadable() else 'no'}")
    print(f"CPU reference runtime: {'on' if standin_wanted() else 'off'}")
    from sglang_replayssm.radix import config

    on = list(config.enabled_fixes()) if config.adapter_enabled() else []
    print(f"radix adapter: {'off' if not config.adapter_enabled() else ', '.join(on) or 'no fixes'}")
    return 0
