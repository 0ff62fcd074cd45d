"""Ops sections written for the reference trainer (VeOmni's `model.ops_implementation`), read as opslot's.

The reference trainer names a kernel after its library (`liger_kernel`, `triton`, `fused_triton`,
`fused_quack`, `fla`, `flash_qla`, `chunk_loss`); opslot names it after the device (`cuda`, `npu`,
`torch`, `torch_chunked`, `fused_<impl>` for moe). `OpsImplementationConfig.from_dict` (and so
`from_yaml`, `coerce` and the `ops=` of every entry point) passes the section through `translate`
first:

- a reference name whose kernel computes the op's upstream math becomes opslot's kernel of that op
  for the device that loads the config (`REFERENCE_NAMES`: one column per device); the choice is
  recorded in `config.aliases` ({field: (as written, opslot's)}), logged once at INFO on the
  `opslot.compat` logger, and its op may bind no slot of the model (added to `allow_unbound`: the
  reference applies a field only where the model has the op);
- a reference name with no equivalent (`NO_EQUIVALENT`), or one for another device, is an error that
  says what opslot offers instead;
- `strict_names: true` in the section refuses every reference name (opslot's names only).

A value that names one of opslot's kernels (or a plug-in's) for the op is opslot's, never translated.
The table with the reasons is docs/migration.md ("Ops configs written for the reference trainer").
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Set, Tuple

from .hardware import DeviceInfo, current_device
from .ops import EAGER
from .registry import KERNEL_REGISTRY, KernelRegistry

logger = logging.getLogger("opslot.compat")

#: The key of an ops section that refuses the reference trainer's names (a boolean, default false).
STRICT_KEY = "strict_names"

_P = "ops_implementation"


@dataclass(frozen=True)
class ReferenceName:
    """A reference-trainer value of `field` and opslot's value for it on each device kind (`cuda`,
    `npu`, `cpu`); None where opslot refuses it (`elsewhere` says why and what instead)."""

    field: str
    value: str
    cuda: Optional[str]
    npu: Optional[str]
    cpu: Optional[str]
    what: str
    elsewhere: str = ""

    def ours(self, device: DeviceInfo) -> Optional[str]:
        return getattr(self, _kind(device))


_NPU_ONLY = "opslot reads it on an Ascend NPU only, as the reference runs it only there"


def _gpu(field: str, value: str, cuda: str, npu: str, cpu: str, what: str) -> ReferenceName:
    return ReferenceName(field, value, cuda, npu, cpu, what)


def _npu(field: str, value: str, ours: str, what: str) -> ReferenceName:
    return ReferenceName(field, value, None, ours, None, what, _NPU_ONLY)


_SM90 = "opslot's kernel of it is its cuda kernel, on a CUDA GPU only, as the reference runs it only there"


def _sm90(field: str, value: str, what: str) -> ReferenceName:
    """A reference name for a kernel of the reference's that runs on SM90+ GPUs only (TileLang, cuDNN,
    FlashMLA): opslot's `cuda` on a CUDA device, refused elsewhere."""
    return ReferenceName(field, value, "cuda", None, None, what, _SM90)


