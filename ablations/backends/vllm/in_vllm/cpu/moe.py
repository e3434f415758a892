"""S23: K3's latent-MoE tail reads the routed up-projection's weight directly; keep it on a CPU."""

from __future__ import annotations


def keep_up_proj_weight(transform) -> None:
    """After KimiRoutedOutputTransform init: the tensor-parallel tail (`LatentMoERunner`, both tiers) multiplies
    by `up_proj.weight` itself (`addmm_` / `mm`), which the CPU GEMM packer would empty
    (model_executor/layers/linear.py:206-216), as for MLA's kv_b_proj (S1)."""
    transform.up_proj._cpu_skip_gemm_dispatch = True
