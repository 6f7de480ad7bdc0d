"""Kernels: each fused kernel has a pure-torch reference (`naive`/`ref`) beside it.

Public entries: :func:`.ring_decode.ring_decode` (with :class:`.ring_decode_config.RingDecodeConfig`
and :func:`.ring_decode.pick_config`), :func:`.cursor.cursor_step`, :func:`.materialize.materialize`;
torch references :func:`.ring_decode_ref.ring_decode_torch` and :mod:`.naive`. Nothing is imported
here, so that the CPU runtime's use of the references does not load Triton. Research-only launch variants
and the bench-only Triton read-copy kernel live in ``lab/kernels/`` (not packaged).
"""
