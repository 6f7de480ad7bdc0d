"""Research-only launch variants of the ring decode, for the kernel benchmark's sweeps and the GPU
tests that cover them. The product never imports this package."""
