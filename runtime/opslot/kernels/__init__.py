"""Built-in kernels and their registration. Factories are "module:attr" strings, so nothing here
imports a kernel module until a slot is bound to it."""

from __future__ import annotations

from ..hardware import ANY, HardwareRequirement
from ..registry import KernelRegistry, KernelSpec

NPU = HardwareRequirement("npu")

#: (impl name, op, variant, "module:attr", hardware, description)
BUILTIN_KERNELS = [
    ("torch", "rms_norm", "standard", "torch_ops:rms_norm_standard", ANY, "portable PyTorch"),
    ("torch", "rms_norm", "offset", "torch_ops:rms_norm_offset", ANY, "portable PyTorch"),
    ("torch", "rms_norm", "unweighted", "torch_ops:rms_norm_unweighted", ANY, "portable PyTorch"),
    ("torch", "rms_norm_gated", "standard", "torch_ops:rms_norm_gated", ANY, "portable PyTorch"),
    ("torch", "rotary_pos_emb", "full", "torch_ops:rotary_pos_emb_full", ANY, "portable PyTorch"),
    ("torch", "rotary_pos_emb", "partial", "torch_ops:rotary_pos_emb_partial", ANY, "portable PyTorch"),
    ("torch", "swiglu_mlp", "standard", "torch_ops:swiglu_mlp", ANY, "portable PyTorch"),
    ("torch", "cross_entropy_loss", "causal", "torch_ops:cross_entropy_causal", ANY, "lm_head + HF causal-LM loss"),
    ("torch_chunked", "cross_entropy_loss", "causal", "fused_ce:cross_entropy_causal_chunked", ANY,
     "chunked fused linear + cross-entropy, no full logits"),
    ("torch", "cross_entropy_loss", "sequence_classification",
     "torch_ops:cross_entropy_sequence_classification", ANY, "HF sequence-classification loss"),
    ("torch", "load_balancing_loss", "standard", "torch_ops:load_balancing_loss", ANY, "all layers at once"),
    ("torch", "moe", "standard", "torch_ops:moe_standard", ANY, "sorted per-expert matmuls"),
    ("torch", "moe", "gpt_oss", "torch_ops:moe_gpt_oss", ANY, "sorted per-expert matmuls"),
    ("torch", "causal_conv1d", "standard", "torch_ops:causal_conv1d", ANY, "portable PyTorch"),
    ("torch", "chunk_gated_delta_rule", "standard", "torch_ops:chunk_gated_delta_rule", ANY, "chunk-parallel PyTorch"),
    ("npu", "rms_norm", "standard", "npu_ops:rms_norm_standard", NPU, "torch_npu.npu_rms_norm (unverified)"),
    ("npu", "rms_norm", "offset", "npu_ops:rms_norm_offset", NPU, "torch_npu.npu_rms_norm (unverified)"),
    ("npu", "rms_norm", "unweighted", "npu_ops:rms_norm_unweighted", NPU, "torch_npu.npu_rms_norm (unverified)"),
    ("npu", "rotary_pos_emb", "full", "npu_ops:rotary_pos_emb_full", NPU, "torch_npu.npu_rotary_mul (unverified)"),
    ("npu", "rotary_pos_emb", "partial", "npu_ops:rotary_pos_emb_partial", NPU, "torch_npu.npu_rotary_mul (unverified)"),
    ("npu", "swiglu_mlp", "standard", "npu_ops:swiglu_mlp", NPU, "torch_npu.npu_swiglu (unverified)"),
    ("npu", "moe", "standard", "npu_ops:moe_standard", NPU, "torch_npu.npu_grouped_matmul (unverified)"),
]


def register_builtin_kernels(registry: KernelRegistry) -> None:
    """Register every built-in kernel in `registry`."""
    for name, op, variant, target, hardware, description in BUILTIN_KERNELS:
        registry.register(KernelSpec(name, op, variant, f"{__name__}.{target}", hardware, description))