#: Every reference name that opslot reads, with its value per device (docs/migration.md says why each
#: computes the same math).
REFERENCE_NAMES: Tuple[ReferenceName, ...] = (
    _gpu("rms_norm_implementation", "liger_kernel", "cuda", "npu", "torch", "Liger-Kernel RMSNorm (GPU)"),
    ReferenceName(
        "rms_norm_implementation",
        "triton",
        "cuda",
        None,
        None,
        "batch-invariant Triton RMSNorm (DeepSeek-V3, GPU)",
        "opslot's batch-invariant RMSNorm is its cuda kernel, on a CUDA GPU only",
    ),
    _gpu("rotary_pos_emb_implementation", "liger_kernel", "cuda", "npu", "torch", "Liger-Kernel RoPE (GPU)"),
    _gpu("swiglu_mlp_implementation", "liger_kernel", "cuda", "npu", "torch", "Liger-Kernel SwiGLU MLP (GPU)"),
    _gpu("load_balancing_loss_implementation", "triton", "cuda", "torch", "torch", "Triton load-balancing loss (GPU)"),
    _gpu(
        "cross_entropy_loss_implementation",
        "liger_kernel",
        "cuda",
        "torch_chunked",
        "torch_chunked",
        "Liger-Kernel fused linear + cross-entropy (GPU)",
    ),
    _gpu(
        "cross_entropy_loss_implementation",
        "chunk_loss",
        "torch_chunked",
        "torch_chunked",
        "torch_chunked",
        "chunked linear + cross-entropy in PyTorch (any device)",
    ),
    _npu("cross_entropy_loss_implementation", "npu", "torch_chunked", "NPU-gated name of its chunk_loss"),
    _gpu(
        "moe_implementation",
        "fused_triton",
        "fused_cuda",
        "fused_npu",
        "fused_torch",
        "Triton group-GEMM MoE experts (GPU, sm_70+)",
    ),
    _gpu(
        "moe_implementation",
        "fused_quack",
        "fused_cuda",
        "fused_npu",
        "fused_torch",
        "Quack CUTLASS/CuTe MoE experts (GPU, sm_90+)",
    ),
    _gpu(
        "moe_implementation",
        "fused",
        "fused_cuda",
        "fused_npu",
        "fused_torch",
        "deprecated MoE alias (fused_quack on a GPU, fused_npu on an NPU)",
    ),
    _gpu(
        "rms_norm_gated_implementation",
        "fla",
        "cuda",
        "torch",
        "torch",
        "flash-linear-attention FusedRMSNormGated (GPU)",
    ),
    _npu("rms_norm_gated_implementation", "npu", "torch", "NPUFusedRMSNormGated (Ascend NPU)"),
    _gpu("causal_conv1d_implementation", "fla", "cuda", "torch", "torch", "flash-linear-attention causal conv1d (GPU)"),
    _npu("causal_conv1d_implementation", "npu", "torch", "vendored Triton causal conv1d (Ascend NPU)"),
    _gpu(
        "chunk_gated_delta_rule_implementation",
        "fla",
        "cuda",
        "torch",
        "torch",
        "flash-linear-attention chunk gated delta rule (GPU)",
    ),
    _gpu(
        "chunk_gated_delta_rule_implementation",
        "flash_qla",
        "cuda",
        "torch",
        "torch",
        "FlashQLA chunk gated delta rule (GPU, sm_90)",
    ),
    _npu(
        "chunk_gated_delta_rule_implementation", "npu", "torch", "vendored Triton chunk gated delta rule (Ascend NPU)"
    ),
    _npu(
        "chunk_gated_delta_rule_implementation",
        "npu_ascendc",
        "torch",
        "AscendC fused chunk gated delta rule (Ascend NPU)",
    ),
    _sm90("dsa_indexer_implementation", "tilelang", "TileLang sparse-attention indexer (GPU, sm_90+)"),
    _sm90("dsa_indexer_implementation", "cudnn", "cuDNN sparse-attention indexer (GPU, sm_90+)"),
    _sm90("dsa_attention_implementation", "tilelang", "TileLang sparse attention (GPU, sm_90+)"),
    _sm90("dsa_attention_implementation", "flashmla_cudnn", "FlashMLA/cuDNN sparse attention (GPU, sm_90+)"),
    _sm90("mhc_implementation", "tilelang", "TileLang manifold-constrained hyper-connections (GPU, sm_90+)"),
) + tuple(
    _gpu(
        "attn_implementation",
        f"veomni_{name}_with_sp",
        name,
        name,
        name,
        f"{name} behind its Ulysses sequence-parallel wrapper",
    )
    for name in ("flash_attention_2", "flash_attention_3", "flash_attention_4", "flex_attention")
)

_TRANSFORMERS_ATTN = "sdpa, flash_attention_2, flash_attention_3, flash_attention_4, flex_attention, eager"

#: Reference names with no equivalent in opslot: (field, value) -> what it is and why there is none.
NO_EQUIVALENT: Dict[Tuple[str, str], str] = {
    (
        "rotary_pos_emb_implementation",
        "triton",
    ): "deterministic RoPE table of DeepSeek-V3 (a Triton bmm in DeepseekV3RotaryEmbedding.forward, the cos/sin "
    "computation), not a kernel of apply_rotary_pos_emb, which this field chooses; opslot has no slot for the "
    "table (upstream's code computes it)",
    (
        "attn_implementation",
        "magi_attention",
    ): "MagiAttention (a MagiAttentionMask built by its own models); Transformers, which runs opslot's attention, "
    "has none",
    (
        "attn_implementation",
        "veomni_magi_attention_with_sp",
    ): "MagiAttention behind its Ulysses wrapper (a MagiAttentionMask built by its own models); Transformers, "
    "which runs opslot's attention, has none",
    (
        "attn_implementation",
        "native-sparse",
    ): "native sparse attention; Transformers, which runs opslot's attention, has none",
}

_BY_NAME: Dict[Tuple[str, str], ReferenceName] = {(r.field, r.value): r for r in REFERENCE_NAMES}
_LOGGED: Set[str] = set()


def _kind(device: DeviceInfo) -> str:
    return device.type if device.type in ("cuda", "npu") else "cpu"


def _op(field: str) -> str:
    return field[: -len("_implementation")]


def _kernels(op: str, registry: KernelRegistry, device: Optional[DeviceInfo]) -> List[str]:
    """The names of `op`'s kernels (any variant; usable on `device`, or all with `device` None)."""
    every = registry.list_available(op, device=device, include_unsupported=device is None)
    names = sorted({name for names in every.values() for name in names})
    return [f"fused_{n}" for n in names] if op == "moe" else names


