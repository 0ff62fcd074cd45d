"""OpSlot.kernel / OpSlot.wrap_kernel: a bound kernel wrapped in place (what sequence parallelism does
around the Gated DeltaNet kernels), undone by binding again."""

import pytest

from opslot.slot import OpSlot


def test_wrap_kernel_runs_the_wrapper_until_the_slot_is_bound_again():
    slot = OpSlot("rms_norm", "standard").bind("torch")
    inner = slot.kernel
    seen = []

    def wrapper(fn):
        def wrapped(*args, **kwargs):
            seen.append(len(args))
            return fn(*args, **kwargs)

        return wrapped

    slot.wrap_kernel(wrapper)
    assert slot.kernel is not inner and slot.impl == "torch" and slot.why == "direct"
    import torch

    x = torch.randn(2, 4)
    assert torch.equal(slot(x, torch.ones(4), 1e-6), inner(x, torch.ones(4), 1e-6))
    assert seen == [3] and slot.ran
    slot.bind("torch")
    slot(x, torch.ones(4), 1e-6)
    assert seen == [3]


def test_wrap_kernel_refuses_an_unbound_slot_and_a_non_callable():
    slot = OpSlot("rms_norm", "standard")
    assert slot.kernel is None
    with pytest.raises(
        RuntimeError,
        match=r"^OpSlot \(rms_norm/standard\) is not bound to a kernel \(impl 'eager'\): "
        r"there is nothing to wrap$",
    ):
        slot.wrap_kernel(lambda fn: fn)
    slot.bind("torch")
    with pytest.raises(TypeError, match="^wrap_kernel: the wrapper returned int, not a callable$"):
        slot.wrap_kernel(lambda fn: 3)
