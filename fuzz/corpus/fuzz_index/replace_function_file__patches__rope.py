import torch


# Same values as upstream, via chunk.
def rotate_half_chunked(x):
    """Rotates half the hidden dims of the input."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)
