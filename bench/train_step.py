#!/usr/bin/env python3
"""One training step (forward + backward) of a real generated model, as a user's eager training loop
sees it: several configurations side by side in one process, per model.

    OPSLOT_KERNELS_LIB=.../libopslot_kernels.so python3 bench/train_step.py --patchgen .device-bin/patchgen \
        --models qwen3_5,qwen3 --out $OUT
    .venv/bin/python bench/train_step.py --device cpu --tiny --models qwen3_5,qwen3 --out /tmp/ts   # CPU check

Models (`--models`, default qwen3_5; `--tiny`: 2 layers, hidden 64, vocab 256, batch 1 x 128; deepseek_v4 and
glm_moe_dsa: tests/models/e2e.py's configs of their cases, 3 layers, at that hidden size and vocab):
- qwen3_5: Qwen3_5ForCausalLM from `patched_modeling_qwen3_5_gpu` (specs/qwen3_5/qwen3_5_gpu.yaml):
  4 layers, 3 linear_attention (Gated DeltaNet) + 1 full_attention, hidden 2048, linear heads 16 key /
  32 value of dim 128, full attention 16 heads / 4 KV heads of dim 256, partial RoPE 0.25 with mrope
  [11, 11, 10] (Qwen3_5TextConfig's defaults; mrope interleaved, as the Qwen3.5 checkpoints),
  intermediate 6144 (3 x hidden, the defaults' ratio), untied lm_head, vocab 151936; every value is
  written into the output.
- qwen3: Qwen3ForCausalLM from `patched_modeling_qwen3_gpu`, 4 dense layers, hidden 2048 (Qwen3-1.7B-like
  widths), vocab 151936: the same step shape, for scale.
- qwen3_moe: Qwen3MoeForCausalLM from `patched_modeling_qwen3_moe_gpu`, 2 layers of Qwen3-30B-A3B's
  widths (128 experts, top 8, expert width 768), vocab 151936 (bench/moe.py's training step).
- deepseek_v4: DeepseekV4ForCausalLM from `patched_modeling_deepseek_v4_gpu` (specs/deepseek_v4/deepseek_v4_gpu.yaml),
  3 layers at the released per-layer widths (DeepseekV4Config's defaults), one of each attention type: sliding
  window 128, compressed sparse attention (compress rate 4, Lightning indexer of 64 heads of dim 128 keeping the
  top 512 compressed entries: at 4096 tokens, 1024 entries, so it really selects), heavily compressed attention
  (rate 128); hidden 4096, 64 query heads of dim 512 on one shared K=V head, q_lora_rank 1024, grouped output
  projection 8 x 1024, hyper-connections hc_mult 4 with 20 Sinkhorn iterations; MoE layers hash-routed, then
  top-k routed ("hash_moe", "moe", "moe"): expert width 2048, top 6, 1 shared expert, SwiGLU clamped at 10;
  vocab 129280, RoPE as the config's defaults. Reduced: 16 routed experts instead of 256, so that upstream
  eager, with its weights and gradients, fits one GPU and a step stays short (each expert then gets ~16x the
  tokens it would get among 256: larger expert GEMMs than the real model's). Attention `eager` in every row
  (upstream supports no other: `_supports_sdpa = False`, sdpa would drop the attention sinks). Upstream's init
  zeroes the hash routers' token -> experts tables (`tid2eid`, a buffer the checkpoint fills: every token would
  go top_k times to expert 0); they are filled with top_k distinct random experts per token id (as
  tests/models/e2e.py's randomize_) before the reference state_dict is taken, so every row routes alike.
- glm_moe_dsa: GlmMoeDsaForCausalLM from `patched_modeling_glm_moe_dsa_gpu` (specs/glm_moe_dsa/glm_moe_dsa_gpu.yaml),
  3 layers at GLM-5's per-layer widths (GlmMoeDsaConfig's defaults): hidden 6144, MLA with 64 heads
  (q_lora_rank 2048, kv_lora_rank 512, qk nope/rope 192/64, v 256), the DSA indexer on every layer
  (indexer_types "full": 32 heads of dim 128, top 2048 tokens: at 4096 tokens, the later queries really
  select), 1 dense layer (intermediate 12288), then 2 MoE layers (expert width 2048, top 8, 1 shared expert,
  routed scaling 2.5), rms_norm_eps 1e-5, vocab 154880. Reduced: 16 routed experts instead of 256 (as
  deepseek_v4).
  In both, the indexers' weights get no gradient (upstream trains them with no loss: a top-k selection, and
  GLM's indexer runs under no_grad), in every row alike.
bf16 weights (random, seeded: Transformers' own init of the upstream class, the same state_dict loaded
into every configuration of a model; everything bf16, the modules Transformers would keep in fp32 on
loading included: DeepSeek-V4's upstream 5.17 fails with fp32 norms between bf16 linears), attention `sdpa`
(deepseek_v4: `eager`), batch 2 x 4096 tokens without padding (no attention_mask), labels = input_ids (the
causal-LM loss), use_cache=False, train mode.

Configurations (rows) per model:
- upstream eager: Transformers' own class; its linear-attention functions are what its hub wrapper
  resolved at import (torch fallbacks, or `fla` / `causal_conv1d` when those packages import: the
  header says which);
- opslot defaults: the generated model from `opslot.build_model` with only attn_implementation given,
  i.e. on a CUDA machine every slot on its `cuda` kernel where one exists (opslot.CUDA_DEFAULTS); the
  row lists each slot's impl from `opslot.binding_plan(model)`, the full plans follow the table;
- opslot defaults, delta rule on torch (qwen3_5): chunk_gated_delta_rule and causal_conv1d on opslot's
  `torch` kernels;
- opslot + fla (qwen3_5, when `import fla` works, or --fla yes): opslot defaults with
  chunk_gated_delta_rule on `eager`, so the upstream call runs and its wrapper calls fla's
  chunk_gated_delta_rule; the conv stays on opslot's default. --fla-unsafe switches off fla's refusal
  of its gated backward on Hopper with Triton < 3.7.1 (timing only, as bench/gated_delta_rule.py).

deepseek_v4 and glm_moe_dsa: also "opslot defaults, dsa_attention cuda" (the DSA attention kernels set
explicitly: both models' default on sm_90+, runtime/opslot/device_defaults.py, so there the row equals "opslot
defaults"; below sm_90 the default is eager), and with --compile its compiled row; on CUDA devices only.

With --compile, three more rows per model under `torch.compile(model)` (inductor, default mode; at
least 3 warm-up steps, which compile): upstream, opslot defaults, and opslot defaults with
attn_implementation `opslot_sdpa` (the causal mask skipped under compile: runtime/opslot/compiled_sdpa.py); not
for deepseek_v4 (its attention is the dsa_attention slot, upstream eager only) nor glm_moe_dsa (refused by its
check_dsa_attention_implementation: the indexer reads eager's or sdpa's 4-D mask).

Measures: time = median of --iters (default 8) steps after --warmup (default 2) steps; one step is
`model.zero_grad(set_to_none=True)` (outside the timing) then `loss = model(**batch).loss;
loss.backward()` (the model output, with its logits, is dropped before backward, as Trainer's
compute_loss does), timed with CUDA events around the Python step (time.perf_counter on the CPU).
Peak GiB: torch.cuda.max_memory_allocated() over the timed steps, after reset_peak_memory_stats();
weights, gradients and activations included ("weights GiB" is memory_allocated() before a step). A
configuration that fails prints its error in its row and the next one runs. The table is printed
row by row and rewritten after every row to --out (a folder: train_step.md + train_step.json; or a
path ending in .md). USE_HUB_KERNELS defaults to 0 (Hub `kernels` would replace whole layer forwards);
the fla/causal_conv1d package fallbacks do not depend on it.

--row NAME (repeatable) runs only the configurations of those names, as the table spells them. --profile N
(CUDA only) runs one more step of each configuration under torch.profiler after its timed steps and
writes, after the binding plans, the N kernels with the most device time in that step (their calls,
total ms and share of the step's kernel time; the step's wall time on the device is longer by the
gaps between kernels). --profile-glue N (CUDA only) profiles one more step with the CPU ops and lists
the N costliest groups of layout glue (copy_, add, add_, fill_, cat) by op, input shapes and the chain
of ops that called it: where upstream's code or a slot's glue copies tensors.
"""

