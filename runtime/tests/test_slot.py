"""OpSlot: binding, dispatch, unbound errors, repr and the shared-rebinding warning."""

import gc
import types
import warnings

import pytest
import torch

from opslot import OpsImplementationConfig, OpSlot
from opslot.kernels import torch_ops


class Model(torch.nn.Module):
    pass


def test_new_slot_is_eager():
    slot = OpSlot("rms_norm", "standard")
    assert slot.impl == "eager" and not slot.use_non_eager_impl and slot.bind_count == 0
    assert repr(slot) == "OpSlot('rms_norm', 'standard', impl='eager')"


def test_unbound_call_is_a_clear_error():
    slot = OpSlot("rms_norm", "standard")
    slot.name = "rms_norm_slot"
    with pytest.raises(RuntimeError) as err:
        slot(torch.ones(2), torch.ones(2), 1e-6)
    assert str(err.value) == (
        "OpSlot 'rms_norm_slot' (rms_norm/standard) is not bound to a kernel (impl 'eager'): a guard must check "
        "`use_non_eager_impl` before calling it; bind it with opslot.bind_ops(module, ops) or slot.bind('<impl>')"
    )


def test_bind_dispatches_and_eager_unbinds():
    slot = OpSlot("rms_norm", "standard").bind("torch")
    assert slot.use_non_eager_impl and slot.impl == "torch" and slot.bind_count == 1
    x, w = torch.randn(2, 8), torch.rand(8)
    assert torch.equal(slot(x, w, 1e-6), torch_ops.rms_norm_standard(x, w, 1e-6))
    assert repr(slot) == "OpSlot('rms_norm', 'standard', impl='torch')"
    slot.bind("eager")
    assert not slot.use_non_eager_impl and slot.bind_count == 2


def test_bind_to_wrong_variant_is_refused():
    slot = OpSlot("moe", "gpt_oss")
    with pytest.raises(KeyError, match="'npu' implements moe variant"):
        slot.bind("npu")
    assert slot.impl == "eager"


def test_bad_construction():
    with pytest.raises(ValueError, match=r"^OpSlot needs a non-empty op and variant, got 'rms_norm', ''$"):
        OpSlot("rms_norm", "")


def test_rebinding_a_shared_slot_warns():
    slot = OpSlot("rms_norm", "standard").bind("torch")
    slot.name = "norm_slot"
    model = Model()
    slot.attach(model)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        slot.bind("torch")  # same implementation: nothing changes for the model
    with pytest.warns(RuntimeWarning) as record:
        slot.bind("eager")
    assert str(record[0].message) == (
        "rebinding OpSlot 'norm_slot' (rms_norm/standard) from 'torch' to 'eager' changes the 1 live model "
        "instance(s) that share it; build models with opslot.build_model (private module copy) or "
        "instance-scoped slots to keep them apart"
    )
    del model
    gc.collect()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        slot.bind("torch")  # the model is gone: no one shares the slot any more


@pytest.mark.parametrize(
    "ops",
    [
        {"rms_norm_implementation": "torch"},
        OpsImplementationConfig(rms_norm_implementation="torch"),
    ],
)
def test_bind_from_config(ops):
    config = types.SimpleNamespace(ops_implementation=ops)
    assert OpSlot("rms_norm", "offset").bind_from(config).impl == "torch"
    assert OpSlot("swiglu_mlp", "standard").bind_from(config).impl == "eager"


def test_bind_from_config_without_ops_stays_eager():
    assert OpSlot("rms_norm", "standard").bind_from(types.SimpleNamespace()).impl == "eager"


def test_bind_from_maps_fused_moe():
    config = types.SimpleNamespace(ops_implementation={"moe_implementation": "fused_torch"})
    assert OpSlot("moe", "gpt_oss").bind_from(config).impl == "torch"
