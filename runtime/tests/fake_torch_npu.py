"""A fake `torch_npu` for CPU tests of the "npu" kernels.

Each operator checks the argument contract the adapters rely on (tensor ranks and shapes, matching
dtypes, keyword names and values), records the call, and computes the documented math in plain
PyTorch (differentiably, so gradients can be compared too)."""

import types

import torch
import torch.nn.functional as F


class ContractError(AssertionError):
    pass


def _require(cond, msg):
    if not cond:
        raise ContractError(msg)


def make_fake_torch_npu():
    mod = types.ModuleType("torch_npu")
    mod.calls = []

    def npu_rms_norm(x, gamma, epsilon=1e-6):
        _require(
            gamma.dim() == 1 and gamma.shape[0] == x.shape[-1],
            f"gamma shape {tuple(gamma.shape)} vs x {tuple(x.shape)}",
        )
        _require(gamma.dtype == x.dtype, f"gamma dtype {gamma.dtype} != x dtype {x.dtype}")
        mod.calls.append(("npu_rms_norm", tuple(x.shape), x.dtype, {"epsilon": epsilon}))
        x32 = x.float()
        rstd = torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + epsilon)
        return (x32 * rstd * gamma.float()).to(x.dtype), rstd

    def npu_rotary_mul(x, r1, r2):
        _require(x.dim() == 4 and r1.dim() == 4 and r2.dim() == 4, "npu_rotary_mul takes 4-D tensors")
        _require(r1.shape == r2.shape, "r1 and r2 must have the same shape")
        _require(r1.shape[-1] == x.shape[-1], f"last dim {r1.shape[-1]} != {x.shape[-1]}")
        _require(r1.dtype == x.dtype and r2.dtype == x.dtype, "r1/r2 dtype must match x")
        torch.broadcast_shapes(x.shape, r1.shape)
        mod.calls.append(("npu_rotary_mul", tuple(x.shape), x.dtype, {}))
        half = x.shape[-1] // 2
        rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        return x * r1 + rotated * r2

    def npu_swiglu(x, dim=-1):
        _require(x.shape[dim] % 2 == 0, f"npu_swiglu needs an even size on dim {dim}")
        mod.calls.append(("npu_swiglu", tuple(x.shape), x.dtype, {"dim": dim}))
        a, b = x.chunk(2, dim=dim)
        return F.silu(a) * b

    def npu_grouped_matmul(x, weight, *, bias=None, group_list=None, split_item=0, group_type=None, group_list_type=0):
        _require(isinstance(x, list) and len(x) == 1 and x[0].dim() == 2, "x must be a list of one 2-D tensor")
        _require(isinstance(weight, list) and all(w.dim() == 2 for w in weight), "weight must be a list of 2-D tensors")
        _require(all(w.shape[0] == x[0].shape[1] for w in weight), "weight[i] must be [K, N] with K = x.shape[1]")
        _require(all(w.dtype == x[0].dtype for w in weight), "weight dtype must match x")
        _require(bias is None, "bias is not used")
        _require(
            split_item in (2, 3) and group_type == 0 and group_list_type == 0,
            f"unexpected split_item={split_item} group_type={group_type} group_list_type={group_list_type}",
        )
        _require(
            torch.is_tensor(group_list)
            and group_list.dtype == torch.int64
            and group_list.dim() == 1
            and len(group_list) == len(weight),
            "group_list must be an int64 cumulative tensor, one per weight",
        )
        ends = group_list.tolist()
        _require(ends == sorted(ends) and ends[-1] == x[0].shape[0], "group_list must be cumulative and end at M")
        mod.calls.append(("npu_grouped_matmul", tuple(x[0].shape), x[0].dtype, {"groups": len(weight)}))
        outs, start = [], 0
        for w, end in zip(weight, ends):
            outs.append(x[0][start:end] @ w)
            start = end
        return [torch.cat(outs, dim=0)]

    for fn in (npu_rms_norm, npu_rotary_mul, npu_swiglu, npu_grouped_matmul):
        setattr(mod, fn.__name__, fn)
    return mod
