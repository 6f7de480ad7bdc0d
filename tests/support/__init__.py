"""Test-only code: reference outputs, a stand-in server, loaders, simulators and the kernel bench drivers.

Not in the wheel (``tests/`` is not packaged); product modules never import it (tests/test_package_layout.py).
"""

from __future__ import annotations

from tests.support.hf_reference import encode_prompts, hf_greedy, model_fingerprint

__all__ = ["encode_prompts", "hf_greedy", "model_fingerprint"]
