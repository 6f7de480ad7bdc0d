"""The two numeric constants of the gated delta rule's gates, one copy for every implementation.

The fp64 oracle (:mod:`.naive`), the torch reference (:mod:`.ring_decode_ref`) and the Triton
kernels (:mod:`.ring_decode_common`) read them from here; ``csrc/ring_read.cu`` spells the same
two literals (C source cannot import them).
"""

from __future__ import annotations

__all__ = ["L2NORM_EPS", "SOFTPLUS_THRESHOLD"]

#: Epsilon added to the squared norm in the in-kernel q/k L2 normalisation.
L2NORM_EPS: float = 1e-6
#: Softplus switches to the identity above this input (beta = 1), as in SGLang's kernels.
SOFTPLUS_THRESHOLD: float = 20.0
