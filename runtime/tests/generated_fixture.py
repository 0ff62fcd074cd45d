"""Source of a small "generated" module, in the shape patchgen emits: module-level slots declared
after the imports, entry guards, and one instance-scoped slot bound in `__init__` from the config."""

SOURCE = """\
import torch
from torch import nn

from opslot import OpSlot

rms_norm_slot = OpSlot("rms_norm", "standard")
swiglu_slot = OpSlot("swiglu_mlp", "standard")


def rotate_half(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


class TinyRMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.variance_epsilon = eps

    def forward(self, hidden_states):
        if rms_norm_slot.use_non_eager_impl:
            return rms_norm_slot(hidden_states, self.weight, self.variance_epsilon)
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden_states.to(input_dtype)


class TinyMLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.gate_proj = nn.Linear(config.hidden_size, 2 * config.hidden_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, 2 * config.hidden_size, bias=False)
        self.down_proj = nn.Linear(2 * config.hidden_size, config.hidden_size, bias=False)

    def forward(self, x):
        if swiglu_slot.use_non_eager_impl:
            return swiglu_slot(self, x)
        return self.down_proj(nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


class TinyModel(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.norm = TinyRMSNorm(config.hidden_size)
        self.mlp = TinyMLP(config)
        self.rope_slot = OpSlot("rotary_pos_emb", "full").bind_from(config, owner=self)

    def rope(self, q, k, cos, sin):
        if self.rope_slot.use_non_eager_impl:
            return self.rope_slot(q, k, cos, sin, unsqueeze_dim=1)
        cos = cos.unsqueeze(1)
        sin = sin.unsqueeze(1)
        return (q * cos) + (rotate_half(q) * sin), (k * cos) + (rotate_half(k) * sin)

    def forward(self, x):
        return self.mlp(self.norm(x))
"""
