"""`opslot_sdpa` (opslot.compiled_sdpa): which calls lose the mask, the name in an ops config, the
marker packed_sequence_kwargs sets. The whole models under torch.compile: tests/models/test_packing.py."""

from __future__ import annotations

import types

import pytest
import torch

from opslot import OpsImplementationConfig, compiled_sdpa, packing

MARK = {compiled_sdpa.UNPACKED_CAUSAL_ROWS: True}
Q = torch.zeros(1, 4, 8, 2)
K = torch.zeros(1, 2, 8, 2)


def test_plain_causal_only_for_marked_full_causal_layers():
    causal = types.SimpleNamespace(is_causal=True)
    assert compiled_sdpa.plain_causal(causal, Q, K, dict(MARK))
    assert compiled_sdpa.plain_causal(types.SimpleNamespace(), Q, K, dict(MARK))  # Transformers' default
    assert compiled_sdpa.plain_causal(causal, Q, K, dict(MARK, sliding_window=None))
    assert not compiled_sdpa.plain_causal(causal, Q, K, {})  # eager, or rows the caller described
    assert not compiled_sdpa.plain_causal(causal, Q, K, dict(MARK, sliding_window=4))
    assert not compiled_sdpa.plain_causal(causal, Q, K, dict(MARK, is_causal=False))
    assert not compiled_sdpa.plain_causal(types.SimpleNamespace(is_causal=False), Q, K, dict(MARK))
    assert not compiled_sdpa.plain_causal(causal, Q, torch.zeros(1, 2, 9, 2), dict(MARK))  # keys of a cache


def test_the_marker_is_set_only_while_compiling_and_only_for_undescribed_rows(monkeypatch):
    kwargs, use_cache = packing.packed_sequence_kwargs(None, None, None, True, {"x": 1})
    assert kwargs == {"x": 1} and use_cache is True  # eager: unchanged
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    kwargs, use_cache = packing.packed_sequence_kwargs(None, None, None, False, {"x": 1})
    assert kwargs == dict(MARK, x=1) and use_cache is False
    positions = torch.arange(6)[None]
    for args in ((positions, None, None), (None, torch.ones(1, 6), None), (None, None, object())):
        kwargs, _ = packing.packed_sequence_kwargs(*args, False, {})
        assert compiled_sdpa.UNPACKED_CAUSAL_ROWS not in kwargs, args


def test_the_name_is_accepted_by_an_ops_config():
    cfg = OpsImplementationConfig(attn_implementation="opslot_sdpa")
    assert cfg.attn_implementation == "opslot_sdpa"
    with pytest.raises(ValueError, match="did you mean 'opslot_sdpa'"):
        OpsImplementationConfig(attn_implementation="opslot_sdp")


def test_registered_with_transformers():
    pytest.importorskip("transformers")
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    compiled_sdpa.register_attention()
    assert ALL_ATTENTION_FUNCTIONS["opslot_sdpa"] is compiled_sdpa.sdpa_attention_forward
    assert ALL_MASK_ATTENTION_FUNCTIONS["opslot_sdpa"] is ALL_MASK_ATTENTION_FUNCTIONS["sdpa"]
