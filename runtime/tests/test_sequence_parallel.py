"""opslot.sequence_parallel without processes: shard_batch, the masks and keywords the inner attention
gets for the gathered sequence (against a brute-force reference), the pass-through of the token-mixer
kernel wrappers, the refusals. The collectives (2 and 4 processes, generated models against the
unsharded ones) are tests/distributed/test_sequence_parallel.py."""

from __future__ import annotations

import itertools
from types import SimpleNamespace
from typing import Optional

import pytest
import torch
import torch.distributed as dist
from torch import nn

from opslot import sequence_parallel as spm
from opslot.sequence_parallel import (
    CTX_KEY,
    SP_ATTENTION,
    SequenceParallelContext,
    SequenceParallelKernel,
    SPState,
    shard_batch,
)
from opslot.slot import OpSlot


def positions(lengths):
    return torch.cat([torch.arange(n) for n in lengths])[None]


# -- shard_batch ---------------------------------------------------------------------------------------
def test_shard_batch_pads_to_a_multiple_of_the_sp_size_and_slices_every_row():
    ids = torch.arange(30).reshape(2, 15)
    batch = {"input_ids": ids, "labels": ids + 100, "return_dict": True}
    parts = [shard_batch(batch, size=4, rank=r, pad_token_id=99) for r in range(4)]
    assert [tuple(p["input_ids"].shape) for p in parts] == [(2, 4)] * 4
    whole = {k: torch.cat([p[k] for p in parts], 1) for k in ("input_ids", "labels", "attention_mask")}
    assert whole["input_ids"][:, :15].equal(ids) and whole["input_ids"][:, 15].tolist() == [99, 99]
    assert whole["labels"][:, :15].equal(ids + 100) and whole["labels"][:, 15].tolist() == [-100, -100]
    assert whole["attention_mask"].tolist() == [[1] * 15 + [0]] * 2  # made: the padding is no router token
    assert all(p["return_dict"] is True and "position_ids" not in p for p in parts)


def test_shard_batch_without_padding_adds_no_mask():
    parts = [shard_batch({"input_ids": torch.zeros(1, 16, dtype=torch.long)}, size=4, rank=r) for r in range(4)]
    assert all(set(p) == {"input_ids"} for p in parts)


def test_shard_batch_of_a_packed_row_continues_the_positions_and_drops_the_boundaries():
    pos = positions([5, 1, 6, 3])
    batch = {
        "input_ids": torch.arange(15)[None],
        "position_ids": pos,
        "cu_seq_lens_q": torch.tensor([0, 5, 6, 12, 15]),
        "cu_seq_lens_k": torch.tensor([0, 5, 6, 12, 15]),
        "max_length_q": 6,
        "max_length_k": 6,
    }
    parts = [shard_batch(batch, size=2, rank=r) for r in range(2)]
    assert all(set(p) == {"input_ids", "position_ids", "attention_mask"} for p in parts)
    got = torch.cat([p["position_ids"] for p in parts], 1)
    assert got.tolist() == [pos[0].tolist() + [3]]  # the padding joins the last document


def test_shard_batch_inputs_embeds_and_a_given_mask():
    embeds = torch.randn(1, 5, 3)
    mask = torch.tensor([[0, 1, 1, 1, 1]])
    parts = [shard_batch({"inputs_embeds": embeds, "attention_mask": mask}, size=2, rank=r) for r in range(2)]
    assert torch.cat([p["inputs_embeds"] for p in parts], 1)[:, 5].abs().sum() == 0
    assert torch.cat([p["attention_mask"] for p in parts], 1).tolist() == [[0, 1, 1, 1, 1, 0]]


@pytest.mark.parametrize(
    "batch, message",
    [
        (
            {"input_ids": torch.zeros(1, 4, dtype=torch.long), "cu_seq_lens_q": torch.tensor([0, 4])},
            "cu_seq_lens_q/k without position_ids",
        ),
        (
            {"input_ids": torch.zeros(1, 4, dtype=torch.long), "token_type_ids": torch.zeros(1, 4)},
            "do not know how to shard token_type_ids",
        ),
        ({"labels": torch.zeros(1, 4, dtype=torch.long)}, "needs input_ids"),
    ],
)
def test_shard_batch_refusals(batch, message):
    with pytest.raises(ValueError, match=message):
        shard_batch(batch, size=2, rank=0)


