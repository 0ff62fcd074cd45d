"""Two definitions that are one name for Python (PEP 3131): the later one wins."""

import torch


def ﬁnd(x):  # U+FB01 LATIN SMALL LIGATURE FI: `find` for Python
    return torch.argmax(x)


def find(x):  # rebinds `find`: Python keeps this one
    return torch.argmin(x)
