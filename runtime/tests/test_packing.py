"""opslot.packing: document boundaries, the packed-row checks, label masking and the `opslot_varlen`
attention against an fp32 reference (documents run one by one through an explicit masked softmax),
forward and backward, on the CPU and (when present) on CUDA in bf16/fp16."""

from __future__ import annotations

import math
from typing import List, Optional

import pytest
import torch

from opslot import packing
from opslot.packing import PackedSequenceError, boundaries, packed_labels, packed_sequence_kwargs, text_positions
from opslot.slot import OpSlot

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def positions(lengths: List[int]) -> torch.Tensor:
    return torch.cat([torch.arange(n) for n in lengths])[None]


# -- boundaries ------------------------------------------------------------------------------------
def test_boundaries_of_a_packed_row():
    cu, longest, count = boundaries(positions([5, 1, 7, 3]))
    assert cu.dtype == torch.int32 and cu.tolist() == [0, 5, 6, 13, 16]
    assert (longest, count) == (7, 4)


def test_boundaries_flatten_rows_and_take_multimodal_positions():
    rows = torch.stack([positions([3, 2])[0], positions([5])[0]])
    cu, longest, count = boundaries(rows)
    assert cu.tolist() == [0, 3, 5, 10] and (longest, count) == (5, 3)
    mrope = rows[None].expand(4, -1, -1)  # Qwen3.5: [text, t, h, w] rows
    assert boundaries(mrope)[0].tolist() == [0, 3, 5, 10]


def test_bare_multimodal_rope_positions_name_no_documents():
    """[3, batch, seq] (get_rope_index's temporal/height/width rows, no text row): an image's constant
    temporal row is not a document boundary; a padded batch of them is not refused either."""
    image_row = torch.tensor([[0, 1, 2, 2, 2, 2, 3, 4]])  # text, a 4-token image (t constant), text
    mrope = torch.stack([image_row, image_row, image_row])
    assert text_positions(mrope) is None
    kwargs, use_cache = packed_sequence_kwargs(mrope, None, None, True, {})
    assert kwargs == {} and use_cache is True
    pad = torch.ones(1, 8, dtype=torch.long)
    pad[0, :2] = 0
    assert packed_sequence_kwargs(mrope, pad, None, False, {}) == ({}, False)
    labels = torch.arange(8)[None]
    out, kw = packed_labels(labels, mrope, {})
    assert torch.equal(out, labels) and kw == {}


def test_a_position_that_jumps_forward_starts_a_document():
    cu, _, _ = boundaries(torch.tensor([[0, 1, 2, 4, 5]]))
    assert cu.tolist() == [0, 3, 5]


# -- packed_sequence_kwargs ------------------------------------------------------------------------
def test_packed_row_gets_boundaries_and_no_cache():
    kwargs, use_cache = packed_sequence_kwargs(positions([2, 3]), None, None, True, {"output_attentions": False})
    assert use_cache is False
    assert kwargs["cu_seq_lens_q"].tolist() == [0, 2, 5] and kwargs["cu_seq_lens_k"] is kwargs["cu_seq_lens_q"]
    assert (kwargs["max_length_q"], kwargs["max_length_k"], kwargs["output_attentions"]) == (3, 3, False)


def test_unpacked_rows_and_generation_are_left_alone():
    given = {"a": 1}
    rows = torch.arange(6).expand(2, -1)
    assert packed_sequence_kwargs(rows, None, None, True, given) == (given, True)
    assert packed_sequence_kwargs(None, None, None, None, given) == (given, None)
    cache = object()
    assert packed_sequence_kwargs(positions([2, 3]), None, cache, True, given) == (given, True)


def test_padded_rows_are_not_packed():
    # the positions generate() derives from a left-padded mask restart at the padding: not packing
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    pos = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 1)
    assert packed_sequence_kwargs(pos, mask, None, True, {"a": 1}) == ({"a": 1}, True)
    right = torch.tensor([[1, 1, 1, 0, 0]])
    assert packed_sequence_kwargs(torch.tensor([[0, 1, 2, 0, 0]]), right, None, False, {}) == ({}, False)


