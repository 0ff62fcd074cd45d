"""opslot.compat: ops sections written for the reference trainer (VeOmni) load as is (issue #33, item 1).

The tables of docs/migration.md ("Ops configs written for the reference trainer") drive the alias tests,
so the page and the code cannot drift apart; every refusal's text is compared exactly; a full
reference-style Qwen3-MoE section is loaded, bound and (on a CPU and a simulated NPU) stepped with the
generated modules (generated/qwen3_moe/ from `make run`, else patchgen's output: qwen3_moe_dir)."""

import importlib.util
import logging
import os
import pickle
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from fake_torch_npu import make_fake_torch_npu
from opslot import (
    KERNEL_REGISTRY,
    DeviceInfo,
    KernelSpec,
    OpsImplementationConfig,
    binding_plan,
    build_model,
    compat,
    declared_slots,
    use_device,
)
from opslot.choice import moe_config_values
from opslot.dispatch import watch_dispatch
from opslot.suggestions import suggest_value as _suggest_value

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "migration.md"
CPU, NPU, H200 = DeviceInfo("cpu"), DeviceInfo("npu"), DeviceInfo("cuda", (9, 0))
COLUMNS = {"CUDA": H200, "Ascend NPU": NPU, "CPU": CPU}


# -- the page --------------------------------------------------------------------------------------
def _section():
    text = DOC.read_text(encoding="utf-8")
    start = text.index("## Ops configs written for the reference trainer")
    end = text.find("\n## ", start + 1)
    return text[start:] if end == -1 else text[start:end]


def _table(header):
    """The rows (lists of cells, backticks removed) of the section's table whose header starts with `header`."""
    lines = _section().splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith(header))
    rows = []
    for line in lines[first + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip().strip("`") for cell in line.strip().strip("|").split("|")])
    return rows


def _block(kind, after):
    """The first ```kind fenced block after the text `after` in the section."""
    section = _section()
    return re.search(rf"```{kind}\n(.*?)```", section[section.index(after) :], re.S).group(1)


ALIASES = _table("| reference field | reference value | CUDA | Ascend NPU | CPU |")
NO_EQUIVALENT = _table("| reference field | reference value | why there is none |")
ALIAS_CASES = [
    pytest.param(
        row[0], row[1], column, None if row[2 + i] == "refused" else row[2 + i], id=f"{row[0]}={row[1]}@{column}"
    )
    for row in ALIASES
    for i, column in enumerate(COLUMNS)
]


def test_the_page_lists_what_the_code_knows():
    assert {(r[0], r[1]) for r in ALIASES} == {(r.field, r.value) for r in compat.REFERENCE_NAMES}
    assert {(r[0], r[1]) for r in NO_EQUIVALENT} == set(compat.NO_EQUIVALENT)


@pytest.mark.parametrize("field, value, column, ours", ALIAS_CASES)
def test_every_alias_maps_as_documented(field, value, column, ours):
    with use_device(COLUMNS[column]):
        if ours is None:
            with pytest.raises(ValueError) as err:
                OpsImplementationConfig.from_dict({field: value})
            assert str(err.value).startswith(f"ops_implementation.{field}: {value!r} is the reference trainer's ")
        else:
            config = OpsImplementationConfig.from_dict({field: value})
            assert (getattr(config, field), config.aliases) == (ours, {field: (value, ours)})


@pytest.mark.parametrize("field", ["dsa_indexer_implementation", "dsa_attention_implementation", "mhc_implementation"])
def test_the_reference_fields_of_issue_35_are_opslots_own(field):
    # once reference-only (accepted at eager and ignored), now fields of opslot's with slots
    config = OpsImplementationConfig.from_dict({field: "eager", "strict_names": True})
    assert (getattr(config, field), config.aliases) == ("eager", {})


def test_the_page_example_loads_and_logs_as_shown(caplog, monkeypatch):
    monkeypatch.setattr(compat, "_LOGGED", set())
    caplog.set_level(logging.INFO, logger="opslot.compat")
    with use_device(H200):
        config = OpsImplementationConfig.coerce(_block("yaml", "loads as is"))
    assert config.to_dict() == {
        "rms_norm_implementation": "cuda",
        "cross_entropy_loss_implementation": "cuda",
        "load_balancing_loss_implementation": "cuda",
        "moe_implementation": "fused_cuda",
        "mhc_implementation": "eager",
        "attn_implementation": "flash_attention_2",
        "allow_unbound": ["cross_entropy_loss", "load_balancing_loss", "moe", "rms_norm"],
    }
    assert [r.getMessage() for r in caplog.records if r.name == "opslot.compat"] == [
        _block("text", "logs, once").strip()
    ]


