"""Sequence parallelism (DeepSpeed-Ulysses, opslot.distributed.parallelize) of generated Qwen3, Qwen3-MoE
and Qwen3.5 models against the unsharded model, on 2 and 4 processes.

CPU (CI, `ctest -R distributed`): gloo, opslot's `torch` kernels, fp32; one spawn of 2 processes and
one of 4 run every scenario (tests/distributed/sp_scenarios.py) and the tests assert on what they
measured: the loss, the MoE aux loss and router logits, the gradients (averaged over the ranks, or
FSDP2's) and, with FSDP2, the loss after an SGD step, equal to the unsharded model's on the same
global batch to fp32 reduction-order tolerance. Covered: SP = 2 and 4; sdpa, eager and opslot_varlen
(packed rows, documents from the global position ids); padding (a sequence not divisible by the SP
size, padded by shard_batch; an attention_mask with leading padding); fewer KV heads than ranks
(replicated); Gated DeltaNet layers (Qwen3.5, conv and delta rule head-parallel); the load-balancing
loss on global statistics; SP x FSDP2 (2 x 2 on 4 processes) and SP x EP x FSDP2, with activation
checkpointing. Bad inputs on one rank: the same ValueError on every rank.

CUDA (`--device cuda`, 2 GPUs; tests/distributed/run_gpu_sp.sh): NCCL, the `cuda` kernels, bf16, the
2-process scenarios.
"""

from typing import Any, Dict, List, Tuple

import pytest

import harness

SP2: List[Tuple[str, str, Dict[str, Any]]] = [
    ("qwen3_sdpa_padded", "parity", {"model": "qwen3", "attn": "sdpa", "sp": 2, "seq": 15}),
    ("qwen3_eager_left_padding", "parity", {"model": "qwen3", "attn": "eager", "sp": 2, "left_pad": 3}),
    (
        "qwen3_varlen_packed_padded",
        "parity",
        {"model": "qwen3", "attn": "opslot_varlen", "sp": 2, "batch": 1, "packed": [5, 1, 6, 3]},
    ),
    (
        "qwen3_sdpa_packed_chunked_loss",
        "parity",
        {"model": "qwen3", "attn": "sdpa", "sp": 2, "batch": 1, "packed": [5, 1, 6, 4], "loss": "torch_chunked"},
    ),
    ("qwen3_moe_aux_padded", "parity", {"model": "qwen3_moe", "attn": "sdpa", "sp": 2, "seq": 13}),
    ("qwen3_5_sdpa_left_padding", "parity", {"model": "qwen3_5", "attn": "sdpa", "sp": 2, "left_pad": 3}),
    (
        "qwen3_5_varlen_packed",
        "parity",
        {"model": "qwen3_5", "attn": "opslot_varlen", "sp": 2, "batch": 1, "packed": [5, 1, 6, 4]},
    ),
    ("qwen3_5_fsdp_ac", "parity", {"model": "qwen3_5", "attn": "sdpa", "sp": 2, "fsdp": True, "ac": True, "steps": 2}),
    (
        "qwen3_moe_ep_fsdp_ac",
        "parity",
        {"model": "qwen3_moe", "attn": "sdpa", "sp": 2, "ep": 2, "fsdp": True, "ac": True, "steps": 2},
    ),
    ("preconditions", "preconditions", {}),
]
SP4: List[Tuple[str, str, Dict[str, Any]]] = [
    ("qwen3_sp4_sdpa_padded", "parity", {"model": "qwen3", "attn": "sdpa", "sp": 4, "seq": 15}),
    ("qwen3_moe_sp4_eager_aux", "parity", {"model": "qwen3_moe", "attn": "eager", "sp": 4, "seq": 13}),
    (
        "qwen3_5_sp4_varlen_packed",
        "parity",
        {"model": "qwen3_5", "attn": "opslot_varlen", "sp": 4, "batch": 1, "packed": [5, 1, 8, 4]},
    ),
    (
        "qwen3_moe_dp2_sp2_fsdp_ac",
        "parity",
        {"model": "qwen3_moe", "attn": "sdpa", "sp": 2, "dp": 2, "fsdp": True, "ac": True, "steps": 2},
    ),
]
#: On CUDA (2 GPUs, bf16, cuda kernels): the 2-process scenarios.
CUDA2 = SP2


def _lists(device: str) -> Dict[int, List[Tuple[str, str, Dict[str, Any]]]]:
    return {2: CUDA2} if device.startswith("cuda") else {2: SP2, 4: SP4}