# -- the gathered sequence's masks ---------------------------------------------------------------------
def _state(inner: str, size: int = 2) -> SPState:
    return SPState(None, size, 0, object, (), inner, {}, 1, (), None, None)


def _context(inner: str, pos: torch.Tensor, key_mask: Optional[torch.Tensor] = None) -> SequenceParallelContext:
    batch, total = pos.shape
    starts = torch.ones_like(pos, dtype=torch.bool)
    starts[:, 1:] = pos[:, 1:] != pos[:, :-1] + 1
    packed = bool(starts[:, 1:].any())
    cu, longest = None, 0
    if packed:
        from opslot.packing import boundaries

        cu, longest, _ = boundaries(pos)
    return SequenceParallelContext(
        _state(inner),
        batch,
        total // 2,
        pos,
        packed,
        cu,
        longest,
        key_mask,
        None if key_mask is None else key_mask.long(),
    )


def _brute(pos: torch.Tensor, key_mask: Optional[torch.Tensor], window: Optional[int]) -> torch.Tensor:
    batch, total = pos.shape
    out = torch.zeros(batch, 1, total, total, dtype=torch.bool)
    for b in range(batch):
        doc = 0
        docs = []
        for t in range(total):
            if t and pos[b, t] != pos[b, t - 1] + 1:
                doc += 1
            docs.append(doc)
        for i, j in itertools.product(range(total), repeat=2):
            out[b, 0, i, j] = (
                j <= i
                and docs[i] == docs[j]
                and (window is None or i - j < window)
                and (key_mask is None or bool(key_mask[b, j]))
            )
    return out