# -- the log ---------------------------------------------------------------------------------------
def test_the_mapping_is_logged_once_at_info(caplog, monkeypatch):
    monkeypatch.setattr(compat, "_LOGGED", set())
    caplog.set_level(logging.DEBUG, logger="opslot.compat")
    section = {"model": {"ops_implementation": {"moe_implementation": "fused_triton", "mhc_implementation": "eager"}}}
    # mhc_implementation: eager is opslot's name too: kept as written, not logged
    with use_device(NPU):
        for _ in range(3):
            OpsImplementationConfig.from_dict(section)
        OpsImplementationConfig.from_dict({"moe_implementation": "fused_npu"})  # opslot's names: nothing to log
    with use_device(CPU):
        OpsImplementationConfig.from_dict(section)  # another translation: logged too
    assert [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "opslot.compat"] == [
        (
            logging.INFO,
            "ops_implementation written for the reference trainer, read on npu: moe_implementation "
            "'fused_triton' -> 'fused_npu' (ops_implementation.strict_names: true refuses these names)",
        ),
        (
            logging.INFO,
            "ops_implementation written for the reference trainer, read on cpu: moe_implementation "
            "'fused_triton' -> 'fused_torch' (ops_implementation.strict_names: true refuses these names)",
        ),
    ]


# -- refusals, word for word -----------------------------------------------------------------------
REFUSALS = [
    # names for another device
    (
        CPU,
        {"cross_entropy_loss_implementation": "npu"},
        "ops_implementation.cross_entropy_loss_implementation: 'npu' is the reference trainer's NPU-gated name of its "
        "chunk_loss; opslot reads it on an Ascend NPU only, as the reference runs it only there, and this machine has "
        "cpu. opslot's values for cross_entropy_loss_implementation here: eager, torch, torch_chunked",
    ),
    (
        H200,
        {"cross_entropy_loss_implementation": "npu"},
        "ops_implementation.cross_entropy_loss_implementation: 'npu' is the reference trainer's NPU-gated name of its "
        "chunk_loss; opslot reads it on an Ascend NPU only, as the reference runs it only there, and this machine has "
        "cuda (sm_90). opslot's values for cross_entropy_loss_implementation here: eager, cuda, torch, torch_chunked",
    ),
    (
        CPU,
        {"rms_norm_gated_implementation": "npu"},
        "ops_implementation.rms_norm_gated_implementation: 'npu' is the reference trainer's NPUFusedRMSNormGated "
        "(Ascend NPU); opslot reads it on an Ascend NPU only, as the reference runs it only there, and this machine has "
        "cpu. opslot's values for rms_norm_gated_implementation here: eager, torch",
    ),
    (
        H200,
        {"causal_conv1d_implementation": "npu"},
        "ops_implementation.causal_conv1d_implementation: 'npu' is the reference trainer's vendored Triton causal "
        "conv1d (Ascend NPU); opslot reads it on an Ascend NPU only, as the reference runs it only there, and this "
        "machine has cuda (sm_90). opslot's values for causal_conv1d_implementation here: eager, cuda, torch",
    ),
    (
        CPU,
        {"chunk_gated_delta_rule_implementation": "npu"},
        "ops_implementation.chunk_gated_delta_rule_implementation: 'npu' is the reference trainer's vendored Triton "
        "chunk gated delta rule (Ascend NPU); opslot reads it on an Ascend NPU only, as the reference runs it only "
        "there, and this machine has cpu. opslot's values for chunk_gated_delta_rule_implementation here: eager, torch",
    ),
    (
        H200,
        {"chunk_gated_delta_rule_implementation": "npu_ascendc"},
        "ops_implementation.chunk_gated_delta_rule_implementation: 'npu_ascendc' is the reference trainer's AscendC "
        "fused chunk gated delta rule (Ascend NPU); opslot reads it on an Ascend NPU only, as the reference runs it "
        "only there, and this machine has cuda (sm_90). opslot's values for chunk_gated_delta_rule_implementation "
        "here: eager, cuda, torch",
    ),
    (
        NPU,
        {"rms_norm_implementation": "triton"},
        "ops_implementation.rms_norm_implementation: 'triton' is the reference trainer's batch-invariant Triton "
        "RMSNorm (DeepSeek-V3, GPU); opslot's batch-invariant RMSNorm is its cuda kernel, on a CUDA GPU only, and "
        "this machine has npu. opslot's values for rms_norm_implementation here: eager, npu, torch",
    ),
    (
        CPU,
        {"rms_norm_implementation": "triton"},
        "ops_implementation.rms_norm_implementation: 'triton' is the reference trainer's batch-invariant Triton "
        "RMSNorm (DeepSeek-V3, GPU); opslot's batch-invariant RMSNorm is its cuda kernel, on a CUDA GPU only, and "
        "this machine has cpu. opslot's values for rms_norm_implementation here: eager, torch",
    ),
    # names with no equivalent (any device)
    (
        H200,
        {"rotary_pos_emb_implementation": "triton"},
        "ops_implementation.rotary_pos_emb_implementation: 'triton' is the reference trainer's deterministic RoPE "
        "table of DeepSeek-V3 (a Triton bmm in DeepseekV3RotaryEmbedding.forward, the cos/sin computation), not a "
        "kernel of apply_rotary_pos_emb, which this field chooses; opslot has no slot for the table (upstream's code "
        "computes it). Use opslot's values for rotary_pos_emb_implementation: eager, cuda, npu, torch",
    ),
    (
        H200,
        {"attn_implementation": "magi_attention"},
        "ops_implementation.attn_implementation: 'magi_attention' is the reference trainer's MagiAttention (a "
        "MagiAttentionMask built by its own models); Transformers, which runs opslot's attention, has none. Use a "
        "Transformers attention: sdpa, flash_attention_2, flash_attention_3, flash_attention_4, flex_attention, eager",
    ),
    (
        CPU,
        {"attn_implementation": "veomni_magi_attention_with_sp"},
        "ops_implementation.attn_implementation: 'veomni_magi_attention_with_sp' is the reference trainer's "
        "MagiAttention behind its Ulysses wrapper (a MagiAttentionMask built by its own models); Transformers, which "
        "runs opslot's attention, has none. Use a Transformers attention: sdpa, flash_attention_2, flash_attention_3, "
        "flash_attention_4, flex_attention, eager",
    ),
    (
        NPU,
        {"attn_implementation": "native-sparse"},
        "ops_implementation.attn_implementation: 'native-sparse' is the reference trainer's native sparse attention; "
        "Transformers, which runs opslot's attention, has none. Use a Transformers attention: sdpa, flash_attention_2, "
        "flash_attention_3, flash_attention_4, flex_attention, eager",
    ),
    # the reference's SM90+ kernels (TileLang, cuDNN, FlashMLA) off a CUDA GPU
    (
        CPU,
        {"dsa_indexer_implementation": "tilelang"},
        "ops_implementation.dsa_indexer_implementation: 'tilelang' is the reference trainer's TileLang sparse-attention "
        "indexer (GPU, sm_90+); opslot's kernel of it is its cuda kernel, on a CUDA GPU only, as the reference runs it "
        "only there, and this machine has cpu. opslot's values for dsa_indexer_implementation here: eager, torch",
    ),
    (
        NPU,
        {"dsa_attention_implementation": "flashmla_cudnn"},
        "ops_implementation.dsa_attention_implementation: 'flashmla_cudnn' is the reference trainer's FlashMLA/cuDNN "
        "sparse attention (GPU, sm_90+); opslot's kernel of it is its cuda kernel, on a CUDA GPU only, as the "
        "reference runs it only there, and this machine has npu. opslot's values for dsa_attention_implementation "
        "here: eager, torch",
    ),
    # every problem of a section at once
    (
        CPU,
        {
            "rms_norm_implementation": "liger_kernel",
            "rotary_pos_emb_implementation": "triton",
            "dsa_indexer_implementation": "cudnn",
        },
        "ops_implementation written for the reference trainer has 2 problems:\n"
        "  ops_implementation.rotary_pos_emb_implementation: 'triton' is the reference trainer's deterministic RoPE "
        "table of DeepSeek-V3 (a Triton bmm in DeepseekV3RotaryEmbedding.forward, the cos/sin computation), not a "
        "kernel of apply_rotary_pos_emb, which this field chooses; opslot has no slot for the table (upstream's code "
        "computes it). Use opslot's values for rotary_pos_emb_implementation: eager, cuda, npu, torch\n"
        "  ops_implementation.dsa_indexer_implementation: 'cudnn' is the reference trainer's cuDNN sparse-attention "
        "indexer (GPU, sm_90+); opslot's kernel of it is its cuda kernel, on a CUDA GPU only, as the reference runs it "
        "only there, and this machine has cpu. opslot's values for dsa_indexer_implementation here: eager, torch",
    ),
]


