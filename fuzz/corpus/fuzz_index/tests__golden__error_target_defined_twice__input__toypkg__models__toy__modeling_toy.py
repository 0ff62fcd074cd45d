import torch
from torch import nn


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x2, x1), dim=-1)


class ToyMLP(nn.Module):
    def __init__(self, size):
        super().__init__()
        self.proj = nn.Linear(size, size)

    def forward(self, x):
        return self.proj(x)

    @property
    def width(self):
        return self.proj.in_features

    @width.setter
    def width(self, value):
        raise AttributeError("read-only")

    def forward(self, x):  # the live one: Python keeps the last definition
        return torch.relu(self.proj(x))


if torch.__version__ >= "2":
    def scale(x):
        return x * 2
else:
    def scale(x):
        return x


def rotate_half(x):  # redefined: the first one above is dead code
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)