def _is_ours(field: str, value: str, registry: KernelRegistry) -> bool:
    if value == EAGER:
        return True
    if field == "attn_implementation":  # Transformers' names, checked by OpsImplementationConfig
        return (field, value) not in _BY_NAME and (field, value) not in NO_EQUIVALENT
    return value in _kernels(_op(field), registry, None)


def _values_here(field: str, registry: KernelRegistry, device: DeviceInfo) -> str:
    return ", ".join([EAGER] + _kernels(_op(field), registry, device))


def _refusal(row: ReferenceName, registry: KernelRegistry, device: DeviceInfo) -> str:
    return (
        f"{_P}.{row.field}: {row.value!r} is the reference trainer's {row.what}; {row.elsewhere}, and this "
        f"machine has {device.describe()}. opslot's values for {row.field} here: "
        f"{_values_here(row.field, registry, device)}"
    )


def _no_equivalent(field: str, value: str, registry: KernelRegistry) -> str:
    if field == "attn_implementation":
        offered = f"a Transformers attention: {_TRANSFORMERS_ATTN}"
    else:
        offered = f"opslot's values for {field}: {', '.join([EAGER] + _kernels(_op(field), registry, None))}"
    return f"{_P}.{field}: {value!r} is the reference trainer's {NO_EQUIVALENT[(field, value)]}. Use {offered}"


def translate(
    data: Mapping[str, Any], device: Optional[DeviceInfo] = None, registry: Optional[KernelRegistry] = None
) -> Tuple[Dict[str, Any], Dict[str, Tuple[str, str]]]:
    """(the section in opslot's names, {field: (as written, opslot's)}) for an ops section `data`
    (a mapping of fields, without `model:`/`ops_implementation:` around it) read on `device`
    (default: this machine). Keys it does not know are passed through (from_dict checks them).
    Every problem found is reported in one ValueError."""
    device = device or current_device()
    registry = registry or KERNEL_REGISTRY
    out = dict(data)
    strict = out.pop(STRICT_KEY, False)
    if not isinstance(strict, bool):
        raise ValueError(f"{_P}.{STRICT_KEY} must be true or false, got {strict!r}")
    aliases: Dict[str, Tuple[str, str]] = {}
    problems: List[str] = []
    for field, value in data.items():
        if not isinstance(field, str) or not field.endswith("_implementation"):
            continue  # strict_names, allow_unbound, and keys from_dict refuses
        if not isinstance(value, str) or _is_ours(field, value, registry):
            continue
        if (field, value) in NO_EQUIVALENT:
            problems.append(_no_equivalent(field, value, registry))
            continue
        row = _BY_NAME.get((field, value))
        if row is None:
            continue  # not a reference name either: from_dict and validate say what is wrong with it
        ours = row.ours(device)
        if ours is None:
            problems.append(_refusal(row, registry, device))
        elif strict:
            problems.append(
                f"{_P}.{field}: {value!r} is the reference trainer's name, and {_P}.{STRICT_KEY} is set "
                f"(opslot's names only): write {ours!r}, its equivalent on this machine "
                f"({device.describe()})"
            )
        else:
            out[field] = ours
            aliases[field] = (value, ours)
    if len(problems) == 1:
        raise ValueError(problems[0])
    if problems:
        raise ValueError(
            f"{_P} written for the reference trainer has {len(problems)} problems:\n"
            + "\n".join(f"  {p}" for p in problems)
        )
    _allow_unbound(out, aliases)
    _log(aliases, device)
    return out, aliases


def _allow_unbound(out: Dict[str, Any], aliases: Mapping[str, Tuple[str, str]]) -> None:
    """The ops of translated fields may bind no slot (as the reference applies a field only where the
    model has the op); an allow_unbound the user wrote is kept and extended."""
    ops = [_op(f) for f in aliases if f != "attn_implementation"]
    if not ops:
        return
    given = out.get("allow_unbound")
    if given is None:
        out["allow_unbound"] = ops
    elif isinstance(given, str):
        out["allow_unbound"] = [given] + ops
    elif isinstance(given, (list, tuple)):
        out["allow_unbound"] = list(given) + ops
    # anything else is left for OpsImplementationConfig to refuse


def _log(aliases: Mapping[str, Tuple[str, str]], device: DeviceInfo) -> None:
    """One INFO record per distinct translation in this process."""
    if not aliases:
        return
    message = (
        f"{_P} written for the reference trainer, read on {device.describe()}: "
        + ", ".join(f"{f} {given!r} -> {ours!r}" for f, (given, ours) in aliases.items())
        + f" ({_P}.{STRICT_KEY}: true refuses these names)"
    )
    if message in _LOGGED:
        return
    _LOGGED.add(message)
    logger.info("%s", message)