@pytest.mark.parametrize("device, section, message", REFUSALS, ids=lambda x: None)
def test_refusals_say_what_opslot_offers(device, section, message):
    with use_device(device), pytest.raises(ValueError) as err:
        OpsImplementationConfig.from_dict({"model": {"ops_implementation": section}})
    assert str(err.value) == message


# -- strict names ----------------------------------------------------------------------------------
STRICT_REFUSALS = [
    (
        NPU,
        {"moe_implementation": "fused"},
        "ops_implementation.moe_implementation: 'fused' is the reference trainer's name, and "
        "ops_implementation.strict_names is set (opslot's names only): write 'fused_npu', its equivalent on this "
        "machine (npu)",
    ),
    (
        CPU,
        {"moe_implementation": "fused"},
        "ops_implementation.moe_implementation: 'fused' is the reference trainer's name, and "
        "ops_implementation.strict_names is set (opslot's names only): write 'fused_torch', its equivalent on this "
        "machine (cpu)",
    ),
    (
        H200,
        {"rms_norm_implementation": "liger_kernel"},
        "ops_implementation.rms_norm_implementation: 'liger_kernel' is the reference trainer's name, and "
        "ops_implementation.strict_names is set (opslot's names only): write 'cuda', its equivalent on this machine "
        "(cuda (sm_90))",
    ),
    (
        H200,
        {"attn_implementation": "veomni_flash_attention_2_with_sp"},
        "ops_implementation.attn_implementation: 'veomni_flash_attention_2_with_sp' is the reference trainer's name, "
        "and ops_implementation.strict_names is set (opslot's names only): write 'flash_attention_2', its equivalent "
        "on this machine (cuda (sm_90))",
    ),
    (
        H200,
        {"dsa_attention_implementation": "flashmla_cudnn"},
        "ops_implementation.dsa_attention_implementation: 'flashmla_cudnn' is the reference trainer's name, and "
        "ops_implementation.strict_names is set (opslot's names only): write 'cuda', its equivalent on this machine "
        "(cuda (sm_90))",
    ),
]