def pytest_generate_tests(metafunc):
    device = metafunc.config.getoption("--device")
    if "sp_name" in metafunc.fixturenames:
        names = [(world, n) for world, lst in _lists(device).items() for n, kind, _ in lst if kind == "parity"]
        metafunc.parametrize("sp_name", names, ids=[n for _, n in names])


@pytest.fixture(scope="session")
def sp_module_dir(request, tmp_path_factory):
    """patchgen's Qwen3, Qwen3-MoE and Qwen3.5 GPU modules (generated from the installed transformers)."""
    from pathlib import Path

    patchgen = Path(request.config.getoption("--patchgen")).resolve()
    if not patchgen.is_file():
        pytest.fail(f"no patchgen binary at {patchgen} (build it, or pass --patchgen / set PATCHGEN_BIN)")
    root = request.config.getoption("--source-root")
    if not root:
        import importlib.util

        root = str(Path(importlib.util.find_spec("transformers").origin).resolve().parents[1])
    return str(
        harness.generate(
            str(patchgen), root, tmp_path_factory.mktemp("sp_generated"), keys=("qwen3", "qwen3_moe", "qwen3_5")
        )
    )


_RUNS: Dict[int, Any] = {}


def _results(world: int, device: str, module_dir: str, results_json=None):
    """Every scenario of `world` processes, run once (one spawn) for the whole session (written to
    `results_json` with `.sp<world>.json` appended when given)."""
    if world not in _RUNS:
        import sp_scenarios

        cfg = {
            "module_dir": module_dir,
            "device": device,
            "scenarios": _lists(device)[world],
            "ops": "cuda" if device.startswith("cuda") else "torch",
            "dtype": "bf16" if device.startswith("cuda") else "fp32",
        }
        try:
            _RUNS[world] = harness.spawn(sp_scenarios.all_scenarios, cfg, world=world, device=device, deadline_s=300)
        except RuntimeError as exc:
            _RUNS[world] = exc
        if results_json and not isinstance(_RUNS[world], Exception):
            import json

            with open(f"{results_json}.sp{world}.json", "w") as fh:
                json.dump(_RUNS[world], fh, indent=1, default=str)
    got = _RUNS[world]
    if isinstance(got, Exception):
        pytest.fail(f"the {world}-process run failed:\n{got}")
    return got


def _options(device: str, world: int, name: str) -> Dict[str, Any]:
    return next(o for n, _, o in _lists(device)[world] if n == name)


