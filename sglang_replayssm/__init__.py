"""sglang-replayssm: ReplaySSM decode that works with SGLang's prefix (radix) cache."""

__version__ = "0.1.0"

#: The one SGLang release whose internals the hooks target.
SGLANG_PINNED_VERSION = "0.5.23"