@pytest.mark.parametrize("device, section, message", STRICT_REFUSALS, ids=lambda x: None)
def test_strict_names_refuse_the_reference_names(device, section, message):
    with use_device(device), pytest.raises(ValueError) as err:
        OpsImplementationConfig.from_dict({"ops_implementation": dict(section, strict_names=True)})
    assert str(err.value) == message


def test_strict_names_accept_opslot_names_and_are_not_kept():
    text = "model:\n  ops_implementation:\n    strict_names: true\n    moe_implementation: fused_torch\n"
    config = OpsImplementationConfig.coerce(text)
    assert (config, config.aliases) == (OpsImplementationConfig(moe_implementation="fused_torch"), {})
    loose = OpsImplementationConfig.from_dict({"strict_names": False, "moe_implementation": "fused_quack"})
    assert loose.aliases == {"moe_implementation": ("fused_quack", "fused_torch")}


def test_strict_names_must_be_a_boolean():
    with pytest.raises(ValueError) as err:
        OpsImplementationConfig.from_dict({"strict_names": "yes", "rms_norm_implementation": "torch"})
    assert str(err.value) == "ops_implementation.strict_names must be true or false, got 'yes'"


# -- what translation keeps --------------------------------------------------------------------------
def test_opslot_names_are_never_translated():
    with use_device(CPU):  # npu is opslot's name for rms_norm: kept, and binding says it needs an NPU
        config = OpsImplementationConfig.from_dict(
            {"rms_norm_implementation": "npu", "moe_implementation": "fused_npu"}
        )
        assert (config.rms_norm_implementation, config.moe_implementation, config.aliases) == ("npu", "fused_npu", {})
    KERNEL_REGISTRY.register(KernelSpec("liger_kernel", "rms_norm", "standard", lambda: abs))  # a plug-in's kernel
    try:
        config = OpsImplementationConfig.from_dict({"rms_norm_implementation": "liger_kernel"})
        assert (config.rms_norm_implementation, config.aliases) == ("liger_kernel", {})
    finally:
        KERNEL_REGISTRY.unregister("rms_norm", "standard", "liger_kernel")