from __future__ import annotations

import os

os.environ.setdefault("USE_HUB_KERNELS", "0")  # read by transformers at import: before it is imported

import argparse  # noqa: E402
import copy  # noqa: E402
import ctypes  # noqa: E402
import dataclasses  # noqa: E402
import gc  # noqa: E402
import importlib  # noqa: E402
import importlib.util  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any, Callable, Dict, List, Optional, Tuple  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
# Not bench/ itself (sys.path[0] for a script): bench/kernels.py would shadow the `kernels` package, which
# transformers imports when it probes for Hub kernels.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(ROOT / "runtime"))

import torch  # noqa: E402

GiB = float(1 << 30)
T0 = time.time()


class Energy:
    """The GPU's energy counter (NVML's nvmlDeviceGetTotalEnergyConsumption, millijoules since the
    driver loaded), read through ctypes from the driver's libnvidia-ml; `read()` is None where there
    is none (CPU runs, no driver library). Under a power cap the step's energy, not its idle gaps,
    sets its time: the rows give joules per step and the mean power of the timed steps."""

    def __init__(self) -> None:
        self.nvml, self.handle = None, None
        try:
            nvml = ctypes.CDLL("libnvidia-ml.so.1")
        except OSError:
            return
        handle = ctypes.c_void_p()
        index = torch.cuda.current_device() if torch.cuda.is_available() else 0
        if nvml.nvmlInit_v2() == 0 and nvml.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(handle)) == 0:
            self.nvml, self.handle = nvml, handle

    def read(self) -> Optional[float]:
        """Joules since the driver loaded, or None."""
        mj = ctypes.c_ulonglong()
        if self.handle is None or self.nvml.nvmlDeviceGetTotalEnergyConsumption(self.handle, ctypes.byref(mj)) != 0:
            return None
        return mj.value / 1e3


ENERGY = Energy()


# -- models ------------------------------------------------------------------------------------------
@dataclasses.dataclass
class ModelDef:
    key: str  # specs/<key>/<key>_gpu.yaml, transformers.models.<key>
    config_class: str
    causal_lm: str
    full: Dict[str, Any]
    tiny: Dict[str, Any]
    linear_attention: bool = False
    #: attn_implementation of every row: sdpa, or eager where upstream supports only eager (DeepSeek-V4)
    attn: str = "sdpa"
    #: the "opslot_sdpa + torch.compile" row (--compile); False where the model's attention does not go
    #: through attn_implementation's function (DeepSeek-V4: its dsa_attention slot; GLM-MoE-DSA: refused
    #: by its check_dsa_attention_implementation, the indexer needs eager's or sdpa's 4-D mask)
    opslot_sdpa: bool = True
    #: the "opslot defaults, dsa_attention cuda" rows: the DSA attention kernels set explicitly (the
    #: default on sm_90+, eager below: runtime/opslot/device_defaults.py)
    dsa_attention: bool = False
    #: fills what upstream's init leaves degenerate, on the reference model before its state_dict is taken
    #: (so every row gets it): fn(model, seed)
    prepare: Optional[Callable[[Any, int], None]] = None

    @property
    def spec(self) -> Path:
        return ROOT / "specs" / self.key / f"{self.key}_gpu.yaml"

    @property
    def module_name(self) -> str:
        return f"patched_modeling_{self.key}_gpu"

    @property
    def upstream_module(self) -> str:
        return f"transformers.models.{self.key}.modeling_{self.key}"


COMMON = dict(
    rms_norm_eps=1e-6,
    tie_word_embeddings=False,
    attention_dropout=0.0,
    use_cache=False,
    hidden_act="silu",
    max_position_embeddings=32768,
)
TINY_COMMON = dict(
    COMMON,
    vocab_size=256,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=256,
)