def test_collator_boundaries_are_checked_against_the_positions():
    cu = torch.tensor([0, 2, 5], dtype=torch.int32)
    kwargs, _ = packed_sequence_kwargs(
        positions([2, 3]),
        None,
        None,
        False,
        {"cu_seq_lens_q": cu, "cu_seq_lens_k": cu, "max_length_q": 3, "max_length_k": 3},
    )
    assert kwargs["cu_seq_lens_q"].tolist() == [0, 2, 5]
    with pytest.raises(PackedSequenceError) as err:
        packed_sequence_kwargs(positions([3, 2]), None, None, False, {"cu_seq_lens_q": cu})
    assert str(err.value) == (
        "cu_seq_lens_q=[0, 2, 5] disagrees with the documents of position_ids (restarts give "
        "[0, 3, 5]); pass the collator's position_ids and cu_seq_lens together"
    )
    with pytest.raises(PackedSequenceError, match="^cu_seq_lens_q was given without position_ids"):
        packed_sequence_kwargs(None, None, None, False, {"cu_seq_lens_q": cu})


def test_packed_row_with_a_mask_or_a_cache_is_refused():
    with pytest.raises(PackedSequenceError, match="came with an attention_mask: Transformers then ignores"):
        packed_sequence_kwargs(positions([2, 3]), torch.ones(1, 5), None, False, {})
    mask = torch.tensor([[1, 1, 1, 1, 0]])  # padding after a packed row: still packed
    with pytest.raises(PackedSequenceError, match="came with an attention_mask"):
        packed_sequence_kwargs(torch.tensor([[0, 1, 0, 1, 1]]), mask, None, False, {})
    cu = torch.tensor([0, 2, 5], dtype=torch.int32)
    with pytest.raises(PackedSequenceError, match="^cu_seq_lens_q came with an attention_mask"):
        packed_sequence_kwargs(positions([2, 3]), torch.ones(1, 5), None, False, {"cu_seq_lens_q": cu})
    with pytest.raises(PackedSequenceError, match="^a packed row came with past_key_values"):
        packed_sequence_kwargs(positions([2, 3]), None, object(), False, {"cu_seq_lens_q": cu})


def test_packed_row_through_an_eager_token_mixer_is_refused():
    conv, rule = OpSlot("causal_conv1d", "standard"), OpSlot("chunk_gated_delta_rule", "standard")
    rule.bind("torch")
    with pytest.raises(PackedSequenceError) as err:
        packed_sequence_kwargs(positions([2, 3]), None, None, False, {}, token_mixers=(conv, rule))
    assert str(err.value) == (
        "a packed row reaches causal_conv1d_implementation = eager: upstream's code runs the "
        "state across document boundaries; choose 'torch' or 'cuda' for it (they take cu_seqlens), "
        "or do not pack rows for this model here"
    )
    conv.bind("torch")
    kwargs, _ = packed_sequence_kwargs(positions([2, 3]), None, None, False, {}, token_mixers=(conv, rule))
    assert kwargs["cu_seq_lens_q"].tolist() == [0, 2, 5]
    # an unpacked batch never needs them
    assert packed_sequence_kwargs(
        torch.arange(5)[None], None, None, False, {}, token_mixers=(OpSlot("causal_conv1d", "standard"),)
    ) == ({}, False)


# -- packed_labels ---------------------------------------------------------------------------------
def test_labels_at_document_starts_are_ignored():
    labels = torch.arange(10, 15)[None]
    out, kwargs = packed_labels(labels, positions([2, 3]), {})
    assert out.tolist() == [[-100, 11, -100, 13, 14]] and labels.tolist() == [[10, 11, 12, 13, 14]]
    shift = torch.arange(20, 25)[None]
    _, kwargs = packed_labels(None, positions([2, 3]), {"shift_labels": shift})
    assert kwargs["shift_labels"].tolist() == [[20, -100, 22, 23, 24]]
    assert packed_labels(labels, None, {}) == (labels, {})


# -- the attention ---------------------------------------------------------------------------------
class Attn(torch.nn.Module):
    def __init__(self, causal=True, sinks=False):
        super().__init__()
        self.is_causal = causal
        if sinks:
            self.sinks = torch.nn.Parameter(torch.zeros(4))


