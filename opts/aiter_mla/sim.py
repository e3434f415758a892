"""aiter_mla in the simulator: on runs the MLA decode (and the MTP layer's) as the vendor kernel class, at the
efficiency the hardware profile gives that class ("attention_vendor": AITER's mla_decode_fwd on an MI355X);
off as the generic attention class (TRITON_MLA; on CUDA off selects it in place of the node's stock MLA decode,
`stock_classes` in its profile). The FLOPs and bytes are the same: only the kernel differs."""

from __future__ import annotations

from opts.aiter_mla.config import AiterMLAConfig
from opts.sim_setting import SimSetting, not_modelled
from opts.vllm_setting import check_platform

VENDOR_CLASS = "attention_vendor"
GENERIC_CLASS = "attention"
DECODE_COSTS = ("mla_decode", "mtp_mla_decode")
# The kernel class each side of this package's microbenchmarks runs as, by case-name prefix ("": every case):
# the calibration fits each class's efficiency on those rows' bytes, FLOPs and times.
CALIBRATION = {"": {"off": "attention", "on": VENDOR_CLASS}}


def sim_setting(config: AiterMLAConfig, platform: str) -> SimSetting:
    """What `config` changes in the simulated engine on `platform` (CUDA has no vendor MLA kernel here)."""
    check_platform(platform)
    if config.mode == "off":
        return SimSetting(kernel_classes=dict.fromkeys(DECODE_COSTS, GENERIC_CLASS)) if platform == "cuda" else (
            SimSetting())
    if platform == "cuda":
        raise not_modelled("aiter_mla", config.mode, ("off",), "not a kernel vLLM has on CUDA")
    return SimSetting(kernel_classes=dict.fromkeys(DECODE_COSTS, VENDOR_CLASS))
