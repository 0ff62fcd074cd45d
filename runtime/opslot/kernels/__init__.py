"""Built-in kernels and their registration. Factories are "module:attr" strings, so nothing here
imports a kernel module until a slot is bound to it."""

from __future__ import annotations

from ..hardware import ANY, HardwareRequirement
from ..registry import KernelRegistry, KernelSpec

NPU = HardwareRequirement("npu")
#: opslot's CUDA kernels (libopslot_kernels.so, built from kernels/): sm_80 or newer.
CUDA = HardwareRequirement("cuda", min_cc=(8, 0))

#: (impl name, op, variant, "module:attr", hardware, description)
BUILTIN_KERNELS = [
    ("torch", "rms_norm", "standard", "torch_ops:rms_norm_standard", ANY, "portable PyTorch"),
    ("torch", "rms_norm", "offset", "torch_ops:rms_norm_offset", ANY, "portable PyTorch"),
    ("torch", "rms_norm", "unweighted", "torch_ops:rms_norm_unweighted", ANY, "portable PyTorch"),
    ("torch", "rms_norm_gated", "standard", "torch_ops:rms_norm_gated", ANY, "portable PyTorch"),
    ("torch", "rotary_pos_emb", "full", "torch_ops:rotary_pos_emb_full", ANY, "portable PyTorch"),
    ("torch", "rotary_pos_emb", "partial", "torch_ops:rotary_pos_emb_partial", ANY, "portable PyTorch"),
    ("torch", "rotary_pos_emb", "interleaved", "torch_ops:rotary_pos_emb_interleaved", ANY, "portable PyTorch"),
    ("torch", "rotary_pos_emb_vision", "standard", "torch_ops:rotary_pos_emb_vision", ANY, "portable PyTorch, fp32"),
    ("torch", "swiglu_mlp", "standard", "torch_ops:swiglu_mlp", ANY, "portable PyTorch"),
    ("torch", "cross_entropy_loss", "causal", "torch_ops:cross_entropy_causal", ANY, "lm_head + HF causal-LM loss"),
    (
        "torch_chunked",
        "cross_entropy_loss",
        "causal",
        "fused_ce:cross_entropy_causal_chunked",
        ANY,
        "chunked fused linear + cross-entropy, no full logits",
    ),
    (
        "torch",
        "cross_entropy_loss",
        "sequence_classification",
        "torch_ops:cross_entropy_sequence_classification",
        ANY,
        "HF sequence-classification loss",
    ),
    # There is no lm_head to chunk (the pooled logits are [batch, num_labels]): `torch_chunked` is the
    # torch kernel, so that one cross_entropy_loss_implementation binds a model's causal-LM and
    # sequence-classification slots alike.
    (
        "torch_chunked",
        "cross_entropy_loss",
        "sequence_classification",
        "torch_ops:cross_entropy_sequence_classification",
        ANY,
        "the torch kernel (no lm_head to chunk)",
    ),
    ("torch", "load_balancing_loss", "standard", "torch_ops:load_balancing_loss", ANY, "all layers at once"),
    ("torch", "moe", "standard", "torch_ops:moe_standard", ANY, "sorted per-expert matmuls"),
    ("torch", "moe", "gpt_oss", "torch_ops:moe_gpt_oss", ANY, "sorted per-expert matmuls"),
    ("torch", "causal_conv1d", "standard", "torch_ops:causal_conv1d", ANY, "portable PyTorch"),
    ("torch", "swiglu_mlp", "clamped", "torch_ops:swiglu_mlp_clamped", ANY, "portable PyTorch"),
    ("torch", "moe", "clamped", "torch_ops:moe_clamped", ANY, "sorted per-expert matmuls"),
    ("torch", "mhc", "pre", "torch_ops:mhc_pre", ANY, "portable PyTorch"),
    ("torch", "mhc", "post", "torch_ops:mhc_post", ANY, "portable PyTorch"),
    ("torch", "mhc", "head", "torch_ops:mhc_head", ANY, "portable PyTorch"),
    (
        "torch",
        "dsa_indexer",
        "deepseek_v4",
        "torch_ops:dsa_indexer_deepseek_v4",
        ANY,
        "portable PyTorch, scores in query chunks",
    ),
    (
        "torch",
        "dsa_attention",
        "deepseek_v4",
        "torch_ops:dsa_attention_deepseek_v4",
        ANY,
        "portable PyTorch, the shared K=V head not repeated",
    ),
    ("torch", "dsa_indexer", "glm", "torch_ops:dsa_indexer_glm", ANY, "upstream's scores in query blocks"),
    ("torch", "dsa_attention", "glm", "torch_ops:dsa_attention_glm", ANY, "upstream's K/V expansion and masks"),
    ("torch", "chunk_gated_delta_rule", "standard", "torch_ops:chunk_gated_delta_rule", ANY, "chunk-parallel PyTorch"),
    ("cuda", "rms_norm", "standard", "cuda.norms:rms_norm_standard", CUDA, "CUDA kernel, one pass each way"),
    ("cuda", "rms_norm", "offset", "cuda.norms:rms_norm_offset", CUDA, "CUDA kernel, one pass each way"),
    ("cuda", "rms_norm", "unweighted", "cuda.norms:rms_norm_unweighted", CUDA, "CUDA kernel, one pass each way"),
    ("cuda", "rms_norm_gated", "standard", "cuda.norms:rms_norm_gated", CUDA, "CUDA kernel, one pass each way"),
    ("cuda", "rotary_pos_emb", "full", "cuda.rope:rotary_pos_emb_full", CUDA, "CUDA kernel on strided q/k"),
    ("cuda", "rotary_pos_emb", "partial", "cuda.rope:rotary_pos_emb_partial", CUDA, "CUDA kernel on strided q/k"),
    (
        "cuda",
        "rotary_pos_emb",
        "interleaved",
        "cuda.rope:rotary_pos_emb_interleaved",
        CUDA,
        "CUDA kernel on strided q/k, pairs de-interleaved in registers",
    ),
    (
        "cuda",
        "rotary_pos_emb_vision",
        "standard",
        "cuda.rope:rotary_pos_emb_vision",
        CUDA,
        "CUDA kernel on strided q/k, upstream's fp32 rounding",
    ),
    ("cuda", "swiglu_mlp", "standard", "cuda.swiglu:swiglu_mlp", CUDA, "cuBLAS GEMMs + fused SiLU-mul kernels"),
    (
        "cuda",
        "load_balancing_loss",
        "standard",
        "cuda.load_balancing:load_balancing_loss",
        CUDA,
        "CUDA kernel over the per-layer router logits",
    ),
    (
        "cuda",
        "cross_entropy_loss",
        "causal",
        "cuda.cross_entropy:cross_entropy_causal",
        CUDA,
        "chunked lm_head GEMMs + fused CUDA softmax/loss/gradient, no full logits",
    ),
    (
        "cuda",
        "cross_entropy_loss",
        "sequence_classification",
        "cuda.cross_entropy:cross_entropy_sequence_classification",
        CUDA,
        "CUDA cross-entropy on given logits",
    ),
    ("cuda", "moe", "standard", "cuda.moe:moe_standard", CUDA, "device routing + grouped GEMMs, no host sync"),
    ("cuda", "moe", "gpt_oss", "cuda.moe:moe_gpt_oss", CUDA, "device routing + grouped GEMMs, no host sync"),
    (
        "cuda",
        "causal_conv1d",
        "standard",
        "cuda.causal_conv1d:causal_conv1d",
        CUDA,
        "CUDA kernel, fwd+bwd, packed sequences",
    ),
    (
        "cuda",
        "chunk_gated_delta_rule",
        "standard",
        "cuda.gated_delta_rule:chunk_gated_delta_rule",
        CUDA,
        "chunked gated delta rule on tensor cores, fwd+bwd, packed sequences",
    ),
    (
        "cuda",
        "dsa_attention",
        "glm",
        "cuda.sparse_attention:dsa_attention_glm",
        CUDA,
        "absorbed MLA (one latent head) over the selected keys, tensor cores, fwd+bwd",
    ),
    (
        "cuda",
        "dsa_attention",
        "deepseek_v4",
        "cuda.sparse_attention:dsa_attention_deepseek_v4",
        CUDA,
        "window + compressed keys from the mask, with sinks, tensor cores, fwd+bwd",
    ),
    (
        "cuda",
        "dsa_indexer",
        "glm",
        "cuda.dsa_indexer:dsa_indexer_glm",
        CUDA,
        "indexer scores on tensor cores (causal tiles skipped) + torch.topk",
    ),
    (
        "cuda",
        "dsa_indexer",
        "deepseek_v4",
        "cuda.dsa_indexer:dsa_indexer_deepseek_v4",
        CUDA,
        "indexer scores on tensor cores (causal tiles skipped) + torch.topk",
    ),
    ("npu", "rms_norm", "standard", "npu_ops:rms_norm_standard", NPU, "torch_npu.npu_rms_norm (unverified)"),
    ("npu", "rms_norm", "offset", "npu_ops:rms_norm_offset", NPU, "torch_npu.npu_rms_norm (unverified)"),
    ("npu", "rms_norm", "unweighted", "npu_ops:rms_norm_unweighted", NPU, "torch_npu.npu_rms_norm (unverified)"),
    ("npu", "rotary_pos_emb", "full", "npu_ops:rotary_pos_emb_full", NPU, "torch_npu.npu_rotary_mul (unverified)"),
    (
        "npu",
        "rotary_pos_emb",
        "partial",
        "npu_ops:rotary_pos_emb_partial",
        NPU,
        "torch_npu.npu_rotary_mul (unverified)",
    ),
    (
        "npu",
        "rotary_pos_emb",
        "interleaved",
        "npu_ops:rotary_pos_emb_interleaved",
        NPU,
        "de-interleave + torch_npu.npu_rotary_mul (unverified)",
    ),
    (
        "npu",
        "rotary_pos_emb_vision",
        "standard",
        "npu_ops:rotary_pos_emb_vision",
        NPU,
        "torch_npu.npu_rotary_mul in fp32 (unverified)",
    ),
    ("npu", "swiglu_mlp", "standard", "npu_ops:swiglu_mlp", NPU, "torch_npu.npu_swiglu (unverified)"),
    ("npu", "moe", "standard", "npu_ops:moe_standard", NPU, "torch_npu.npu_grouped_matmul (unverified)"),
]


def register_builtin_kernels(registry: KernelRegistry) -> None:
    """Register every built-in kernel in `registry`."""
    for name, op, variant, target, hardware, description in BUILTIN_KERNELS:
        registry.register(KernelSpec(name, op, variant, f"{__name__}.{target}", hardware, description))
