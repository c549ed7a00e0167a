"""Horovod's SyncBatchNorm on tide.torch: batch normalisation whose batch
statistics are those of the whole global batch (every rank's samples),
through tide.torch's differentiable allreduce, so the gradients are those
of the sum of the ranks' losses, as Horovod's. Ranks may hold different
numbers of samples."""
import torch

from . import _comm
from ._comm import Sum


class SyncBatchNorm(torch.nn.modules.batchnorm._BatchNorm):
    """Drop-in for torch.nn.BatchNorm1d/2d/3d (inputs of shape (N, C, ...)).
    In training with more than one rank, the mean and variance are the
    global batch's: two allreduces per forward (the per-channel sums and
    the count, then the squared deviations), and two in backward. Eval
    mode, or a one-rank job, is plain batch normalisation."""

    def _check_input_dim(self, input):
        if input.dim() < 2:
            raise ValueError("expected at least 2D input (got %dD input)" % input.dim())

    def forward(self, input):
        from ._horovod import allreduce  # (a cycle at import time otherwise)
        self._check_input_dim(input)
        if not self.training or _comm.size() == 1:
            return super().forward(input)
        factor = 0.0 if self.momentum is None else self.momentum
        if self.track_running_stats and self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
            if self.momentum is None:
                factor = 1.0 / float(self.num_batches_tracked)
        c = input.shape[1]
        dims = [0] + list(range(2, input.dim()))
        shape = [1, c] + [1] * (input.dim() - 2)
        x = input if input.dtype in (torch.float32, torch.float64) else input.float()
        count = torch.tensor([float(x.numel() // c)], dtype=x.dtype, device=x.device)
        head = allreduce(torch.cat([x.sum(dims), count]), op=Sum, name=None)
        total = head[c]
        mean = head[:c] / total
        var = allreduce((x - mean.view(shape)).pow(2).sum(dims), op=Sum) / total
        if self.track_running_stats:
            with torch.no_grad():
                n = float(total)
                self.running_mean.mul_(1 - factor).add_(mean.detach() * factor)
                self.running_var.mul_(1 - factor).add_(var.detach() * (n / max(n - 1, 1)) * factor)
        y = (x - mean.view(shape)) / torch.sqrt(var.view(shape) + self.eps)
        if self.affine:
            y = y * self.weight.view(shape) + self.bias.view(shape)
        return y.to(input.dtype)