# The tiny configs below and this filler repeat tests/models/e2e.py's on purpose: importing e2e.py
# would set CUBLAS_WORKSPACE_CONFIG (deterministic cuBLAS) for this whole timing process.
def hash_routing_tables_(model, seed: int) -> None:
    """DeepSeek-V4's hash routers (`mlp_layer_types` "hash_moe"): upstream's init zeroes the token ->
    experts table `tid2eid` (a buffer the checkpoint fills), so every token would pick expert 0 top_k
    times; fill it as tests/models/e2e.py's randomize_ does: top_k distinct random experts per token id."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, table in sorted(model.named_buffers()):
            if name.endswith("tid2eid"):
                experts = model.config.n_routed_experts
                picks = torch.rand(table.shape[0], experts, generator=gen).argsort(dim=-1)[:, : table.shape[1]]
                table.copy_(picks.to(table.device, table.dtype))


#: DeepSeek-V4's three attention types, one layer each, and its two MoE types (hash-routed first).
DSV4_LAYERS = dict(
    num_hidden_layers=3,
    layer_types=["sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention"],
    mlp_layer_types=["hash_moe", "moe", "moe"],
)

MODELS = {
    "qwen3_5": ModelDef(
        "qwen3_5",
        "Qwen3_5TextConfig",
        "Qwen3_5ForCausalLM",
        linear_attention=True,
        full=dict(
            COMMON,
            vocab_size=151936,
            hidden_size=2048,
            intermediate_size=6144,
            num_hidden_layers=4,
            layer_types=["linear_attention"] * 3 + ["full_attention"],
            num_attention_heads=16,
            num_key_value_heads=4,
            head_dim=256,
            linear_conv_kernel_dim=4,
            linear_num_key_heads=16,
            linear_num_value_heads=32,
            linear_key_head_dim=128,
            linear_value_head_dim=128,
            rope_parameters={
                "rope_type": "default",
                "rope_theta": 10000.0,
                "partial_rotary_factor": 0.25,
                "mrope_section": [11, 11, 10],
                "mrope_interleaved": True,
            },
        ),
        tiny=dict(
            TINY_COMMON,
            layer_types=["linear_attention", "full_attention"],
            linear_conv_kernel_dim=4,
            linear_num_key_heads=2,
            linear_num_value_heads=4,
            linear_key_head_dim=16,
            linear_value_head_dim=16,
            rope_parameters={
                "rope_type": "default",
                "rope_theta": 10000.0,
                "partial_rotary_factor": 0.5,
                "mrope_section": [2, 1, 1],
                "mrope_interleaved": True,
            },
        ),
    ),
    "qwen3": ModelDef(
        "qwen3",
        "Qwen3Config",
        "Qwen3ForCausalLM",
        full=dict(
            COMMON,
            vocab_size=151936,
            hidden_size=2048,
            intermediate_size=6144,
            num_hidden_layers=4,
            num_attention_heads=16,
            num_key_value_heads=8,
            head_dim=128,
            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
        ),
        tiny=dict(TINY_COMMON),
    ),
    # Qwen3-30B-A3B's widths, 2 layers (bench/moe.py's training step).
    "qwen3_moe": ModelDef(
        "qwen3_moe",
        "Qwen3MoeConfig",
        "Qwen3MoeForCausalLM",
        full=dict(
            COMMON,
            vocab_size=151936,
            hidden_size=2048,
            intermediate_size=6144,
            moe_intermediate_size=768,
            num_experts=128,
            num_experts_per_tok=8,
            norm_topk_prob=True,
            num_hidden_layers=2,
            num_attention_heads=32,
            num_key_value_heads=4,
            head_dim=128,
            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
        ),
        tiny=dict(TINY_COMMON, moe_intermediate_size=32, num_experts=8, num_experts_per_tok=2),
    ),
    # DeepSeek-V4's per-layer widths (DeepseekV4Config's defaults), 3 layers, 16 of its 256 routed experts.
    "deepseek_v4": ModelDef(
        "deepseek_v4",
        "DeepseekV4Config",
        "DeepseekV4ForCausalLM",
        attn="eager",  # _supports_sdpa = False: sdpa would drop the attention sinks
        opslot_sdpa=False,
        dsa_attention=True,
        prepare=hash_routing_tables_,
        full=dict(
            COMMON,
            **DSV4_LAYERS,
            vocab_size=129280,
            hidden_size=4096,
            moe_intermediate_size=2048,
            num_attention_heads=64,
            num_key_value_heads=1,
            head_dim=512,
            q_lora_rank=1024,
            o_groups=8,
            o_lora_rank=1024,
            compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 128},
            index_n_heads=64,
            index_head_dim=128,
            index_topk=512,
            sliding_window=128,
            hc_mult=4,
            hc_sinkhorn_iters=20,
            swiglu_limit=10.0,
            n_routed_experts=16,
            num_experts_per_tok=6,
            n_shared_experts=1,
            # rope_parameters: the config's default (main theta 1e4, compress theta 1.6e5, partial 0.125)
        ),
        # tests/models/e2e.py's deepseek_v4 case (without its output_router_logits: the step is the full
        # config's) at the bench's tiny widths; V4 has no intermediate_size (it maps it to the experts').
        tiny=dict(
            {k: v for k, v in TINY_COMMON.items() if k != "intermediate_size"},
            **DSV4_LAYERS,
            num_key_value_heads=1,
            moe_intermediate_size=32,
            q_lora_rank=32,
            n_routed_experts=8,
            num_experts_per_tok=2,
            compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 8},
            index_n_heads=2,
            index_head_dim=16,
            index_topk=2,
            hc_mult=2,
            hc_sinkhorn_iters=3,
            sliding_window=8,
            o_groups=2,
            o_lora_rank=16,
            partial_rotary_factor=0.5,
            swiglu_limit=0.5,
        ),
    ),
    # GLM-5's per-layer widths (GlmMoeDsaConfig's defaults), 3 layers (1 dense + 2 MoE), 16 of its 256
    # routed experts.
    "glm_moe_dsa": ModelDef(
        "glm_moe_dsa",
        "GlmMoeDsaConfig",
        "GlmMoeDsaForCausalLM",
        opslot_sdpa=False,
        dsa_attention=True,
        full=dict(
            COMMON,
            rms_norm_eps=1e-5,
            vocab_size=154880,
            hidden_size=6144,
            intermediate_size=12288,
            moe_intermediate_size=2048,
            num_hidden_layers=3,
            first_k_dense_replace=1,
            mlp_layer_types=["dense", "sparse", "sparse"],
            num_attention_heads=64,
            kv_lora_rank=512,
            q_lora_rank=2048,
            qk_nope_head_dim=192,
            qk_rope_head_dim=64,
            v_head_dim=256,
            index_n_heads=32,
            index_head_dim=128,
            index_topk=2048,
            indexer_types=["full"] * 3,
            n_routed_experts=16,
            num_experts_per_tok=8,
            n_shared_experts=1,
            n_group=1,
            topk_group=1,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        ),
        # tests/models/e2e.py's glm_moe_dsa case at the bench's tiny widths (a "shared" indexer layer).
        tiny=dict(
            TINY_COMMON,
            rms_norm_eps=1e-5,
            num_hidden_layers=3,
            num_key_value_heads=4,
            moe_intermediate_size=32,
            first_k_dense_replace=1,
            n_shared_experts=1,
            n_routed_experts=8,
            num_experts_per_tok=2,
            n_group=2,
            topk_group=1,
            kv_lora_rank=16,
            q_lora_rank=32,
            qk_rope_head_dim=8,
            v_head_dim=16,
            qk_nope_head_dim=16,
            norm_topk_prob=True,
            index_n_heads=8,
            index_head_dim=16,
            index_topk=4,
            indexer_types=["full", "shared", "full"],
        ),
    ),
}

#: Config fields written into the output (those the config has).
RECORDED = [
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "layer_types",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "linear_conv_kernel_dim",
    "linear_num_key_heads",
    "linear_num_value_heads",
    "linear_key_head_dim",
    "linear_value_head_dim",
    "rope_parameters",
    "rms_norm_eps",
    "tie_word_embeddings",
    "hidden_act",
    "attention_bias",
    "attention_dropout",
    "moe_intermediate_size",
    "num_experts",
    "num_experts_per_tok",
    # DeepSeek-V4, GLM-MoE-DSA
    "mlp_layer_types",
    "first_k_dense_replace",
    "n_routed_experts",
    "n_shared_experts",
    "n_group",
    "topk_group",
    "routed_scaling_factor",
    "norm_topk_prob",
    "scoring_func",
    "q_lora_rank",
    "kv_lora_rank",
    "qk_nope_head_dim",
    "qk_rope_head_dim",
    "v_head_dim",
    "o_groups",
    "o_lora_rank",
    "sliding_window",
    "compress_rates",
    "index_n_heads",
    "index_head_dim",
    "index_topk",
    "indexer_types",
    "hc_mult",
    "hc_sinkhorn_iters",
    "hc_eps",
    "swiglu_limit",
    "partial_rotary_factor",
    "max_position_embeddings",
    "output_router_logits",
]


def make_config(mdef: ModelDef, tiny: bool):
    import transformers

    cls = getattr(transformers, mdef.config_class)
    config = cls(**copy.deepcopy(mdef.tiny if tiny else mdef.full))
    config._attn_implementation = mdef.attn
    return config


def recorded_config(config) -> Dict[str, Any]:
    d = config.to_dict()
    return {k: d[k] for k in RECORDED if k in d}


# -- generation (as tests/models/e2e.py) -------------------------------------------------------------
def default_patchgen() -> str:
    if os.environ.get("PATCHGEN"):
        return os.environ["PATCHGEN"]
    for cand in (ROOT / ".device-bin" / "patchgen", ROOT / "build" / "tools" / "patchgen" / "patchgen"):
        if cand.is_file() and os.access(cand, os.X_OK):
            return str(cand)
    return str(ROOT / ".device-bin" / "patchgen")


def site_packages() -> str:
    """The folder that holds the transformers package (as tests/models/run_e2e.sh finds it)."""
    spec = importlib.util.find_spec("transformers")
    if spec is None or spec.origin is None:
        raise RuntimeError("transformers is not importable")
    return os.path.dirname(os.path.dirname(spec.origin))


def generate_and_import(mdef: ModelDef, patchgen: str, source_root: str, gen_dir: Path):
    out_dir = gen_dir / mdef.key
    out_dir.mkdir(parents=True, exist_ok=True)
    cmd = [patchgen, str(mdef.spec.relative_to(ROOT)), "--source-root", source_root, "-o", str(out_dir)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"patchgen exit {proc.returncode}: {' '.join(cmd)}: {proc.stderr.strip()[-400:]}")
    found = sorted(out_dir.rglob(mdef.module_name + ".py"))
    if len(found) != 1:
        raise RuntimeError(f"patchgen wrote {len(found)} files named {mdef.module_name}.py under {out_dir}")
    if str(found[0].parent) not in sys.path:
        sys.path.insert(0, str(found[0].parent))
    spec = importlib.util.spec_from_file_location(mdef.module_name, found[0])
    module = importlib.util.module_from_spec(spec)
    sys.modules[mdef.module_name] = module
    spec.loader.exec_module(module)
    return module


# -- what upstream's linear-attention wrappers resolved to -----------------------------------------
def resolved(fn) -> str:
    """`module.name` of the function that a use_kernel_func_from_hub_with_fallback wrapper calls."""
    code = getattr(fn, "__code__", None)
    if code is not None and fn.__closure__ and "implementation" in code.co_freevars:
        impl = fn.__closure__[code.co_freevars.index("implementation")].cell_contents
        return f"{getattr(impl, '__module__', '?')}.{getattr(impl, '__name__', type(impl).__name__)}"
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__name__', '?')}"


def linear_attention_backends(module) -> Dict[str, str]:
    out = {}
    for name in ("causal_conv1d_fn", "torch_chunk_gated_delta_rule"):
        fn = getattr(module, name, None)
        if fn is not None:
            out[name] = resolved(fn)
    return out


def uses_fla(backends: Dict[str, str]) -> bool:
    return backends.get("torch_chunk_gated_delta_rule", "").startswith("fla")


# -- weights and inputs --------------------------------------------------------------------------
def construct(build, device: torch.device, dtype: torch.dtype):
    with torch.device(device):
        model = build()
    return model.to(dtype).train()


def make_batch(vocab: int, batch: int, seq: int, device: torch.device, seed: int) -> Dict[str, Any]:
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (batch, seq), generator=gen).to(device)
    return dict(input_ids=ids, labels=ids, use_cache=False)


def row_error(exc: BaseException, device: torch.device) -> str:
    """A failed row's table cell: "OOM" for CUDA out-of-memory, else the exception's type and message."""
    if device.type == "cuda" and isinstance(exc, torch.cuda.OutOfMemoryError):
        return "OOM"
    return f"{type(exc).__name__}: {str(exc)[:300]}"


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()


# -- one configuration -----------------------------------------------------------------------------
#: The ops whose kernels are layout glue (copies, adds, fills, concatenations): --profile-glue groups
#: their device time by the chain of ops that called them.
GLUE_OPS = ("aten::copy_", "aten::add", "aten::add_", "aten::fill_", "aten::cat")


def glue_profile(step: Callable[[], Any], top: int) -> List[Dict[str, Any]]:
    """One step under torch.profiler with CPU ops: the device time of the GLUE_OPS grouped by the op,
    the shapes of its first two inputs and its callers (up to five levels; an op called by another
    glue op counts once, as its caller), the `top` groups by device time."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True) as prof:
        step()
        torch.cuda.synchronize()
    groups: Dict[str, List[float]] = {}
    for e in prof.events():
        if e.name not in GLUE_OPS or (e.cpu_parent is not None and e.cpu_parent.name in GLUE_OPS):
            continue
        shapes = [list(x) for x in (e.input_shapes or [])[:2] if x]
        chain, p = [f"{e.name} {shapes}" if shapes else e.name], e.cpu_parent
        while p is not None and len(chain) < 6:
            chain.append(p.name)
            p = p.cpu_parent
        g = groups.setdefault(" <- ".join(chain), [0, 0.0])
        g[0] += 1
        g[1] += e.device_time_total / 1e3
    ranked = sorted(groups.items(), key=lambda kv: -kv[1][1])[:top]
    return [dict(chain=k, calls=int(n), ms=ms) for k, (n, ms) in ranked]


