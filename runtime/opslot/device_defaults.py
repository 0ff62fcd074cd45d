"""Device defaults: the implementation an ops-config field left unset takes on this machine.

On CPU every default is "eager" (`attn_implementation` unset: the model config's own choice). On a
CUDA machine where opslot's CUDA kernel library (libopslot_kernels.so, docs/kernels.md) loads and
runs on the current device, the `cuda` kernels of `CUDA_DEFAULTS`, and for the variants of
`CUDA_VARIANT_DEFAULTS` theirs; where it does not, the CPU defaults. The library probe
(`cuda_kernels_unavailable_reason`) runs lazily, once, and only on CUDA machines. On NPU, the NPU
kernels of `NPU_DEFAULTS`. A default that has no kernel for a slot's variant falls back to eager
(opslot.choice); an explicit value never does.
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

from .hardware import DeviceInfo, current_device
from .ops import EAGER, FIELD_FOR_OP

#: Defaults on CPU machines: the upstream code. attn None keeps the model config's choice.
CPU_DEFAULTS: Dict[str, Optional[str]] = {f: EAGER for f in FIELD_FOR_OP.values()}
CPU_DEFAULTS["attn_implementation"] = None

#: Defaults on CUDA machines whose kernel library loads (`cuda_kernels_unavailable_reason()` is
#: None): opslot's CUDA kernels; where the library is unavailable, the CPU defaults (eager).
CUDA_DEFAULTS: Dict[str, Optional[str]] = dict(
    CPU_DEFAULTS,
    rms_norm_implementation="cuda",
    rms_norm_gated_implementation="cuda",
    rotary_pos_emb_implementation="cuda",
    rotary_pos_emb_vision_implementation="cuda",
    swiglu_mlp_implementation="cuda",
    load_balancing_loss_implementation="cuda",
    cross_entropy_loss_implementation="cuda",
    moe_implementation="fused_cuda",
    causal_conv1d_implementation="cuda",
    chunk_gated_delta_rule_implementation="cuda",
    dsa_indexer_implementation="cuda",
    mhc_implementation="cuda",
    # dsa_attention: eager for the field, `cuda` for DeepSeek-V4's and GLM-MoE-DSA's variants on sm_90+
    # (CUDA_VARIANT_DEFAULTS)
)

#: Defaults of single variants that differ from their field's in `CUDA_DEFAULTS`: (op, variant) ->
#: (implementation, the least compute capability it is the default on), on the same CUDA machines; a
#: field set explicitly overrides them. The sparse attention of DeepSeek-V4 and GLM-MoE-DSA runs its
#: `cuda` kernel from sm_90 (its backward at dv 512 needs more shared memory than an A100 gives a block).
#: DeepSeek-V4: upstream runs it with eager attention only, whose mask the kernel reads, in training and
#: generation (2.8x the training step of eager: docs/results/train_step_dsa_h200.md). GLM-MoE-DSA: the
#: kernel serves training and generation under Transformers 5.17 (its cache of expanded keys and values)
#: and 5.23 (its cache of latents); its training step is 5 % faster than eager's at 2x4096 tokens and
#: 2.0x at 16384 (docs/results/train_step_dsa_h200.md). Both refuse attention dropout in training and
#: `output_attentions`, naming `torch` and `eager`.
CUDA_VARIANT_DEFAULTS: Dict[Tuple[str, str], Tuple[str, Tuple[int, int]]] = {
    ("dsa_attention", "deepseek_v4"): ("cuda", (9, 0)),
    ("dsa_attention", "glm"): ("cuda", (9, 0)),
}

#: Defaults on NPU machines, applied to fields the user did not set.
NPU_DEFAULTS: Dict[str, Optional[str]] = dict(
    CPU_DEFAULTS,
    rms_norm_implementation="npu",
    rotary_pos_emb_implementation="npu",
    rotary_pos_emb_vision_implementation="npu",
    swiglu_mlp_implementation="npu",
    moe_implementation="fused_npu",
)

_cuda_kernels_reason: Optional[Tuple[Optional[str]]] = None


def cuda_kernels_unavailable_reason() -> Optional[str]:
    """None when libopslot_kernels loads and runs on the current CUDA device, else why not.
    Checked once (lazily: nothing is loaded until a CUDA default is asked for), then cached."""
    global _cuda_kernels_reason
    if _cuda_kernels_reason is None:
        try:  # imported here: loading the kernel library is the probe, done only when asked
            from .kernels.cuda._lib import unavailable_reason

            reason = unavailable_reason()
        except Exception as exc:  # a broken install is "unavailable", with its reason
            reason = f"{type(exc).__name__}: {exc}"
        _cuda_kernels_reason = (reason,)
    return _cuda_kernels_reason[0]


def set_cuda_kernels_check(check: Optional[Any]) -> None:
    """Replace the library check (a callable returning None or a reason; None restores the real
    one and clears its cache). For tests."""
    global _cuda_kernels_reason, cuda_kernels_unavailable_reason
    _cuda_kernels_reason = None
    if check is None:
        cuda_kernels_unavailable_reason = _real_cuda_check
    else:
        cuda_kernels_unavailable_reason = check


_real_cuda_check = cuda_kernels_unavailable_reason


def device_defaults(device: Optional[DeviceInfo] = None) -> Dict[str, Optional[str]]:
    """The defaults that apply on `device` (default: this machine)."""
    device = device or current_device()
    if device.type == "npu":
        return NPU_DEFAULTS
    if device.type == "cuda" and cuda_kernels_unavailable_reason() is None:
        return CUDA_DEFAULTS
    return CPU_DEFAULTS


def variant_default(op: str, variant: str, device: Optional[DeviceInfo] = None) -> Optional[str]:
    """The default of `op`/`variant` on `device` where it differs from its field's, else None."""
    entry = CUDA_VARIANT_DEFAULTS.get((op, variant))
    if entry is None:
        return None
    device = device or current_device()
    impl, least = entry
    if device.type != "cuda" or device.capability is None or tuple(device.capability) < least:
        return None
    return impl if cuda_kernels_unavailable_reason() is None else None
