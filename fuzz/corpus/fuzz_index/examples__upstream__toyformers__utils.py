# Copyright 2026 The patchgen authors. All rights reserved.
#
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
# You may obtain a copy of the License at
#
#     http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.
"""Decorators used by the modeling files."""

import functools


def auto_docstring(obj=None, *, custom_intro=None):
    """Marks a class or method as documented; usable as `@auto_docstring` or `@auto_docstring(...)`."""

    def decorate(target):
        if custom_intro is not None:
            target.__doc__ = custom_intro + (target.__doc__ or "")
        return target

    return decorate if obj is None else decorate(obj)


def can_return_tuple(forward):
    """Lets `forward` return a plain tuple when called with `return_dict=False`."""

    @functools.wraps(forward)
    def wrapper(self, *args, return_dict=True, **kwargs):
        output = forward(self, *args, **kwargs)
        return output if return_dict else output.to_tuple()

    return wrapper
