"""Research code, not packaged (the wheel holds ``sglang_replayssm`` only): research kernels and launch
knobs (``kernels/``), sweeps, profilers and GPU bench drivers (``scripts/``), the GPU serving check
(``gpu_serve/``). Lab code may import the product and ``tests.support``; the product never imports it.
Run its scripts from the repository root with the root on the path, e.g.
``PYTHONPATH=$PWD python lab/scripts/bench_read_copy.py drift``.
"""