def kernel_events(prof) -> List[Any]:
    """A profile's kernels (not the operators that launched them, whose events carry their kernels' device
    time too), costliest first."""
    events = [e for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA]
    return sorted((e for e in events if e.self_device_time_total > 0), key=lambda e: -e.self_device_time_total)


def step_profile(step: Callable[[], Any], top: int) -> Dict[str, Any]:
    """One step under torch.profiler: the `top` kernels by device time, and the step's kernel total."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    events = kernel_events(prof)
    total_us = sum(e.self_device_time_total for e in events)
    kernels = [dict(name=e.key, calls=e.count, ms=e.self_device_time_total / 1e3) for e in events[:top]]
    return dict(total_ms=total_us / 1e3, kernels=kernels, count=len(events))


def measure(
    model, batch, device: torch.device, warmup: int, iters: int, budget_s: float, top: int = 0, glue: int = 0
) -> Dict[str, Any]:
    def step():
        loss = model(**batch).loss
        loss.backward()
        return loss.detach()

    losses = []
    for _ in range(max(warmup, 1)):
        model.zero_grad(set_to_none=True)
        t = time.perf_counter()
        losses.append(float(step()))  # float() waits for the step
        warm_s = time.perf_counter() - t
    if warm_s * iters > budget_s:  # a slow configuration must not eat the whole run
        iters = max(3, min(iters, int(budget_s / warm_s)))
    model.zero_grad(set_to_none=True)
    sync(device)
    weights = None
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        weights = torch.cuda.memory_allocated(device) / GiB
    times = []
    window, joules = time.time(), ENERGY.read()
    for _ in range(iters):
        model.zero_grad(set_to_none=True)
        if device.type == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            loss = step()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b))
        else:
            t = time.perf_counter()
            loss = step()
            times.append((time.perf_counter() - t) * 1e3)
    last = float(loss)
    wall, after = time.time() - window, ENERGY.read()
    joules = None if joules is None or after is None else after - joules
    print(f"   timed steps: epoch {window:.3f} .. {window + wall:.3f}", flush=True)  # to match GPU clock samples
    peak = torch.cuda.max_memory_allocated(device) / GiB if device.type == "cuda" else None
    model.zero_grad(set_to_none=True)
    profile = step_profile(step, top) if top or glue else None
    model.zero_grad(set_to_none=True)
    if glue:  # a step of its own: gradients start unset, as in the timed steps
        profile["glue"] = glue_profile(step, glue)
        model.zero_grad(set_to_none=True)
    return dict(
        profile=profile,
        ms=statistics.median(times),
        ms_min=min(times),
        ms_max=max(times),
        steps=len(times),
        peak_gib=peak,
        weights_gib=weights,
        loss=losses[0],
        loss_last=last,
        j_step=None if joules is None else joules / len(times),
        watts=None if joules is None else joules / wall,
    )


def plan_summary(model) -> Tuple[str, str]:
    """(short `op/variant=impl` list, the full plan text) of a generated model."""
    from opslot import binding_plan

    plan = binding_plan(model)
    short = []
    for e in plan:
        why = "" if e.why in ("default", "explicit") else f" ({e.why})"
        short.append(f"{e.op}/{e.variant}={e.impl}{why}")
    if plan.attention is not None:
        short.append(f"attention={plan.attention}")
    return ", ".join(short), repr(plan)


@dataclasses.dataclass
class Config:
    name: str
    ops: Optional[Dict[str, str]]  # None: the upstream class
    note: str = ""
    compile: bool = False  # torch.compile(model) (default inductor), timed after its warm-up steps


def configurations(mdef: ModelDef, fla_rows: bool, compiled: bool = False, cuda: bool = True) -> List[Config]:
    attn = {"attn_implementation": mdef.attn}
    rows = [Config("upstream eager", None), Config("opslot defaults", dict(attn))]
    dsa = dict(attn, dsa_attention_implementation="cuda")
    dsa_rows = mdef.dsa_attention and cuda  # the kernels run on CUDA devices only
    if dsa_rows:
        rows.append(Config("opslot defaults, dsa_attention cuda", dsa))
    if compiled:
        rows += [
            Config("upstream + torch.compile", None, compile=True),
            Config("opslot defaults + torch.compile", dict(attn), compile=True),
        ]
        if dsa_rows:
            rows.append(Config("opslot defaults, dsa_attention cuda + torch.compile", dsa, compile=True))
        if mdef.opslot_sdpa:
            rows.append(
                Config(
                    "opslot defaults, opslot_sdpa + torch.compile",
                    {"attn_implementation": "opslot_sdpa"},
                    compile=True,
                )
            )
    if mdef.linear_attention:
        rows.append(
            Config(
                "opslot defaults, delta rule on torch",
                dict(attn, chunk_gated_delta_rule_implementation="torch", causal_conv1d_implementation="torch"),
            )
        )
        if fla_rows:
            rows.append(
                Config(
                    "opslot + fla",
                    dict(attn, chunk_gated_delta_rule_implementation="eager"),
                    note="delta rule: upstream call -> its wrapper's resolution",
                )
            )
    return rows


def fmt(x, spec: str) -> str:
    return "n/a" if x is None else format(x, spec)


class Report:
    def __init__(self, out: str, header: List[str]):
        p = Path(out)
        if p.suffix == ".md":
            self.md, self.js = p, p.with_suffix(".json")
        else:
            self.md, self.js = p / "train_step.md", p / "train_step.json"
        self.md.parent.mkdir(parents=True, exist_ok=True)
        self.header = header
        self.models: List[Dict[str, Any]] = []

    COLS = [
        "model",
        "configuration",
        "step ms (median)",
        "min-max ms (steps)",
        "tokens/s",
        "peak GiB",
        "J/step (mean W)",
        "weights GiB",
        "loss",
        "kernels (slot impls; upstream: resolved functions)",
    ]

    @staticmethod
    def row_line(r: Dict[str, Any]) -> str:
        if r.get("error"):
            cells = [r["model"], r["name"], "FAILED", "", "", "", "", "", "", r["error"]]
        else:
            tps = r["tokens"] / (r["ms"] * 1e-3)
            cells = [
                r["model"],
                r["name"],
                f"{r['ms']:.1f}",
                f"{r['ms_min']:.1f}-{r['ms_max']:.1f} ({r['steps']})",
                f"{tps:,.0f}",
                fmt(r["peak_gib"], ".2f"),
                "-" if r.get("j_step") is None else f"{r['j_step']:.1f} ({r['watts']:.0f} W)",
                fmt(r["weights_gib"], ".2f"),
                f"{r['loss']:.4f}" + ("" if math.isfinite(r["loss"]) else " (NOT FINITE)"),
                r["kernels"],
            ]
        return "| " + " | ".join(str(c).replace("|", "\\|").replace("\n", " ") for c in cells) + " |"

    @staticmethod
    def profile_lines(model: str, r: Dict[str, Any]) -> List[str]:
        prof = r["profile"]
        total = prof["total_ms"]
        lines = [
            "",
            f"### {model}, {r['name']}: kernels of one step (torch.profiler)",
            "",
            f"{prof['count']} kernel names, {total:.1f} ms of kernel time (the step: {r['ms']:.1f} ms, median)"
            + (f"; the {len(prof['kernels'])} with the most time:" if prof["kernels"] else "."),
        ]
        if prof["kernels"]:
            lines += ["", "| kernel | calls | ms | % of kernel time |", "|---|---:|---:|---:|"]
        for k in prof["kernels"]:
            name = k["name"][:110].replace("|", "\\|")
            lines.append(f"| {name} | {k['calls']} | {k['ms']:.2f} | {100 * k['ms'] / total:.1f} |")
        if prof.get("glue"):
            lines += [
                "",
                f"Layout glue of one more step (`--profile-glue`): the device time of {', '.join(GLUE_OPS)} by op, "
                "the shapes of its first two inputs and the ops that called it (innermost first; `CppNode<...>` is "
                "an opslot op's backward):",
                "",
                "| op [input shapes] <- callers | calls | ms | % of kernel time |",
                "|---|---:|---:|---:|",
            ]
            for g in prof["glue"]:
                chain = g["chain"].replace("|", "\\|")
                lines.append(f"| {chain} | {g['calls']} | {g['ms']:.2f} | {100 * g['ms'] / total:.1f} |")
        return lines

    def write(self) -> None:
        lines = list(self.header) + [""]
        lines += ["| " + " | ".join(self.COLS) + " |", "|" + "|".join("---" for _ in self.COLS) + "|"]
        for m in self.models:
            lines += [self.row_line(r) for r in m["rows"]]
        for m in self.models:
            lines += [
                "",
                f"## {m['model']}: config, binding plans",
                "",
                f"- config ({m['config_class']}): " + json.dumps(m["config"]),
                f"- parameters: {fmt(m.get('params_m'), '.1f')} M; batch {m['batch']} x {m['seq']} tokens",
            ]
            if m.get("error"):
                lines.append(f"- error: {m['error']}")
            if m.get("upstream_backends"):
                lines.append(
                    "- upstream linear-attention functions resolve to: "
                    + ", ".join(f"{k} -> {v}" for k, v in m["upstream_backends"].items())
                )
            for r in m["rows"]:
                if r.get("plan"):
                    lines += ["", f"{r['name']}:", "", "```text", r["plan"], "```"]
            for r in m["rows"]:
                if r.get("profile"):
                    lines += self.profile_lines(m["model"], r)
        text = "\n".join(lines) + "\n"
        self.md.write_text(text, encoding="utf-8")
        self.js.write_text(
            json.dumps({"header": self.header, "models": self.models}, indent=1, default=str), encoding="utf-8"
        )


def run_model(mdef: ModelDef, args, device: torch.device, dtype: torch.dtype, report: Report) -> None:
    from opslot import build_model

    batch_n, seq = (1, 128) if args.tiny else (args.batch, args.seq)
    entry: Dict[str, Any] = dict(model=mdef.key, config_class=mdef.config_class, batch=batch_n, seq=seq, rows=[])
    report.models.append(entry)
    print(f"== {mdef.key} ({time.time() - T0:.0f} s)", flush=True)
    try:
        config = make_config(mdef, args.tiny)
        entry["config"] = recorded_config(config)
    except Exception as exc:  # noqa: BLE001
        entry["error"] = f"config: {type(exc).__name__}: {exc}"
        entry["config"] = {}
        print(f"   {entry['error']}", flush=True)
        report.write()
        return
    print(f"   config: {json.dumps(entry['config'])}", flush=True)

    gen_module, gen_error = None, None
    try:
        gen_module = generate_and_import(mdef, args.patchgen, args.source_root, Path(args.gen_dir))
    except Exception as exc:  # noqa: BLE001
        gen_error = f"generation: {type(exc).__name__}: {str(exc)[:400]}"
        print(f"   {gen_error}", flush=True)

    up_module = importlib.import_module(mdef.upstream_module)
    up_cls = getattr(up_module, mdef.causal_lm)
    entry["upstream_backends"] = linear_attention_backends(up_module) if mdef.linear_attention else {}
    gen_backends = linear_attention_backends(gen_module) if (gen_module is not None and mdef.linear_attention) else {}
    fla_here = importlib.util.find_spec("fla") is not None
    fla_rows = mdef.linear_attention and (args.fla == "yes" or (args.fla == "auto" and fla_here))
    if fla_rows and args.fla_unsafe:
        try:
            import fla.ops.common.chunk_o as fla_chunk_o

            fla_chunk_o.TRITON_ABOVE_3_7_1 = True
        except Exception as exc:  # noqa: BLE001
            print(f"   --fla-unsafe: {type(exc).__name__}: {exc}", flush=True)

    # Reference weights: Transformers' own init of the upstream class, seeded; loaded into every row.
    ref_model, state, ref_error = None, None, None
    try:
        torch.manual_seed(args.seed)
        if device.type == "cuda":
            torch.cuda.manual_seed_all(args.seed)
        ref_model = construct(lambda: up_cls(copy.deepcopy(config)), device, dtype)
        if mdef.prepare is not None:
            mdef.prepare(ref_model, args.seed)
        entry["params_m"] = sum(p.numel() for p in ref_model.parameters()) / 1e6
        state = {k: v.detach().to("cpu", copy=True) for k, v in ref_model.state_dict().items()}
    except Exception as exc:  # noqa: BLE001
        ref_error = f"reference weights: {type(exc).__name__}: {str(exc)[:300]}"
        ref_model = None
        print(f"   {ref_error}", flush=True)
    free(device)
    inputs = make_batch(config.vocab_size, batch_n, seq, device, args.seed + 1)
    tokens = batch_n * seq

    if args.rows and "upstream eager" not in args.rows:
        ref_model = None  # its weights are in `state`; the row that would reuse it does not run
        free(device)
    for cfg in configurations(mdef, fla_rows, args.compile, device.type == "cuda"):
        if args.rows and cfg.name not in args.rows:
            continue
        started = time.time()
        row: Dict[str, Any] = dict(model=mdef.key, name=cfg.name, tokens=tokens, ops=cfg.ops)
        model = None
        try:
            if ref_error:
                raise RuntimeError(ref_error)
            if cfg.ops is None:
                model, ref_model = ref_model, None  # already holds the reference weights (first row)
                if model is None:
                    model = construct(lambda: up_cls(copy.deepcopy(config)), device, dtype)
                    model.load_state_dict(state, strict=True)
                kernels = ", ".join(f"{k} -> {v}" for k, v in entry["upstream_backends"].items())
                kernels = f"{kernels}; attention={model.config._attn_implementation}".lstrip("; ")
                if uses_fla(entry["upstream_backends"]):
                    row["name"] = cfg.name + " (delta rule: fla, picked by upstream's wrapper)"
                row["plan"] = None
            else:
                if gen_error:
                    raise RuntimeError(gen_error)
                if cfg.name == "opslot + fla" and not uses_fla(gen_backends):
                    raise RuntimeError(
                        "fla is not what the upstream delta-rule call resolves to here "
                        f"({gen_backends.get('torch_chunk_gated_delta_rule')}); "
                        f"import fla: {'works' if fla_here else 'fails'}"
                    )
                model = construct(
                    lambda: build_model(
                        copy.deepcopy(config), ops=cfg.ops, module=gen_module, model_class=mdef.causal_lm
                    ),
                    device,
                    dtype,
                )
                model.load_state_dict(state, strict=True)
                kernels, row["plan"] = plan_summary(model)
                if cfg.name == "opslot + fla":
                    kernels += "; eager delta rule -> " + gen_backends["torch_chunk_gated_delta_rule"]
            row["kernels"] = kernels
            free(device)
            if cfg.compile:
                model = torch.compile(model)
            warmup = max(args.warmup, 3) if cfg.compile else args.warmup  # the first steps compile
            row.update(
                measure(model, inputs, device, warmup, args.iters, args.row_budget, args.profile, args.profile_glue)
            )
        except Exception as exc:  # noqa: BLE001  (one configuration's failure must not stop the others)
            row["error"] = row_error(exc, device)
            traceback.print_exc()
        del model
        free(device)
        row["seconds"] = round(time.time() - started, 1)
        entry["rows"].append(row)
        print(Report.row_line(row) + f"   [{row['seconds']} s, at {time.time() - T0:.0f} s]", flush=True)
        report.write()
    del ref_model, state, inputs
    free(device)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="qwen3_5", help=f"comma-separated, of: {', '.join(MODELS)}")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument(
        "--tiny",
        action="store_true",
        help="tiny configs (hidden 64, vocab 256; 2 layers, 3 for deepseek_v4 and glm_moe_dsa), batch 1 x 128",
    )
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--iters", type=int, default=8)
    ap.add_argument(
        "--compile", action="store_true", help="also time upstream and opslot defaults under torch.compile(model)"
    )
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--row-budget",
        type=float,
        default=30.0,
        help="seconds of timed steps per configuration: fewer than --iters (at least 3) when the "
        "last warm-up step says they would take longer",
    )
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument(
        "--row",
        action="append",
        default=[],
        dest="rows",
        metavar="NAME",
        help="run only this configuration (its name in the table); repeatable",
    )
    ap.add_argument(
        "--profile",
        type=int,
        default=0,
        metavar="N",
        help="CUDA: one more step per configuration under torch.profiler; its N costliest kernels",
    )
    ap.add_argument(
        "--profile-glue",
        type=int,
        default=0,
        metavar="N",
        help="CUDA: one more step per configuration; its N costliest copy/add/fill/cat groups by calling ops",
    )
    ap.add_argument(
        "--fla",
        default="auto",
        choices=["auto", "yes", "no"],
        help="the 'opslot + fla' row: auto = when `import fla` works",
    )
    ap.add_argument(
        "--fla-unsafe",
        action="store_true",
        help="switch off fla's Hopper refusal of its gated backward (Triton < 3.7.1): timing only",
    )
    ap.add_argument(
        "--patchgen",
        default=default_patchgen(),
        help="patchgen binary (default $PATCHGEN, .device-bin/patchgen or build/tools/patchgen/patchgen)",
    )
    ap.add_argument("--source-root", default=None, help="folder holding transformers (default: the installed one)")
    ap.add_argument("--gen-dir", default=None, help="where generated modules go (default: a temporary folder)")
    ap.add_argument("--out", default=os.environ.get("OUT", "."), help="folder (train_step.md/.json) or a .md path")
    args = ap.parse_args()

    keys = [k for k in args.models.split(",") if k]
    unknown = [k for k in keys if k not in MODELS]
    if unknown:
        ap.error(f"unknown model(s) {unknown}; known: {', '.join(MODELS)}")
    device = torch.device(args.device)
    if args.rows:
        names = {c.name for k in keys for c in configurations(MODELS[k], True, args.compile, device.type == "cuda")}
        unknown_rows = sorted(set(args.rows) - names)
        if unknown_rows:
            ap.error(f"--row {unknown_rows}: no such configuration for {keys}; known: {sorted(names)}")
    if args.profile_glue and device.type != "cuda":
        ap.error("--profile-glue profiles CUDA kernels: it needs --device cuda")
    if args.profile and device.type != "cuda":
        ap.error("--profile lists CUDA kernels: it needs --device cuda")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            ap.error("--device cuda, but torch sees no GPU")
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
    dtype = getattr(torch, args.dtype)
    args.source_root = args.source_root or site_packages()
    tmp = None
    if args.gen_dir is None:
        tmp = args.gen_dir = tempfile.mkdtemp(prefix="train-step-gen.")

    import transformers

    import opslot
    from opslot.device_defaults import cuda_kernels_unavailable_reason

    if device.type == "cuda":
        torch.cuda.set_device(device.index)
        dev_name = torch.cuda.get_device_name(device)
        kreason = cuda_kernels_unavailable_reason()
        kernels_line = "opslot cuda kernels: " + ("loaded" if kreason is None else f"UNAVAILABLE ({kreason})")
    else:
        dev_name, kernels_line = f"{device.type} ({os.cpu_count()} cores visible)", "opslot cuda kernels: n/a (CPU)"
    pk = {name: importlib.util.find_spec(name) is not None for name in ("fla", "causal_conv1d", "kernels")}
    batch_n, seq = (1, 128) if args.tiny else (args.batch, args.seq)
    others = [f"{k}: {MODELS[k].attn}" for k in keys if MODELS[k].attn != "sdpa"]
    attention = "sdpa" + (f" ({', '.join(others)})" if others else "")
    header = [
        f"# Training step (forward + backward){' (tiny configs)' if args.tiny else ''}: {dev_name}",
        "",
        f"torch {torch.__version__}, transformers {transformers.__version__}, opslot {opslot.__version__}, "
        f"{args.dtype}, attention {attention}, batch {batch_n} x {seq} tokens, labels = input_ids, no attention_mask; "
        f"{kernels_line}; OPSLOT_KERNELS_LIB={os.environ.get('OPSLOT_KERNELS_LIB', '(unset)')}; "
        f"USE_HUB_KERNELS={os.environ.get('USE_HUB_KERNELS')}; importable: "
        + ", ".join(f"{k} {'yes' if v else 'no'}" for k, v in pk.items())
        + f"; patchgen {args.patchgen}.",
        "",
        f"step = `zero_grad(set_to_none=True)` (untimed), then `model(**batch).loss.backward()`; time = median "
        f"(and min-max) of {args.iters} steps (fewer, at least 3, where they would take over {args.row_budget:g} s: the "
        f"count is in the table) after {args.warmup} warm-up steps, "
        + ("CUDA events around the Python step" if device.type == "cuda" else "time.perf_counter")
        + "; peak GiB = torch.cuda.max_memory_allocated() over the timed steps (weights + grads + activations); "
        "J/step = the GPU's energy counter (NVML) over the timed steps / steps, mean W = the same / their wall "
        "time (host gaps between steps included); "
        "weights GiB = memory_allocated() before a step; loss = first step's (same weights and tokens in every "
        "row of a model). Command: `" + " ".join(sys.argv) + "`",
    ]
    print("\n".join(header), flush=True)
    report = Report(args.out, header)
    report.write()
    for key in keys:
        try:
            run_model(MODELS[key], args, device, dtype, report)
        except Exception as exc:  # noqa: BLE001
            traceback.print_exc()
            report.models.append(
                dict(
                    model=key,
                    config_class=MODELS[key].config_class,
                    config={},
                    batch=batch_n,
                    seq=seq,
                    rows=[],
                    error=f"{type(exc).__name__}: {exc}",
                )
            )
            report.write()
        free(device)
    report.write()
    print("", flush=True)
    print(report.md.read_text(encoding="utf-8"), flush=True)
    print(f"written: {report.md}, {report.js} ({time.time() - T0:.0f} s)", flush=True)
    if tmp is not None:
        shutil.rmtree(tmp, ignore_errors=True)
    failed = any(r.get("error") for m in report.models for r in m["rows"]) or any(m.get("error") for m in report.models)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
