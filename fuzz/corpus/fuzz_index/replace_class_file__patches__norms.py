"""Norm variants for the Toy model."""
import torch
from torch import nn


class UnusedNorm(nn.Module):
    pass


@torch.jit.ignore
class LowPrecisionRMSNorm(nn.Module):
    """RMSNorm without the fp32 upcast."""

    def __init__(self, hidden_size, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, hidden_states):
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        return self.weight * hidden_states * torch.rsqrt(variance + self.variance_epsilon)
