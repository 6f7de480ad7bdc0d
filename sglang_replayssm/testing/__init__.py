"""Test-only code: reference outputs, a stand-in server, loaders and simulators. Product modules never import it."""

from __future__ import annotations

from sglang_replayssm.testing.hf_reference import encode_prompts, hf_greedy, model_fingerprint

__all__ = ["encode_prompts", "hf_greedy", "model_fingerprint"]