CASES = {
    "packed": (torch.cat([positions([3, 1, 4]), torch.arange(8)[None]]), None),
    "padded": (torch.arange(8)[None].repeat(2, 1), torch.tensor([[1] * 8, [0, 0, 0] + [1] * 5]).bool()),
    "packed_padded": (
        torch.cat([positions([2, 6]), positions([5, 3])]),
        torch.tensor([[1] * 8, [1] * 6 + [0, 1]]).bool(),
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("window", [None, 3])
def test_sdpa_and_eager_masks_are_causal_per_document_over_the_gathered_sequence(case, window):
    pos, key_mask = CASES[case]
    expect = _brute(pos, key_mask, window)
    mask, extra = _context("sdpa", pos, key_mask).attention_inputs(window, torch.float32, torch.device("cpu"))
    assert extra == {} and mask.dtype == torch.bool
    assert mask.expand_as(expect).equal(expect)
    additive, _ = _context("eager", pos, key_mask).attention_inputs(window, torch.float16, torch.device("cpu"))
    assert additive.dtype == torch.float16
    # eager: 0 where allowed, the dtype's minimum elsewhere (a row with no key: uniform, as Transformers' masks)
    assert additive.expand_as(expect).eq(0).equal(expect)
    assert additive.expand_as(expect)[~expect].eq(torch.finfo(torch.float16).min).all()


def test_sdpa_gets_no_mask_for_a_plain_causal_sequence():
    ctx = _context("sdpa", torch.arange(8)[None].repeat(2, 1))
    assert ctx.attention_inputs(None, torch.float32, torch.device("cpu")) == (None, {})


def test_eager_always_gets_the_causal_mask():
    mask, _ = _context("eager", torch.arange(4)[None]).attention_inputs(None, torch.float32, torch.device("cpu"))
    assert mask[0, 0].eq(0).equal(torch.ones(4, 4, dtype=torch.bool).tril())


def test_varlen_gets_the_global_documents():
    pos = positions([3, 1, 4])
    mask, extra = _context("opslot_varlen", pos).attention_inputs(None, torch.float32, torch.device("cpu"))
    assert mask is None and extra["cu_seq_lens_q"].tolist() == [0, 3, 4, 8] and extra["max_length_q"] == 4
    assert extra["position_ids"] is not None and extra["position_ids"].equal(pos)
    mask, extra = _context("opslot_varlen", torch.arange(8)[None].repeat(2, 1)).attention_inputs(
        None, torch.float32, torch.device("cpu")
    )
    assert mask is None and extra["cu_seq_lens_k"].tolist() == [0, 8, 16] and extra["max_length_k"] == 8
    key_mask = torch.tensor([[0, 1, 1, 1]]).bool()
    mask, extra = _context("opslot_varlen", torch.arange(4)[None], key_mask).attention_inputs(
        None, torch.float32, torch.device("cpu")
    )
    assert mask.equal(key_mask) and "cu_seq_lens_q" not in extra  # the padding is dropped by opslot_varlen


# -- wrappers and refusals -----------------------------------------------------------------------------
def test_kernel_wrappers_pass_calls_without_a_context_through():
    calls = []

    def kernel(*args, **kwargs):
        calls.append((args, kwargs))
        return "out"

    for op in ("causal_conv1d", "chunk_gated_delta_rule"):
        wrapped = SequenceParallelKernel(kernel, op)
        assert wrapped(1, 2, cu_seqlens=None) == "out" and wrapped.__wrapped__ is kernel
    assert calls == [((1, 2), {"cu_seqlens": None})] * 2


def test_the_attention_needs_the_forward_context():
    module = SimpleNamespace(num_key_value_groups=1)
    q = torch.zeros(1, 2, 4, 8)
    with pytest.raises(RuntimeError, match="without a sequence-parallel context"):
        spm.sp_attention_forward(module, q, q, q, None)


def test_the_attention_is_registered_without_a_mask_function():
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    assert ALL_ATTENTION_FUNCTIONS[SP_ATTENTION] is spm.sp_attention_forward and CTX_KEY == "opslot_sp"
    assert SP_ATTENTION not in ALL_MASK_ATTENTION_FUNCTIONS._global_mapping  # Transformers builds no local mask


def test_head_view_changes_only_the_groups():
    module = nn.Module()
    module.num_key_value_groups, module.is_causal = 4, True
    view = spm._HeadView(module, 2)
    assert (view.num_key_value_groups, view.is_causal, view.training) == (2, True, True)


class _Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.num_key_value_groups, self.head_dim = 2, 8


class _FakeGatedDeltaNet(nn.Module):
    conv_dim, num_v_heads, num_k_heads = 96, 4, 2


class _LM(nn.Module):
    def __init__(self, heads=4, kv=2, attn="sdpa", gdn=False):
        super().__init__()
        self.config = SimpleNamespace(num_attention_heads=heads, num_key_value_heads=kv, _attn_implementation=attn)
        self.lm_head = nn.Linear(2, 2)
        self.attn = _Attention()
        if gdn:
            self.mixer = _FakeGatedDeltaNet()

    def forward(self, input_ids=None, position_ids=None, labels=None):
        return None


@pytest.mark.parametrize(
    "model, size, message",
    [
        (nn.Linear(2, 2), 2, "Linear is not a causal-LM text model"),
        (_LM(heads=6), 4, "6 attention heads do not split over 4 ranks"),
        (_LM(heads=6, kv=3), 2, "3 key/value heads neither split over 2 ranks nor divide it"),
        (_LM(attn="flex_attention"), 2, "attn_implementation 'flex_attention' is not supported"),
        (_LM(gdn=True), 2, "run causal_conv1d, chunk_gated_delta_rule on upstream's code"),
    ],
)
def test_refusals(model, size, message):
    assert message in spm._refusal(model, size)


def test_accepted_shapes():
    assert spm._refusal(_LM(heads=4, kv=2), 4) is None  # 2 KV heads replicated over 4 ranks
    assert spm._refusal(_LM(heads=4, kv=4, attn="opslot_varlen"), 2) is None


def test_a_gated_delta_net_with_bound_kernels_is_accepted():
    slots = {op: OpSlot(op, "standard").bind("torch") for op in ("causal_conv1d", "chunk_gated_delta_rule")}
    model = _LM(heads=8, kv=8, gdn=True)
    for op, slot in slots.items():
        setattr(model.mixer, f"{op}_slot", slot)  # instance-scoped slots are found too
    assert spm._refusal(model, 2) is None
    assert "Gated DeltaNet with 96 conv channels and 4 value heads does not split over 8 ranks" in spm._refusal(
        model, 8
    )


@pytest.mark.skipif(dist.is_initialized(), reason="a process group exists in this process")
def test_sequence_parallel_needs_a_process_group():
    with pytest.raises(RuntimeError, match="needs torch.distributed initialised"):
        spm.sequence_parallel(_LM(), None)
    with pytest.raises(RuntimeError, match="needs torch.distributed initialised"):
        spm.parallelize(_LM(), sp=2)
