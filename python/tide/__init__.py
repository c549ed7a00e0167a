"""tide: adaptive, communication-efficient distributed training.

The PyTorch binding is tide.torch (docs/torch.md). This top level only
exposes tide's errors, which every binding raises.
"""
from ._lib import (TideError, InvalidArgumentError, PeerError, MismatchError, TideTimeoutError,  # noqa: F401
                   AbortedError)

__all__ = ["TideError", "InvalidArgumentError", "PeerError", "MismatchError", "TideTimeoutError",
           "AbortedError"]
