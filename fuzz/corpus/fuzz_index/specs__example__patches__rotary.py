"""Replacement for ToyRotaryEmbedding: the same frequencies, plus HF's newer `attention_scaling`
(1.0 for the default RoPE type, so the values are unchanged)."""

import torch
from torch import nn


class ScaledRotaryEmbedding(nn.Module):
    def __init__(self, config: ToyConfig):
        super().__init__()
        self.config = config
        self.attention_scaling = 1.0
        dim = config.head_dim
        inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.float) / dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    @torch.no_grad()
    def forward(self, x, position_ids):
        inv_freq_expanded = self.inv_freq[None, :, None].float().expand(position_ids.shape[0], -1, 1)
        position_ids_expanded = position_ids[:, None, :].float()
        freqs = (inv_freq_expanded @ position_ids_expanded).transpose(1, 2)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos = emb.cos() * self.attention_scaling
        sin = emb.sin() * self.attention_scaling
        return cos.to(dtype=x.dtype), sin.to(dtype=x.dtype)
