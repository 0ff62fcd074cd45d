"""Names that are one name for Python (PEP 3131: identifiers are compared in NFKC)."""

import torch
from torch import nn

# ｓｃａｌｅ (fullwidth) is `scale` for Python.
ｓｃａｌｅ = 2.0


class ToyMLP(nn.Module):
    def __init__(self, size):
        super().__init__()
        self.proj = nn.Linear(size, size)

    # ﬁnd (U+FB01 LATIN SMALL LIGATURE FI) is `find` for Python.
    def ﬁnd(self, x):
        return self.proj(x) * scale

    def forward(self, x):
        return self.find(x)
