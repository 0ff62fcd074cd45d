"""Which generated module and class serve each Transformers `model_type`, on which device.

`MODELS[model_type]` is a `GeneratedModel`: the spec folder (`specs/<folder>/`), the generated module
of each target (`"gpu"`: `specs/<folder>/<folder>_gpu.yaml` -> `patched_modeling_<folder>_gpu`, the
portable one, used on CUDA and CPU machines; `"npu"`: its Ascend sibling, where the folder has one)
and the class of each role:

- `causal_lm`: what Transformers' `AutoModelForCausalLM` builds for that model type (for a multimodal
  config this can be the `*ForConditionalGeneration`, e.g. gemma3, or the text-only `*ForCausalLM`
  built from the config's text sub-config, e.g. qwen3_5: exactly as upstream maps it);
- `base`: what `AutoModel` builds;
- `conditional_generation`: what `AutoModelForImageTextToText` builds, for multimodal model types.

The table is Python, so it ships with `pip install ./runtime` (the specs do not, see docs/auto.md);
runtime/tests/test_auto.py keeps it equal to `specs/` (every spec folder has its entries and every
entry its spec files, whose `output:` is the module named here), to the classes each generated file
defines, and to Transformers' own auto mappings. A new model: add its spec folder and its line here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Mapping, Optional, Tuple

#: The roles, in the order messages list them, and the opslot auto class that builds each.
ROLES: Tuple[str, ...] = ("causal_lm", "base", "conditional_generation")
AUTO_CLASS_OF_ROLE: Dict[str, str] = {
    "causal_lm": "AutoModelForCausalLM",
    "base": "AutoModel",
    "conditional_generation": "AutoModelForImageTextToText",
}
#: Module targets: "gpu" (CUDA and CPU machines) and "npu" (Ascend).
TARGETS: Tuple[str, ...] = ("gpu", "npu")
#: Spec folders that generate no Transformers model (the example patches the toy package toyformers).
SPEC_FOLDERS_WITHOUT_MODELS: Dict[str, str] = {"example": "patches the toy upstream package toyformers"}


class UnsupportedModelError(ValueError):
    """A model type, role or target that opslot generates no module or class for."""


@dataclass(frozen=True)
class GeneratedModel:
    """One model type's generated module (per target) and classes (per role)."""

    model_type: str
    spec_folder: str
    targets: Tuple[str, ...]
    classes: Mapping[str, str] = field(default_factory=dict)

    def module(self, target: str) -> str:
        """The generated module's import name for `target` ("gpu" or "npu"); UnsupportedModelError
        when the spec folder has no spec for that target."""
        if target not in TARGETS:
            raise ValueError(f"unknown target {target!r}; expected one of: {', '.join(TARGETS)}")
        if target not in self.targets:
            have = ", ".join(self.spec(t) for t in self.targets)
            raise UnsupportedModelError(
                f"model_type {self.model_type!r} has no {target.upper()} module: specs/{self.spec_folder}/ has "
                f"{have} only. Add specs/{self.spec_folder}/{self.spec_folder}_{target}.yaml (extends: "
                f"{self.spec_folder}_gpu.yaml) and its target in opslot/models.py, or use the GPU module here "
                f"with target='gpu'"
            )
        return f"patched_modeling_{self.spec_folder}_{target}"

    def spec(self, target: str) -> str:
        """The spec file of `target`, relative to the specs root (e.g. "qwen3/qwen3_gpu.yaml")."""
        return f"{self.spec_folder}/{self.spec_folder}_{target}.yaml"

    def class_name(self, role: str, who: str = "opslot") -> str:
        """The generated class of `role`; UnsupportedModelError naming the roles it has otherwise."""
        if role not in ROLES:
            raise ValueError(f"unknown role {role!r}; expected one of: {', '.join(ROLES)}")
        name = self.classes.get(role)
        if name is not None:
            return name
        with_role = ", ".join(t for t, m in sorted(MODELS.items()) if role in m.classes)
        alternatives = " or ".join(
            f"opslot.{AUTO_CLASS_OF_ROLE[r]} ({self.classes[r]})" for r in ROLES if r in self.classes
        )
        raise UnsupportedModelError(
            f"{who}: model_type {self.model_type!r} has no {role} class (model types that have one: {with_role}); "
            f"use {alternatives}"
        )


def _models(*rows: Tuple[str, Tuple[str, ...], Dict[str, Dict[str, str]]]) -> Dict[str, GeneratedModel]:
    table: Dict[str, GeneratedModel] = {}
    for folder, targets, types in rows:
        for model_type, classes in types.items():
            assert model_type not in table, model_type
            table[model_type] = GeneratedModel(model_type, folder, targets, dict(classes))
    return dict(sorted(table.items()))


def _text(prefix: str) -> Dict[str, str]:
    return {"causal_lm": f"{prefix}ForCausalLM", "base": f"{prefix}Model"}


