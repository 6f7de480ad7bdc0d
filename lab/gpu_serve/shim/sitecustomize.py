"""Lab GPU machine only (this folder is on PYTHONPATH only under scripts/gpu_serve.sh): with
SGLANG_REPLAYSSM_LAB_GPU=1, route `import sgl_kernel` to the torch stand-in (lab_sgl_kernel.py), and serve
SGLang's SM100-only dual GEMM module without the CuTe DSL the lab image lacks (lab_dual_gemm.py)."""
import os

if os.environ.get("SGLANG_REPLAYSSM_LAB_GPU") == "1":
    import lab_sgl_kernel

    lab_sgl_kernel.install()

    import lab_dual_gemm

    lab_dual_gemm.install()
