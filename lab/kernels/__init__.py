"""Research-only kernels and launch variants: the ring decode with research knobs (the kernel bench's
sweeps and the GPU tests that cover them) and the Triton read-copy decode (the read-copy bench's Triton
arm). The product never imports them."""
