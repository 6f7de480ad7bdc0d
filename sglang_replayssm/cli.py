"""Console script `sglang-replayssm`: one subcommand per job, each owned by its module."""

from __future__ import annotations

import importlib
import sys

# subcommand -> (module, help). Each module exposes `main(argv: list[str]) -> int`.
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "make-models": ("sglang_replayssm.models", "write the embedded tiny/small GDN and KDA models"),
    "bench": ("sglang_replayssm.bench.cli", "RAG shared-prefix benchmark against real SGLang servers"),
    "plan": ("sglang_replayssm.bench.plan", "what each cache policy holds in an HBM budget, at real model sizes"),
    "info": ("sglang_replayssm.info", "print versions and what the plugin would enable here"),
    "settings": ("sglang_replayssm.settings", "print the switch table (README); --check: validate this environment"),
}


def _usage() -> str:
    lines = ["usage: sglang-replayssm <command> [args]", "", "commands:"]
    lines += [f"  {name:<12} {help_}" for name, (_, help_) in SUBCOMMANDS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in {"-h", "--help"}:
        print(_usage())
        return 0
    name, rest = argv[0], argv[1:]
    if name not in SUBCOMMANDS:
        print(f"sglang-replayssm: unknown command {name!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(SUBCOMMANDS[name][0])
    return int(module.main(rest) or 0)


if __name__ == "__main__":
    raise SystemExit(main())