def reference(q, k, v, docs_q, docs_k, scale, causal=True, window=None):
    """fp32 softmax(q k^T) v per document, queries aligned to the last keys."""
    q, k, v = q.double(), k.double(), v.double()
    group = q.shape[1] // k.shape[1]
    out = torch.zeros(q.shape[0], q.shape[1], v.shape[-1], dtype=torch.float64)
    for (q0, q1), (k0, k1) in zip(docs_q, docs_k):
        qd, kd = q[q0:q1].transpose(0, 1), k[k0:k1].transpose(0, 1).repeat_interleave(group, 0)
        vd = v[k0:k1].transpose(0, 1).repeat_interleave(group, 0)
        scores = qd @ kd.transpose(1, 2) * scale
        qi = torch.arange(q1 - q0)[:, None] + (k1 - k0) - (q1 - q0)
        kj = torch.arange(k1 - k0)[None]
        allowed = torch.ones_like(scores[0], dtype=torch.bool)
        if causal:
            allowed &= kj <= qi
        if window is not None:
            allowed &= (qi - kj).abs() < window
        scores = scores.masked_fill(~allowed, -math.inf)
        out[q0:q1] = (scores.softmax(-1) @ vd).transpose(0, 1)
    return out


def spans(lengths):
    starts = [sum(lengths[:i]) for i in range(len(lengths))]
    return [(s, s + n) for s, n in zip(starts, lengths)]


def make_qkv(total, heads, kv_heads, dim, dim_v, device, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(1, heads, total, dim, generator=gen)
    k = torch.randn(1, kv_heads, total, dim, generator=gen)
    v = torch.randn(1, kv_heads, total, dim_v, generator=gen)
    return [t.to(device, dtype).requires_grad_() for t in (q, k, v)]


def tolerance(dtype):
    return {torch.float32: (1e-5, 1e-5), torch.bfloat16: (3e-2, 3e-2), torch.float16: (5e-3, 5e-3)}[dtype]


def dtypes(device):
    return [torch.float32] if device == "cpu" else [torch.bfloat16, torch.float16]


CASES = [  # (lengths, heads, kv_heads, dim, dim_v, causal, window)
    ([5, 1, 7, 3], 4, 2, 16, 16, True, None),  # GQA, a one-token document
    ([9, 4], 4, 4, 32, 32, True, 3),  # sliding window shorter than the documents
    ([6, 6, 2], 4, 1, 24, 16, True, None),  # MQA; value head narrower than the query's (MLA)
    ([7], 2, 2, 8, 8, False, None),  # bidirectional
    ([65, 130, 1], 8, 2, 64, 64, True, None),  # longer than a FlashAttention block
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", CASES, ids=[f"case{i}" for i in range(len(CASES))])
def test_varlen_attention_equals_the_reference(device, case):
    lengths, heads, kv_heads, dim, dim_v, causal, window = case
    for dtype in dtypes(device):
        q, k, v = make_qkv(sum(lengths), heads, kv_heads, dim, dim_v, device, dtype)
        cu = torch.tensor([0] + list(torch.tensor(lengths).cumsum(0)), dtype=torch.int32, device=device)
        scale = dim**-0.5
        out, weights = packing.varlen_attention_forward(
            Attn(causal),
            q,
            k,
            v,
            None,
            scaling=scale,
            sliding_window=window,
            cu_seq_lens_q=cu,
            cu_seq_lens_k=cu,
            max_length_q=max(lengths),
            max_length_k=max(lengths),
        )
        assert weights is None and out.shape == (1, sum(lengths), heads, dim_v) and out.dtype == dtype
        grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(device, dtype)
        out.backward(grad)
        qr, kr, vr = [t.detach().cpu()[0].transpose(0, 1).double().requires_grad_() for t in (q, k, v)]
        ref = reference(qr, kr, vr, spans(lengths), spans(lengths), scale, causal, window)
        ref.backward(grad.cpu()[0].double())
        rtol, atol = tolerance(dtype)
        torch.testing.assert_close(out.detach().cpu()[0].double(), ref, rtol=rtol, atol=atol)
        for name, got, want in (("dq", q, qr), ("dk", k, kr), ("dv", v, vr)):
            torch.testing.assert_close(
                got.grad.cpu()[0].transpose(0, 1).double(),
                want.grad,
                rtol=rtol,
                atol=atol,
                msg=lambda m: f"{dtype} {name}: {m}",
            )


@pytest.mark.parametrize("device", DEVICES)
def test_documents_from_position_ids_padding_and_decoding(device):
    dtype = dtypes(device)[0]
    rtol, atol = tolerance(dtype)
    # position ids alone (a model without opslot's model-level hook)
    q, k, v = make_qkv(16, 4, 2, 16, 16, device, dtype, seed=3)
    pos = positions([5, 1, 7, 3]).to(device)
    by_pos, _ = packing.varlen_attention_forward(Attn(), q, k, v, None, scaling=0.25, position_ids=pos)
    cu = torch.tensor([0, 5, 6, 13, 16], dtype=torch.int32, device=device)
    by_cu, _ = packing.varlen_attention_forward(Attn(), q, k, v, None, scaling=0.25, cu_seq_lens_q=cu, cu_seq_lens_k=cu)
    assert torch.equal(by_pos, by_cu)
    # a padded batch: left padding in row 0, none in row 1; pads give zeros
    q2, k2, v2 = make_qkv(14, 4, 2, 16, 16, device, dtype, seed=4)
    q2, k2, v2 = [t.detach().reshape(t.shape[1], 2, 7, t.shape[-1]).transpose(0, 1) for t in (q2, k2, v2)]
    mask = torch.ones(2, 7, dtype=torch.long, device=device)
    mask[0, :3] = 0
    out, _ = packing.varlen_attention_forward(Attn(), q2, k2, v2, mask, scaling=0.25)
    assert torch.count_nonzero(out[0, :3]) == 0
    for row, start in ((0, 3), (1, 0)):
        ref = reference(
            *[t[row, :, start:].transpose(0, 1).cpu() for t in (q2, k2, v2)], [(0, 7 - start)], [(0, 7 - start)], 0.25
        )
        torch.testing.assert_close(out[row, start:].cpu().double(), ref, rtol=rtol, atol=atol)
    # decoding: one query over a padded cache, aligned to the last key
    q3 = q2[:, :, -1:]
    out, _ = packing.varlen_attention_forward(Attn(), q3, k2, v2, mask, scaling=0.25)
    full, _ = packing.varlen_attention_forward(Attn(), q2, k2, v2, mask, scaling=0.25)
    torch.testing.assert_close(out[:, 0], full[:, -1], rtol=rtol, atol=atol)


def test_the_mask_function_passes_padding_only():
    assert packing.varlen_attention_mask(2, 4, 4, attention_mask=None) is None
    assert packing.varlen_attention_mask(2, 4, 4, attention_mask=torch.ones(2, 4, dtype=torch.bool)) is None
    mask = torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]], dtype=torch.bool)
    assert torch.equal(packing.varlen_attention_mask(2, 4, 4, attention_mask=mask), mask)