def test_sequence_parallel_matches_one_process(request, device, sp_module_dir, sp_name):
    world, name = sp_name
    if device.startswith("cuda"):
        import torch

        if torch.cuda.device_count() < world:
            pytest.skip(f"needs {world} GPUs")
    ranks = [r[name] for r in _results(world, device, sp_module_dir, request.config.getoption("--results-json"))]
    for rank, got in enumerate(ranks):
        if "exception" in got:
            pytest.fail(f"scenario {name} raised on rank {rank}:\n{got['exception']}")
    opts = _options(device, world, name)
    fp32 = not device.startswith("cuda")
    ref = ranks[0]
    sp = opts["sp"]
    assert ref["attention"] == "opslot_sp" and ref["inner"] == opts["attn"], ref
    if opts["model"] == "qwen3_5":
        assert ref["gdn_wrapped"] == 2, ref  # causal_conv1d and chunk_gated_delta_rule
    assert ref["kv_rep"] == (1 if 2 % sp == 0 else sp // 2), ref  # 2 KV heads in the tiny configs
    assert not ref["missing"], ref["missing"]
    family = "cuda" if device.startswith("cuda") else "torch"
    expect_impl = {family, f"fused_{family}", opts.get("loss", family)}
    bound = {k: v for k, v in ref["slots"].items() if k != "sequence_classification_loss_slot"}  # no such head
    assert set(bound.values()) <= expect_impl, ref["slots"]
    if opts.get("loss"):
        assert ref["slots"]["causal_lm_loss_slot"] == opts["loss"], ref["slots"]
    rtol = 1e-5 if fp32 else 2e-2
    for rank, got in enumerate(ranks):
        expect = ref["ref_losses"][got["replica"]]
        assert abs(got["loss"] - expect) <= rtol * abs(expect), (rank, got["loss"], ref["ref_losses"])
        # every rank of a replica returns the loss of the whole sequence, the same value
        assert got["loss"] == ranks[got["replica"] * sp]["loss"], [g["loss"] for g in ranks]
        if ref["ref_aux"][0] is not None:
            aux = ref["ref_aux"][got["replica"]]
            assert abs(got["aux"] - aux) <= rtol * abs(aux), (rank, got["aux"], ref["ref_aux"])
            assert got["router_rows"] == opts.get("batch", 2) * got["tokens"] * sp  # the gathered router logits
        if opts.get("steps", 1) > 1:
            expect = ref["ref_losses2"][got["replica"]]
            assert abs(got["loss2"] - expect) <= 10 * rtol * abs(expect), (rank, got["loss2"], ref["ref_losses2"])
    assert ref["max_grad_rel_diff"] <= (1e-4 if fp32 else 0.1), (ref["worst_grad"], ref["max_grad_rel_diff"])


_SP_REFUSAL = (
    "sequence parallelism: every rank of the SP group must pass the same batch shape and the same inputs "
    "(its slice of each), got "
)
PRECONDITIONS = {  # sp_scenarios.preconditions: the message every rank must raise
    "tokens_differ": "ValueError: " + _SP_REFUSAL + "rank 0: 1 x 8 tokens, input_ids; rank 1: 1 x 7 tokens, input_ids",
    "labels_on_one_rank": "ValueError: " + _SP_REFUSAL + "rank 0: 1 x 8 tokens, input_ids, labels; "
    "rank 1: 1 x 8 tokens, input_ids",
    "positions_on_one_rank": "ValueError: " + _SP_REFUSAL + "rank 0: 1 x 8 tokens, input_ids; "
    "rank 1: 1 x 8 tokens, input_ids, position_ids 2-D",
    "cache_on_one_rank": "ValueError: " + _SP_REFUSAL + "rank 0: 1 x 8 tokens, input_ids; "
    "rank 1: 1 x 8 tokens, input_ids, past_key_values",
    "packed_with_padding_inside": "ValueError: sequence parallelism: a packed row (position ids restarting) with "
    "padding that is not at the end of its row; pad at the end (shard_batch does) or "
    "do not pack",
    "labels_shape_on_one_rank": "ValueError: " + _SP_REFUSAL + "rank 0: 1 x 8 tokens, input_ids, labels; "
    "rank 1: 1 x 8 tokens, input_ids, labels, labels / mask / position ids of another "
    "shape",
    "attention_changed_on_one_rank": "ValueError: " + _SP_REFUSAL + "rank 0: 1 x 8 tokens, input_ids; "
    "rank 1: 1 x 8 tokens, input_ids, attention or token-mixer kernels changed",
    "fine_after_bad_inputs": "no error",
    "sp_size_differs": "ValueError: parallelize: every rank must do the same, got rank 0: sp=2, ep=1, fsdp=False, "
    "ep_mode='splits', capacity=None; rank 1: sp=1, ep=1, fsdp=False, ep_mode='splits', "
    "capacity=None",
    "heads_do_not_split": "ValueError: sequence_parallel: 3 attention heads do not split over 2 ranks",
    "attention_differs": "ValueError: sequence_parallel refused on 1 of 2 ranks: rank 1: sequence_parallel: "
    "attn_implementation 'flex_attention' is not supported; use one of sdpa, eager, "
    "opslot_varlen (the SP wrapper gives it the gathered sequence)",
    "config_differs": "ValueError: sequence_parallel: every rank must do the same, got rank 0: Qwen3ForCausalLM, "
    "sp=2, attention=sdpa, config ",  # ... the config digests differ: a prefix
    "delta_rule_on_eager": "ValueError: sequence_parallel: the Gated DeltaNet layers of Qwen3_5ForCausalLM run "
    "chunk_gated_delta_rule on upstream's code; bind a kernel ('torch' or 'cuda': "
    "chunk_gated_delta_rule_implementation), whose calls sequence parallelism makes "
    "head-parallel",
    "twice": "ValueError: sequence_parallel: SequenceParallelQwen3ForCausalLM is already sequence-parallel",
    "fine_at_the_end": "no error",
}


@pytest.mark.parametrize("case", sorted(PRECONDITIONS))
def test_bad_input_on_one_rank_is_the_same_value_error_on_every_rank(request, device, sp_module_dir, case):
    got = [r["preconditions"] for r in _results(2, device, sp_module_dir, request.config.getoption("--results-json"))]
    if "exception" in got[0]:
        pytest.fail(got[0]["exception"])
    assert got[0][case] == got[1][case], (got[0][case], got[1][case])
    if case == "config_differs":
        assert got[0][case].startswith(PRECONDITIONS[case]) and "rank 1: Qwen3ForCausalLM" in got[0][case]
    else:
        assert got[0][case] == PRECONDITIONS[case]
