"""Toy utilities."""


def can_return_tuple(fn):
    return fn


def old_helper():
    return None