def _vision_language(model_type: str, prefix: str) -> Dict[str, Dict[str, str]]:
    """A vision-language family (Qwen2-VL, Qwen2.5-VL, Qwen3-VL, Qwen3-VL-MoE): the multimodal model type
    (`AutoModel` -> `*Model`, `AutoModelForImageTextToText` -> `*ForConditionalGeneration`) and its text
    model type (`AutoModel` -> `*TextModel`). Neither has a causal_lm: Transformers maps none for them."""
    return {
        model_type: {"base": f"{prefix}Model", "conditional_generation": f"{prefix}ForConditionalGeneration"},
        f"{model_type}_text": {"base": f"{prefix}TextModel"},
    }


GPU, GPU_NPU = ("gpu",), ("gpu", "npu")

#: model_type -> GeneratedModel, for every real-model spec folder under specs/.
MODELS: Dict[str, GeneratedModel] = _models(
    ("deepseek_v3", GPU_NPU, {"deepseek_v3": _text("DeepseekV3")}),
    ("deepseek_v4", GPU, {"deepseek_v4": _text("DeepseekV4")}),
    (
        "gemma3",
        GPU,
        {
            "gemma3": {
                "causal_lm": "Gemma3ForConditionalGeneration",
                "base": "Gemma3Model",
                "conditional_generation": "Gemma3ForConditionalGeneration",
            },
            "gemma3_text": {"causal_lm": "Gemma3ForCausalLM", "base": "Gemma3TextModel"},
        },
    ),
    ("glm_moe_dsa", GPU_NPU, {"glm_moe_dsa": _text("GlmMoeDsa")}),
    ("gpt_oss", GPU, {"gpt_oss": _text("GptOss")}),
    ("llama", GPU, {"llama": _text("Llama")}),
    ("qwen2", GPU, {"qwen2": _text("Qwen2")}),
    # the Thinker (what AutoModelForImageTextToText builds for `qwen2_5_omni_thinker`, what is trained);
    # the whole `qwen2_5_omni` model (Thinker + Talker + Token2Wav) has no auto class. From 5.23
    # Transformers also maps the Thinker's base model, Qwen2_5OmniThinkerModel, which 5.17 lacks.
    (
        "qwen2_5_omni",
        GPU,
        {"qwen2_5_omni_thinker": {"conditional_generation": "Qwen2_5OmniThinkerForConditionalGeneration"}},
    ),
    ("qwen2_5_vl", GPU, _vision_language("qwen2_5_vl", "Qwen2_5_VL")),
    ("qwen2_vl", GPU, _vision_language("qwen2_vl", "Qwen2VL")),
    ("qwen3", GPU_NPU, {"qwen3": _text("Qwen3")}),
    (
        "qwen3_5",
        GPU_NPU,
        {
            "qwen3_5": {
                "causal_lm": "Qwen3_5ForCausalLM",
                "base": "Qwen3_5Model",
                "conditional_generation": "Qwen3_5ForConditionalGeneration",
            },
            "qwen3_5_text": {"causal_lm": "Qwen3_5ForCausalLM", "base": "Qwen3_5TextModel"},
        },
    ),
    (
        "qwen3_5_moe",
        GPU_NPU,
        {
            "qwen3_5_moe": {
                "causal_lm": "Qwen3_5MoeForCausalLM",
                "base": "Qwen3_5MoeModel",
                "conditional_generation": "Qwen3_5MoeForConditionalGeneration",
            },
            "qwen3_5_moe_text": {"causal_lm": "Qwen3_5MoeForCausalLM", "base": "Qwen3_5MoeTextModel"},
        },
    ),
    ("qwen3_moe", GPU_NPU, {"qwen3_moe": _text("Qwen3Moe")}),
    # the Thinker, as for qwen2_5_omni (Transformers maps Qwen3OmniMoeThinkerModel as base from 5.23)
    (
        "qwen3_omni_moe",
        GPU_NPU,
        {"qwen3_omni_moe_thinker": {"conditional_generation": "Qwen3OmniMoeThinkerForConditionalGeneration"}},
    ),
    ("qwen3_vl", GPU_NPU, _vision_language("qwen3_vl", "Qwen3VL")),
    ("qwen3_vl_moe", GPU_NPU, _vision_language("qwen3_vl_moe", "Qwen3VLMoe")),
    ("seed_oss", GPU_NPU, {"seed_oss": _text("SeedOss")}),
)


def model_entry(model_type: Optional[str], who: str = "opslot") -> GeneratedModel:
    """`MODELS[model_type]`, or UnsupportedModelError naming the model types opslot generates."""
    entry = MODELS.get(model_type) if isinstance(model_type, str) else None
    if entry is None:
        raise UnsupportedModelError(
            f"{who}: no generated model for model_type {model_type!r}; opslot generates these model types: "
            f"{', '.join(MODELS)} (a new one needs a spec under specs/<model>/ and its entry in opslot/models.py)"
        )
    return entry


def target_for_device(device_type: str) -> str:
    """The module target of a device type: "npu" on Ascend NPUs, "gpu" everywhere else (the GPU
    module is the portable one: it runs on CUDA and on the CPU)."""
    return "npu" if device_type == "npu" else "gpu"