def test_what_flash_cannot_do_is_refused():
    q, k, v = make_qkv(4, 4, 4, 8, 8, "cpu", torch.float32)
    with pytest.raises(NotImplementedError, match="^opslot_varlen: Attn caps attention logits"):
        packing.varlen_attention_forward(Attn(), q, k, v, None, softcap=50.0)
    with pytest.raises(NotImplementedError, match="^opslot_varlen: Attn has attention sinks"):
        packing.varlen_attention_forward(Attn(sinks=True), q, k, v, None)
    module = Attn().train()
    with pytest.raises(NotImplementedError, match=r"^opslot_varlen: attention dropout \(0.1\) is not supported"):
        packing.varlen_attention_forward(module, q, k, v, None, dropout=0.1)
    cu = torch.tensor([0, 4], dtype=torch.int32)
    with pytest.raises(PackedSequenceError, match="cu_seq_lens_q and a padding mask together"):
        packing.varlen_attention_forward(Attn(), q, k, v, torch.ones(1, 4), cu_seq_lens_q=cu)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_fp32_on_cuda_is_refused():
    q, k, v = make_qkv(4, 4, 4, 8, 8, "cuda", torch.float32)
    with pytest.raises(TypeError, match="^opslot_varlen on CUDA runs FlashAttention, which takes float16 or bfloat16"):
        packing.varlen_attention_forward(Attn(), q, k, v, None)


@pytest.mark.parametrize("device", DEVICES)
def test_varlen_attention_is_deterministic(device):
    dtype = dtypes(device)[0]
    results: List[Optional[torch.Tensor]] = []
    for _ in range(2):
        q, k, v = make_qkv(40, 4, 2, 32, 32, device, dtype, seed=9)
        cu = torch.tensor([0, 17, 40], dtype=torch.int32, device=device)
        out, _ = packing.varlen_attention_forward(Attn(), q, k, v, None, cu_seq_lens_q=cu, cu_seq_lens_k=cu)
        out.sum().backward()
        results.append(torch.cat([out.flatten(), q.grad.flatten(), k.grad.flatten(), v.grad.flatten()]))
    assert torch.equal(results[0], results[1])


def test_registered_with_transformers():
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    assert ALL_ATTENTION_FUNCTIONS["opslot_varlen"] is packing.varlen_attention_forward
    assert ALL_MASK_ATTENTION_FUNCTIONS["opslot_varlen"] is packing.varlen_attention_mask
