"""The baseline for Horovod's examples (scripts/horovod-examples.sh,
scripts/horovod-mnist.sh): the calls those examples make, on
torch.distributed's gloo, as a DDP script would make them, so that the
same example file runs with `import gloo_hvd as hvd` in place of its
Horovod import. DistributedOptimizer averages the gradients with one
all_reduce of their concatenation before the step (DDP's arithmetic: the
sum over ranks divided by the size; no overlap). Compression.fp16 sends
that buffer as float16. Adasum (which gloo lacks) is a reference: every
rank's gradients allgathered and combined tensor by tensor with
Adasum(a, b) = (1 - a.b / 2|a|^2) a + (1 - a.b / 2|b|^2) b, pairing ranks
r and r ^ 2^l at level l (tide's order on one host, docs/algorithms.md),
in float64; power-of-two sizes only. elastic.run calls the function once
and TorchState holds the attributes: there is no membership change to
survive here.

Ranks meet at tcp://127.0.0.1:$GLOO_HVD_PORT, with tiderun's TIDE_RANK,
TIDE_SIZE and TIDE_LOCAL_RANK.
"""
import os

import torch
import torch.distributed as dist

Average, Sum, Adasum = "average", "sum", "adasum"


class Compression:
    none, fp16 = None, "fp16"


def init():
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%s" % os.environ["GLOO_HVD_PORT"],
                            rank=int(os.environ["TIDE_RANK"]), world_size=int(os.environ["TIDE_SIZE"]))


def shutdown():
    dist.destroy_process_group()


def rank():
    return dist.get_rank()


def size():
    return dist.get_world_size()


def local_rank():
    return int(os.environ["TIDE_LOCAL_RANK"])


def local_size():
    return int(os.environ.get("TIDE_LOCAL_SIZE", dist.get_world_size()))


def nccl_built():
    return 0


def broadcast_parameters(state, root_rank):
    for t in state.values():
        dist.broadcast(t, root_rank)


def broadcast_optimizer_state(optimizer, root_rank):
    box = [optimizer.state_dict()]
    dist.broadcast_object_list(box, root_rank)
    optimizer.load_state_dict(box[0])


def allreduce(tensor, name=None):
    t = tensor.clone()
    dist.all_reduce(t)
    return t / dist.get_world_size()


def _adasum_pair(a, b):
    dot, aa, bb = float(a @ b), float(a @ a), float(b @ b)
    ca = 1.0 - dot / (2 * aa) if aa > 0 else 1.0
    cb = 1.0 - dot / (2 * bb) if bb > 0 else 1.0
    return ca * a + cb * b


def _adasum(grads):
    """Every rank's gradients, combined tensor by tensor (float64)."""
    n = dist.get_world_size()
    if n & (n - 1):
        raise ValueError("the gloo Adasum reference needs a power-of-two size, got %d" % n)
    flat = torch.cat([g.reshape(-1) for g in grads]).double()
    every = [torch.empty_like(flat) for _ in range(n)]
    dist.all_gather(every, flat)
    out, at = [], 0
    for g in grads:
        parts = [e[at:at + g.numel()] for e in every]
        while len(parts) > 1:
            parts = [_adasum_pair(parts[i], parts[i + 1]) for i in range(0, len(parts), 2)]
        out.append(parts[0])
        at += g.numel()
    return out


def DistributedOptimizer(optimizer, named_parameters=None, compression=None, op=Average,
                         gradient_predivide_factor=1.0):
    assert compression in (None, "fp16") and op in (Average, Adasum) and gradient_predivide_factor == 1.0, \
        "the baseline has the examples' options only"
    step = optimizer.step

    def synced_step(closure=None):
        grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        if op == Adasum:
            for g, combined in zip(grads, _adasum(grads)):
                g.copy_(combined.view_as(g))
            return step(closure)
        flat = torch.cat([g.reshape(-1) for g in grads])
        wire = flat.half() if compression == "fp16" else flat
        dist.all_reduce(wire)
        flat = wire.to(flat.dtype) / dist.get_world_size()
        at = 0
        for g in grads:
            g.copy_(flat[at:at + g.numel()].view_as(g))
            at += g.numel()
        return step(closure)
    optimizer.step = synced_step
    return optimizer


class _Elastic:
    """hvd.elastic for a job whose membership never changes."""

    @staticmethod
    def run(func):
        return func

    class TorchState:
        def __init__(self, model=None, optimizer=None, **kwargs):
            self.model, self.optimizer = model, optimizer
            self._callbacks = []
            for k, v in kwargs.items():
                setattr(self, k, v)

        def register_reset_callbacks(self, callbacks):
            self._callbacks.extend(callbacks)

        def commit(self):
            pass


elastic = _Elastic()
