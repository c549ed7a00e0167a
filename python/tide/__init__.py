"""tide: adaptive, communication-efficient distributed training.

The PyTorch binding is tide.torch (docs/torch.md). This top level only
exposes tide's errors, which every binding raises, and the learning-rate
schedules (tide.schedule) the Trainer takes from libtide, and tide.data
(dataset export, packing into shards, indexing, cache statistics).
"""
from ._lib import (TideError, InvalidArgumentError, PeerError, MismatchError, TideTimeoutError,  # noqa: F401
                   AbortedError)
from .schedule import lr_schedule, lr_at  # noqa: F401
from . import data  # noqa: F401

__all__ = ["TideError", "InvalidArgumentError", "PeerError", "MismatchError", "TideTimeoutError",
           "AbortedError", "lr_schedule", "lr_at", "data"]
