"""Run a kernel and its fp32 reference on the same data and compare outputs and gradients.

Inputs are generated once in fp32 on the CPU; the kernel gets copies in the dtype under test on the
device under test, the reference gets fp32 copies. Both are back-propagated with the same random
cotangents, and every output and every gradient (inputs and module parameters) is compared with
`max|a - b| <= atol + rtol * max|b|`, tolerances per dtype.
"""

import copy

import pytest
import torch

TOLERANCES = {torch.float32: (2e-5, 2e-5), torch.bfloat16: (2e-2, 2e-2)}
DTYPES = [torch.float32, torch.bfloat16]


def leaf(t, device, dtype, grad=True):
    out = t.detach().to(device=device, dtype=dtype if t.is_floating_point() else t.dtype).clone()
    if grad and t.is_floating_point():
        out.requires_grad_()
    return out


def forward_backward(call, leaves, modules=()):
    """Run `call()`, back-propagate sum(out * cotangent) over its tensor outputs; return
    (outputs, gradients of the floating leaves, gradients of the modules' parameters)."""
    outs = call()
    outs = outs if isinstance(outs, (tuple, list)) else (outs,)
    outs = [o for o in outs if torch.is_tensor(o)]
    gen = torch.Generator().manual_seed(1234)
    total = 0
    for o in outs:
        if o.is_floating_point() and o.requires_grad:
            total = total + (o.float() * torch.randn(o.shape, generator=gen).to(o.device)).sum()
    if torch.is_tensor(total):
        total.backward()
    grads = [x.grad for x in leaves if torch.is_tensor(x) and x.is_floating_point()]
    grads += [p.grad for m in modules for p in m.parameters()]
    return outs, grads


def max_err(actual, expected):
    if expected.numel() == 0:  # empty inputs (no rows): nothing to differ
        return 0.0
    return float((actual.detach().float().cpu() - expected.detach().float().cpu()).abs().max())


def assert_close(actual, expected, dtype, what):
    atol, rtol = TOLERANCES[dtype]
    assert actual is not None and expected is not None, f"{what}: missing ({actual is None}, {expected is None})"
    assert actual.shape == expected.shape, f"{what}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    err = max_err(actual, expected)
    bound = atol + rtol * (float(expected.detach().float().abs().max()) if expected.numel() else 0.0)
    assert err <= bound, f"{what}: max abs error {err:.3g} > {bound:.3g} ({dtype})"


def compare(kernel, reference, tensors, make_call, device, dtype, modules=(), out_dtype=None):
    """`make_call(fn, t, mods)` calls `fn` with tensors dict `t` and module list `mods`.
    `out_dtype`, when given, is the dtype every floating output of the kernel must have."""
    kt = {k: leaf(v, device, dtype) if torch.is_tensor(v) else v for k, v in tensors.items()}
    rt = {k: leaf(v, "cpu", torch.float32) if torch.is_tensor(v) else v for k, v in tensors.items()}
    kmods = [copy.deepcopy(m).to(device=device, dtype=dtype) for m in modules]
    rmods = [copy.deepcopy(m).float() for m in modules]
    try:
        k_out, k_grads = forward_backward(lambda: make_call(kernel, kt, kmods), list(kt.values()), kmods)
    except RuntimeError as exc:  # torch 1.13 lacks some bf16 CPU kernels (e.g. mse_loss)
        if str(device) == "cpu" and "not implemented for 'BFloat16'" in str(exc):
            pytest.skip(f"this torch has no bf16 CPU kernel: {exc}")
        raise
    r_out, r_grads = forward_backward(lambda: make_call(reference, rt, rmods), list(rt.values()), rmods)
    assert len(k_out) == len(r_out), f"{len(k_out)} outputs vs {len(r_out)} from the reference"
    for i, (a, b) in enumerate(zip(k_out, r_out)):
        if out_dtype is not None and a.is_floating_point():
            assert a.dtype == out_dtype, f"output {i}: dtype {a.dtype}, expected {out_dtype}"
        assert_close(a, b, dtype, f"output {i}")
    for i, (a, b) in enumerate(zip(k_grads, r_grads)):
        if b is None:
            assert a is None or float(a.abs().max()) == 0.0, f"grad {i}: reference has none"
            continue
        assert_close(a, b, dtype, f"grad {i}")
    return k_out, r_out