def test_translated_ops_may_bind_nowhere_and_the_users_allow_unbound_is_kept():
    config = OpsImplementationConfig.from_dict(
        {
            "allow_unbound": "swiglu_mlp",
            "moe_implementation": "fused_torch",
            "chunk_gated_delta_rule_implementation": "fla",
        }
    )
    assert config.allow_unbound == ("chunk_gated_delta_rule", "swiglu_mlp")  # not moe: written in opslot's name


def test_a_translated_config_equals_the_same_choice_in_opslot_names_and_pickles_its_record():
    with use_device(H200):
        config = OpsImplementationConfig.from_dict({"swiglu_mlp_implementation": "liger_kernel"})
    assert config == OpsImplementationConfig(swiglu_mlp_implementation="cuda", allow_unbound=("swiglu_mlp",))
    assert pickle.loads(pickle.dumps(config)).aliases == {"swiglu_mlp_implementation": ("liger_kernel", "cuda")}


# -- did-you-mean never suggests a value that does not exist ----------------------------------------------
def test_a_bare_fused_gets_no_made_up_suggestion():
    with pytest.raises(ValueError) as err:
        OpsImplementationConfig(moe_implementation="fused")  # the constructor takes opslot's names only
    assert str(err.value) == (
        "ops_implementation.moe_implementation must be 'eager' or 'fused_<impl>', got 'fused' "
        "(values: eager, fused_cuda, fused_npu, fused_torch)"
    )  # was: did you mean 'fused_npu'?


@pytest.mark.parametrize("value", ["fused_fused", "fused_", "fused_quack"])
def test_an_unknown_moe_kernel_is_compared_by_its_name_not_its_prefix(value):
    with pytest.raises(ValueError) as err:
        OpsImplementationConfig(moe_implementation=value).validate([("moe", "standard")])
    assert str(err.value) == (
        f"invalid ops_implementation:\n  moe/standard (moe_implementation={value!r}): no kernel "
        f"{value[len('fused_') :]!r} for moe/standard; available: eager, fused_cuda [needs cuda sm_80+], "
        f"fused_npu [needs npu], fused_torch"
    )  # was: did you mean 'fused_cuda'/'fused_npu'?


@pytest.mark.parametrize(
    "word, suggested",
    [
        ("fused", None),
        ("FUSED", None),
        ("fused_", None),
        ("fused_fused", None),
        ("torhc", "fused_torch"),
        ("Fused_Torch", "fused_torch"),
        ("fused_tor", "fused_torch"),
        ("npu", "fused_npu"),
        ("cude", "fused_cuda"),
        ("fused_cudaa", "fused_cuda"),
    ],
)
def test_suggestions_are_existing_values(word, suggested):
    values = moe_config_values()
    expected = f"; did you mean {suggested!r}?" if suggested else ""
    assert (_suggest_value(word, values), suggested in values + [None]) == (expected, True)


