"""`opslot_sdpa` (opslot.compiled_sdpa): Transformers' sdpa with the causal mask skipped under
torch.compile where SDPA's is_causal is exactly that mask; everything else gets Transformers' mask."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

from transformers import Qwen3Config, Qwen3ForCausalLM  # noqa: E402
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, causal_mask_function  # noqa: E402

from opslot import OpsImplementationConfig, compiled_sdpa  # noqa: E402


def _skip(**kw):
    args = dict(
        q_length=8,
        kv_length=8,
        q_offset=0,
        attention_mask=None,
        mask_function=causal_mask_function,
        local_size=None,
        allow_is_causal_skip=True,
    )
    args.update(kw)
    return compiled_sdpa.causal_skip(**args)


def test_causal_skip_only_where_is_causal_is_the_mask():
    assert _skip() and _skip(q_length=1, kv_length=9) and _skip(local_size=16)
    assert not _skip(kv_length=9)  # decoding several tokens against a cache: lower-right alignment
    assert not _skip(attention_mask=torch.ones(1, 8, dtype=torch.bool))
    assert not _skip(mask_function=lambda *a: True)  # packed documents, bidirectional, ...
    assert not _skip(local_size=8)  # the window is reached
    assert not _skip(allow_is_causal_skip=False)
    assert not _skip(q_offset=torch.tensor(0))


def test_torch_export_keeps_the_mask(monkeypatch):
    monkeypatch.setattr(torch.compiler, "_is_exporting_flag", True)
    assert not _skip()


def _model():
    torch.manual_seed(0)
    cfg = Qwen3Config(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=64,
    )
    return Qwen3ForCausalLM(cfg).eval()


def test_compiled_model_gets_no_mask_and_the_same_logits(monkeypatch):
    compiled_sdpa.register_attention()
    masks = []
    real = compiled_sdpa.sdpa_mask

    def recording(*args, **kwargs):
        out = real(*args, **kwargs)
        masks.append(out)
        return out

    monkeypatch.setitem(ALL_MASK_ATTENTION_FUNCTIONS._global_mapping, "opslot_sdpa", recording)
    plain = ALL_MASK_ATTENTION_FUNCTIONS["sdpa"]
    sdpa_masks = []
    monkeypatch.setitem(
        ALL_MASK_ATTENTION_FUNCTIONS._global_mapping,
        "sdpa",
        lambda *a, **k: sdpa_masks.append(plain(*a, **k)) or sdpa_masks[-1],
    )
    model = _model()
    ids = torch.randint(0, 64, (2, 8))
    model.config._attn_implementation = "sdpa"
    with torch.no_grad():
        expected = model(input_ids=ids).logits
        torch._dynamo.reset()
        torch.compile(model, backend="eager")(input_ids=ids)
    # The problem: Transformers' sdpa mask under torch.compile is a full boolean mask.
    assert sdpa_masks[0] is None and isinstance(sdpa_masks[-1], torch.Tensor)
    model.config._attn_implementation = "opslot_sdpa"
    torch._dynamo.reset()
    with torch.no_grad():
        got = torch.compile(model, backend="eager")(input_ids=ids).logits
    assert masks and all(m is None for m in masks)  # traced: Transformers 5.17's sdpa would build one
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    masks.clear()
    pad = torch.ones(2, 8, dtype=torch.long)
    pad[0, :3] = 0
    with torch.no_grad():
        model(input_ids=ids, attention_mask=pad)
    assert len(masks) == 1 and isinstance(masks[0], torch.Tensor) and masks[0].shape == (2, 1, 8, 8)
    torch._dynamo.reset()


def test_the_name_is_accepted_by_an_ops_config():
    cfg = OpsImplementationConfig(attn_implementation="opslot_sdpa")
    assert cfg.attn_implementation == "opslot_sdpa"
    with pytest.raises(ValueError, match="did you mean 'opslot_sdpa'"):
        OpsImplementationConfig(attn_implementation="opslot_sdp")
