"""Kernels: each fused kernel has a pure-torch reference (`naive`/`ref`) beside it."""