# -- a reference-style Qwen3-MoE section on a CPU, a CUDA GPU and an NPU --------------------------------
REFERENCE_TRAINING_CONFIG = """\
model:
  model_path: Qwen3-30B-A3B-merge
  ops_implementation:                # every field of the reference's OpsImplementationConfig
    attn_implementation: flash_attention_2
    moe_implementation: fused_triton
    cross_entropy_loss_implementation: liger_kernel
    rms_norm_implementation: liger_kernel
    swiglu_mlp_implementation: liger_kernel
    rotary_pos_emb_implementation: liger_kernel
    rotary_pos_emb_vision_implementation: eager
    load_balancing_loss_implementation: triton
    rms_norm_gated_implementation: fla
    causal_conv1d_implementation: fla
    chunk_gated_delta_rule_implementation: fla
    dsa_indexer_implementation: eager
    dsa_attention_implementation: eager
    mhc_implementation: eager
data:
  train_path: tulu-3-sft-mixture
  max_seq_len: 2048
train:
  global_batch_size: 8
  micro_batch_size: 1
  optimizer:
    type: adamw
    lr: 1.0e-4
"""

QWEN3_MOE_SLOTS = {
    "cpu": (
        "gpu",
        {
            "causal_lm_loss_slot": "torch_chunked",
            "load_balancing_loss_slot": "torch",
            "moe_slot": "torch",
            "rms_norm_slot": "torch",
            "rope_slot": "torch",
            "sequence_classification_loss_slot": "torch_chunked",
            "swiglu_mlp_slot": "torch",
        },
    ),
    "cuda": (
        "gpu",
        dict.fromkeys(
            (
                "causal_lm_loss_slot",
                "load_balancing_loss_slot",
                "moe_slot",
                "rms_norm_slot",
                "rope_slot",
                "sequence_classification_loss_slot",
                "swiglu_mlp_slot",
            ),
            "cuda",
        ),
    ),
    "npu": (
        "npu",
        {
            "causal_lm_loss_slot": "torch_chunked",
            "load_balancing_loss_slot": "torch",
            "moe_slot": "npu",
            "rms_norm_slot": "npu",
            "rope_slot": "npu",
            "sequence_classification_loss_slot": "torch_chunked",
            "swiglu_mlp_slot": "npu",
        },
    ),
}
#: The sequence-classification head's loss slot: a *ForCausalLM never uses it.
NOT_USED = {"sequence_classification_loss_slot": "not used by this model"}
DEVICE_OF = {"cpu": CPU, "cuda": H200, "npu": NPU}


def qwen3_moe_dir(tmp_dir):
    """The folder of the generated Qwen3-MoE modules: generated/qwen3_moe/ (`make run` writes it); where that has
    not run (the GPU machine), patchgen (PATCHGEN_BIN) generates them from the installed transformers into
    tmp_dir, as tests/models/run_e2e.sh does; neither: the tests fail, saying so."""
    here = REPO / "generated" / "qwen3_moe"
    if (here / "patched_modeling_qwen3_moe_gpu.py").is_file():
        return here
    patchgen = os.environ.get("PATCHGEN_BIN")
    if not patchgen:
        pytest.fail("generated/qwen3_moe/ is missing: run `make run`, or set PATCHGEN_BIN to generate it")
    import transformers

    site = Path(transformers.__file__).resolve().parents[1]
    specs = [f"specs/qwen3_moe/qwen3_moe_{kind}.yaml" for kind in ("gpu", "npu")]
    cmd = [patchgen, *specs, "--source-root", str(site), "-o", str(tmp_dir)]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, f"{' '.join(cmd)}: {proc.stderr}"
    return tmp_dir


@pytest.fixture(scope="module")
def qwen3_moe(tmp_path_factory):
    """{"gpu"|"npu": the generated Qwen3-MoE module (qwen3_moe_dir)}, imported under names of their own."""
    transformers = pytest.importorskip("transformers")
    folder = qwen3_moe_dir(tmp_path_factory.mktemp("qwen3_moe"))
    modules = {}
    for kind in ("gpu", "npu"):
        path = folder / f"patched_modeling_qwen3_moe_{kind}.py"
        name = f"compat_test_qwen3_moe_{kind}"
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        modules[kind] = module
    yield transformers, modules
    for kind in modules:
        sys.modules.pop(f"compat_test_qwen3_moe_{kind}", None)


@pytest.fixture
def reference_yaml(tmp_path):
    path = tmp_path / "qwen3_moe_sft.yaml"
    path.write_text(REFERENCE_TRAINING_CONFIG, encoding="utf-8")
    return path


