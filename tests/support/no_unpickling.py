"""`no_unpickling()`: a block in which any unpickling raises `Unpickled`.

Patches every way this process could unpickle: `pickle`/`_pickle` `load`, `loads` and `Unpickler`
(subclasses created later still refuse), and `torch.load` (whatever `weights_only` says). A test
wraps core loading and generation in it to prove that they unpickle nothing.
"""

from __future__ import annotations

import _pickle
import contextlib
import pickle
from unittest import mock

import torch


class Unpickled(AssertionError):
    """Something unpickled inside a `no_unpickling()` block."""


def _refuse(*args, **kwargs):
    raise Unpickled("unpickling was attempted")


class _RefusingUnpickler(pickle.Unpickler):
    def __init__(self, *args, **kwargs):
        raise Unpickled("a pickle.Unpickler was created")


@contextlib.contextmanager
def no_unpickling():
    import torch._dynamo  # noqa: F401  (imported unpatched: it subclasses pickle.Unpickler at import)

    with contextlib.ExitStack() as stack:
        for module in (pickle, _pickle):
            stack.enter_context(mock.patch.object(module, "load", _refuse))
            stack.enter_context(mock.patch.object(module, "loads", _refuse))
            stack.enter_context(mock.patch.object(module, "Unpickler", _RefusingUnpickler))
        stack.enter_context(mock.patch.object(torch, "load", _refuse))
        stack.enter_context(mock.patch.object(torch.serialization, "load", _refuse))
        yield
