"""Lab GPU machine only (this folder is on PYTHONPATH only under scripts/gpu_serve.sh): with
SGLANG_REPLAYSSM_LAB_GPU=1, route `import sgl_kernel` to the torch stand-in (lab_sgl_kernel.py), and serve
SGLang's SM100-only dual GEMM module without the CuTe DSL the lab image lacks (lab_dual_gemm.py); with
LAB_SYNC_DEBUG, count host syncs by call stack (lab_sync_debug.py); with LAB_COMPILE_LOG, log Triton JIT compiles
(lab_compile_log.py); with LAB_HOST_TIMERS, time every plugin function's host time (lab_host_timers.py; on any
machine); with LAB_REBUILD_PER_LAYER=1, rebuilds
run one extend per layer (the A/B of radix/records/fold_stack.py); with LAB_NO_CAPTURE=1, forwards write no
records (their slots are still assigned: timing only, a hit rebuilt from them is wrong)."""
import os

if os.environ.get("LAB_HOST_TIMERS"):  # first: before anything imports the plugin
    import lab_host_timers

    lab_host_timers.install()

if os.environ.get("SGLANG_REPLAYSSM_LAB_GPU") == "1":
    import lab_sgl_kernel

    lab_sgl_kernel.install()

    import lab_dual_gemm

    lab_dual_gemm.install()

    import lab_sync_debug

    lab_sync_debug.install()  # only with LAB_SYNC_DEBUG set

    import lab_compile_log

    lab_compile_log.install()  # only with LAB_COMPILE_LOG set

if os.environ.get("LAB_REBUILD_PER_LAYER") == "1":  # A/B: every layer's rebuild extend on its own
    from sglang_replayssm.radix.records import rebuild as _rebuild

    _rebuild._stack_of = lambda *args, **kwargs: None

if os.environ.get("LAB_NO_CAPTURE") == "1":  # A/B: the records' bookkeeping without the per-layer capture
    from sglang_replayssm.radix.records import capture as _capture

    _capture.capture = lambda *args, **kwargs: None