@pytest.mark.parametrize("device", ["cpu", "cuda", "npu"])
def test_a_reference_qwen3_moe_section_loads_and_validates_on_every_device(device, qwen3_moe, reference_yaml):
    _, modules = qwen3_moe
    kind, slots = QWEN3_MOE_SLOTS[device]
    module = modules[kind]
    with use_device(DEVICE_OF[device]):
        config = OpsImplementationConfig.from_yaml(reference_yaml)
        chosen = config.validate({(d.op, d.variant) for d in declared_slots(module)})
    by_op = {(s.op, s.variant): name for name, s in vars(module).items() if type(s).__name__ == "OpSlot"}
    assert {by_op[key]: impl for key, impl in chosen.items()} == slots


def _qwen3_moe_config(transformers):
    return transformers.Qwen3MoeConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        max_position_embeddings=64,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=16,
        decoder_sparse_step=1,
        mlp_only_layers=[0],
        output_router_logits=True,
    )


def _build(qwen3_moe, kind):
    """The model built from the reference training config; attention sdpa: flash-attn is not installed here."""
    transformers, modules = qwen3_moe
    ops = yaml.safe_load(REFERENCE_TRAINING_CONFIG)
    ops["model"]["ops_implementation"]["attn_implementation"] = "sdpa"
    torch.manual_seed(0)
    model = build_model(
        _qwen3_moe_config(transformers), ops=ops, module=modules[kind], model_class="Qwen3MoeForCausalLM"
    )
    return watch_dispatch(model)


def _step(model):
    ids = torch.arange(16).remainder(64).reshape(2, 8)
    out = model(input_ids=ids, labels=ids)
    out.loss.backward()
    return out


def test_a_reference_qwen3_moe_section_builds_and_steps_on_a_cpu(qwen3_moe):
    model = _build(qwen3_moe, "gpu")
    _step(model)
    assert {e.slot: (e.impl, e.why, e.dispatch) for e in binding_plan(model)} == {
        slot: (impl, "explicit", NOT_USED.get(slot, "ran")) for slot, impl in QWEN3_MOE_SLOTS["cpu"][1].items()
    }


def test_a_reference_qwen3_moe_section_builds_and_steps_on_a_simulated_npu(qwen3_moe, monkeypatch):
    fake = make_fake_torch_npu()
    monkeypatch.setitem(sys.modules, "torch_npu", fake)  # after Transformers is imported: it probes torch_npu
    with use_device(NPU):
        model = _build(qwen3_moe, "npu")
        _step(model)
    assert ({e.slot: (e.impl, e.dispatch) for e in binding_plan(model)}, sorted({call[0] for call in fake.calls})) == (
        {slot: (impl, NOT_USED.get(slot, "ran")) for slot, impl in QWEN3_MOE_SLOTS["npu"][1].items()},
        ["npu_grouped_matmul", "npu_rms_norm", "npu_rotary_mul", "npu_swiglu"],
    )


def test_a_reference_qwen3_moe_section_binds_the_cuda_kernels_on_a_simulated_h200(qwen3_moe):
    with use_device(H200):  # no GPU here: bound and constructed, not stepped
        model = _build(qwen3_moe, "gpu")
    assert binding_plan(model).as_dict() == QWEN3_MOE_SLOTS["cuda"][1]


def test_binding_plan_shows_the_reference_names(qwen3_moe):
    with use_device(CPU):
        model = _build(qwen3_moe, "gpu")
    assert repr(binding_plan(model)).splitlines()[-1] == (
        "  reference trainer's names: causal_conv1d_implementation 'fla' -> 'torch', "
        "chunk_gated_delta_rule_implementation 'fla' -> 'torch', cross_entropy_loss_implementation 'liger_kernel' "
        "-> 'torch_chunked', load_balancing_loss_implementation 'triton' -> 'torch', moe_implementation "
        "'fused_triton' -> 'fused_torch', rms_norm_gated_implementation 'fla' -> 'torch', rms_norm_implementation "
        "'liger_kernel' -> 'torch', rotary_pos_emb_implementation 'liger_kernel' -> 'torch', "
        "swiglu_mlp_implementation 'liger_kernel' -> 'torch'"
    )


def test_build_model_records_the_reference_names(qwen3_moe):
    model = _build(qwen3_moe, "gpu")
    assert model.config.ops_implementation_aliases["moe_implementation"] == ["fused_triton", "fused_torch"]
