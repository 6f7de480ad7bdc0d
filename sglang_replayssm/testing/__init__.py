"""Helpers for tests: reference outputs to compare SGLang's against."""

from __future__ import annotations

from sglang_replayssm.testing.hf_reference import encode_prompts, hf_greedy, model_fingerprint

__all__ = ["encode_prompts", "hf_greedy", "model_fingerprint"]
