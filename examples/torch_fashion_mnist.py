#!/usr/bin/python3
"""Fashion-MNIST in PyTorch on tide: the MLP and CNN tide-train trains, from
the same Debian files (dataset-fashion-mnist), with the same defaults
(batch 64 per rank, momentum 0.9, lr 0.05, weight decay 5e-4, cosine).

    tiderun -np 4 /usr/bin/python3 examples/torch_fashion_mnist.py --model cnn
    tiderun -np 4 /usr/bin/python3 examples/torch_fashion_mnist.py --compression hitopk:0.01
    tiderun -np 4 /usr/bin/python3 examples/torch_fashion_mnist.py --adapt gns,adascale
    tiderun -np 4 /usr/bin/python3 examples/torch_fashion_mnist.py --backend ddp   # the baseline
    tiderun -np 2 python3 examples/torch_fashion_mnist.py --device cuda --compression hitopk:0.01

--backend tide (default) wraps torch.optim.SGD in tide.torch.DistributedOptimizer;
--adapt LIST trains through tide's step API instead (tide.torch.Trainer: the
policies change the batch and learning rate); --backend ddp runs torch's
DistributedDataParallel over gloo with everything else the same, for
comparison (scripts/bench-torch.sh). Prints a line per epoch, the final
accuracy, and (--json) one JSON line with the figures.
"""
import argparse
import gzip
import json
import math
import os
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

MEAN, STD = 0.2860, 0.3530  # the data set's, as src/nn/fashion.c


def load(data, kind, limit):
    with gzip.open(os.path.join(data, "%s-images-idx3-ubyte.gz" % kind)) as f:
        images = np.frombuffer(f.read(), dtype=np.uint8, offset=16).reshape(-1, 1, 28, 28)
    with gzip.open(os.path.join(data, "%s-labels-idx1-ubyte.gz" % kind)) as f:
        labels = np.frombuffer(f.read(), dtype=np.uint8, offset=8)
    if limit:
        images, labels = images[:limit], labels[:limit]
    x = (torch.from_numpy(images.astype(np.float32)) / 255.0 - MEAN) / STD
    return x, torch.from_numpy(labels.astype(np.int64))


def make_model(name):
    if name == "mlp":  # flatten,dense:256,relu,dense:128,relu,dense:10
        return nn.Sequential(nn.Flatten(), nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(),
                             nn.Linear(128, 10))
    # conv:32:3:1,relu,pool,conv:64:3:1,relu,pool,flatten,dense:128,relu,dense:10
    return nn.Sequential(nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                         nn.Linear(64 * 7 * 7, 128), nn.ReLU(), nn.Linear(128, 10))


def threads_for_rank():
    """The same rule for every backend: the CPUs this process may use (its
    share when tiderun binds it), divided by the local ranks when unbound."""
    cpus = len(os.sched_getaffinity(0))
    if os.environ.get("TIDE_CPUS", "unbound") == "unbound":
        cpus //= max(1, int(os.environ.get("TIDE_LOCAL_SIZE", os.environ.get("OMPI_COMM_WORLD_LOCAL_SIZE", "1"))))
    return max(1, cpus)


class Backend:
    """What differs between tide.torch and torch.distributed: four calls."""

    def __init__(self, name):
        self.name = name
        if name == "tide":
            import tide.torch as tt
            self.tt = tt
            tt.init()
            self.rank, self.size = tt.rank(), tt.size()
        else:
            import torch.distributed as dist
            self.dist = dist
            self.rank = int(os.environ.get("TIDE_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0")))
            self.size = int(os.environ.get("TIDE_SIZE", os.environ.get("OMPI_COMM_WORLD_SIZE", "1")))
            host, port = os.environ.get("TIDE_RDZV", "127.0.0.1:29400").rsplit(":", 1)
            port = int(os.environ.get("TIDE_DDP_PORT", int(port) + 1))
            dist.init_process_group("gloo", init_method="tcp://%s:%d" % (host, port), rank=self.rank,
                                    world_size=self.size)

    def sum(self, values):
        t = torch.tensor(values, dtype=torch.float64)
        if self.name == "tide":
            return self.tt.allreduce(t, op=self.tt.Sum)
        self.dist.all_reduce(t)
        return t

    def broadcast_model(self, model):
        if self.name == "tide":
            self.tt.broadcast_parameters(model.state_dict(), root_rank=0)
        # DDP broadcasts rank 0's parameters when it wraps the model

    def close(self):
        if self.name == "ddp":
            self.dist.barrier()
            self.dist.destroy_process_group()

    def log(self, *a):
        if self.rank == 0:
            print(*a, flush=True)


def evaluate(backend, model, x, y, device):
    model.eval()
    correct = 0
    with torch.no_grad():
        xs, ys = x[backend.rank::backend.size], y[backend.rank::backend.size]
        for i in range(0, len(xs), 1000):
            out = model(xs[i:i + 1000].to(device)).argmax(1).cpu()
            correct += (out == ys[i:i + 1000]).sum().item()
    model.train()
    return backend.sum([correct])[0].item() / len(x)


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", choices=["mlp", "cnn"], default="mlp")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                   help="where the model trains (cuda: the rank's GPU, local rank modulo the GPUs)")
    p.add_argument("--backend", choices=["tide", "ddp"], default="tide")
    p.add_argument("--epochs", type=float, default=5)
    p.add_argument("--batch", type=int, default=64, help="samples per rank per step")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--weight-decay", type=float, default=5e-4)
    p.add_argument("--schedule", choices=["cosine", "constant"], default="cosine")
    p.add_argument("--compression", default="none", help="none, topk:DENSITY or hitopk:DENSITY (tide)")
    p.add_argument("--sparse-warmup-epochs", type=float, default=0,
                   help="density warm-up of --compression over the first N epochs (Compression's warmup_steps)")
    p.add_argument("--op", choices=["average", "adasum"], default="average")
    p.add_argument("--adapt", default=None, help="policies of tide's step API, e.g. gns,adascale (tide)")
    p.add_argument("--bucket-kb", type=int, default=1024, help="tide's allreduce bucket size")
    p.add_argument("--report-overlap", action="store_true", help="measure the share of the exchange backward hides")
    p.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--subset", type=int, default=0, help="train on the first N samples only")
    p.add_argument("--test-subset", type=int, default=0)
    p.add_argument("--target-accuracy", type=float, default=0.0)
    p.add_argument("--eval-every", type=int, default=0, help="also evaluate every N steps")
    p.add_argument("--threads", type=int, default=0, help="torch threads (default: this rank's CPUs)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", action="store_true", help="print one JSON line with the figures at the end")
    return p.parse_args()


def main():
    args = parse_args()
    torch.set_num_threads(args.threads or threads_for_rank())
    torch.manual_seed(args.seed)
    if not os.path.exists(os.path.join(args.data, "train-images-idx3-ubyte.gz")):
        sys.exit("torch_fashion_mnist: no Fashion-MNIST in %s (apt-get install dataset-fashion-mnist)" % args.data)
    backend = Backend(args.backend)
    x, y = load(args.data, "train", args.subset)
    tx, ty = load(args.data, "t10k", args.test_subset)
    device = torch.device("cpu")
    if args.device == "cuda" and args.adapt:
        sys.exit("torch_fashion_mnist: --adapt trains through tide's step API, on CPU tensors: use --device cpu")
    if args.device == "cuda":
        if not torch.cuda.is_available():
            sys.exit("torch_fashion_mnist: --device cuda but torch sees no CUDA device")
        local = int(os.environ.get("TIDE_LOCAL_RANK", os.environ.get("OMPI_COMM_WORLD_LOCAL_RANK", "0")))
        device = torch.device("cuda", local % torch.cuda.device_count())
        torch.cuda.set_device(device)
    args.torch_device = device
    model = make_model(args.model).to(device)
    backend.broadcast_model(model)
    global_batch = args.batch * backend.size
    steps_per_epoch = len(x) // global_batch
    total_steps = max(1, int(args.epochs * steps_per_epoch))
    backend.log("torch_fashion_mnist: %s on %s, %s, %d ranks x batch %d, %d threads each, %d steps, compression %s%s"
                % (args.model, device, args.backend, backend.size, args.batch, torch.get_num_threads(), total_steps,
                   args.compression, ", adapt " + args.adapt if args.adapt else ""))
    state = {"train_s": 0.0, "images": 0, "target_s": None, "evals": []}

    def record(step, epoch_f, loss):
        acc = evaluate(backend, model, tx, ty, device)
        state["evals"].append({"step": step, "epoch": round(epoch_f, 3), "accuracy": acc, "time_s": state["train_s"]})
        if args.target_accuracy and state["target_s"] is None and acc >= args.target_accuracy:
            state["target_s"] = state["train_s"]
        backend.log("step %d epoch %.2f: loss %.4f, test accuracy %.4f, %.0f images/s, %.1f s" %
                    (step, epoch_f, loss, acc, state["images"] / max(state["train_s"], 1e-9), state["train_s"]))
        return acc

    opt = None
    if args.adapt:
        if args.backend != "tide":
            sys.exit("torch_fashion_mnist: --adapt needs --backend tide")
        run_trainer(args, backend, model, x, y, state, record)
    else:
        opt = run_optimizer(args, backend, model, x, y, state, record, steps_per_epoch, total_steps)
    acc = state["evals"][-1]["accuracy"]
    result = {"model": args.model, "device": args.device, "backend": args.backend, "ranks": backend.size, "batch": args.batch,
              "threads": torch.get_num_threads(), "compression": args.compression,
              "sparse_warmup_epochs": args.sparse_warmup_epochs if args.compression != "none" else 0, "op": args.op,
              "adapt": args.adapt or "", "final_accuracy": acc, "train_s": round(state["train_s"], 3),
              "images_per_s": round(state["images"] / state["train_s"], 1),
              "time_to_target_s": state["target_s"], "target_accuracy": args.target_accuracy}
    if opt is not None and hasattr(opt, "overlap_report") and args.report_overlap:
        rep = opt.overlap_report()
        result["overlap"] = {k: (round(v, 6) if isinstance(v, float) else v) for k, v in rep.items()}
        backend.log("overlap: step() waited %.2f ms per step for the exchange; the exchange alone takes %.2f ms: "
                    "%.0f%% hidden behind backward (%d buckets)" % (1e3 * rep["wait_mean_s"], 1e3 * rep["probe_mean_s"],
                                                                    100 * rep["hidden_share"], rep["buckets"]))
    backend.log("final: %s %s, %d ranks, test accuracy %.4f, %.0f images/s, %.1f s training%s" %
                (args.model, args.backend, backend.size, acc, result["images_per_s"], state["train_s"],
                 ", %.0f%% reached at %.1f s" % (100 * args.target_accuracy, state["target_s"])
                 if state["target_s"] is not None else ""))
    if args.json:
        backend.log(json.dumps(result))
    backend.close()


def run_optimizer(args, backend, model, x, y, state, record, steps_per_epoch, total_steps):
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum, weight_decay=args.weight_decay)
    if args.backend == "tide":
        tt = backend.tt
        kind, _, density = args.compression.partition(":")
        warmup = int(args.sparse_warmup_epochs * steps_per_epoch)
        compression = {"none": lambda: tt.Compression.none,
                       "topk": lambda: tt.Compression.topk(float(density), warmup_steps=warmup),
                       "hitopk": lambda: tt.Compression.hitopk(float(density), warmup_steps=warmup)}[kind]()
        opt = tt.DistributedOptimizer(opt, named_parameters=model.named_parameters(), compression=compression,
                                      op=tt.Adasum if args.op == "adasum" else tt.Average,
                                      bucket_bytes=args.bucket_kb * 1024, measure_overlap=args.report_overlap)
        tt.broadcast_optimizer_state(opt, root_rank=0)
        net = model
    else:
        if args.compression != "none" or args.op != "average":
            sys.exit("torch_fashion_mnist: --compression and --op are tide's")
        net = torch.nn.parallel.DistributedDataParallel(model)
    step = 0
    g = torch.Generator()
    loss_v = float("nan")
    while step < total_steps:
        epoch = step // steps_per_epoch
        g.manual_seed(args.seed * 1000003 + epoch)
        perm = torch.randperm(len(x), generator=g)
        mine = perm[backend.rank::backend.size]
        for i in range(steps_per_epoch):
            if step >= total_steps:
                break
            if args.schedule == "cosine":
                for group in opt.param_groups:
                    group["lr"] = args.lr * 0.5 * (1 + math.cos(math.pi * step / total_steps))
            t0 = time.perf_counter()
            idx = mine[i * args.batch:(i + 1) * args.batch]
            opt.zero_grad()
            loss = F.cross_entropy(net(x[idx].to(args.torch_device)), y[idx].to(args.torch_device))
            loss.backward()
            opt.step()
            state["train_s"] += time.perf_counter() - t0
            state["images"] += args.batch * backend.size
            step += 1
            loss_v = loss.item()
            if args.eval_every and step % args.eval_every == 0 and step < total_steps:
                record(step, step / steps_per_epoch, loss_v)
        if step < total_steps:
            record(step, step / steps_per_epoch, loss_v)
    record(step, step / steps_per_epoch, loss_v)
    return opt


def run_trainer(args, backend, model, x, y, state, record):
    """The same training through tide's step API: the trainer deals the
    samples, exchanges, adapts (args.adapt) and applies the optimizer."""
    tt = backend.tt
    kind, _, density = args.compression.partition(":")
    trainer = tt.Trainer(model, dataset_size=len(x), batch=args.batch, epochs=args.epochs, optimizer="momentum",
                         lr=args.lr, momentum=args.momentum, weight_decay=args.weight_decay, schedule=args.schedule,
                         exchange="dense" if kind == "none" else kind, density=float(density or 0.01),
                         adapt=args.adapt, max_batch=max(args.batch, 256), seed=args.seed)
    t0 = time.perf_counter()
    loss_v = float("nan")
    last_epoch = 0
    for batch in trainer:
        loss = 0.0
        if batch.count:
            loss = F.cross_entropy(model(x[batch.indices]), y[batch.indices])
            loss.backward()
        s = trainer.step(loss)
        if s.stepped:
            state["train_s"] += time.perf_counter() - t0
            state["images"] += s.global_batch
            loss_v = s.loss
            if s.step % 50 == 0:
                backend.log("step %d: global batch %d, lr %.4f (gain ratio %.2f), noise scale %.0f, comm share %.2f"
                            % (s.step, s.global_batch, s.lr, s.gain_ratio, s.noise_scale, s.comm_share))
            if args.eval_every and s.step % args.eval_every == 0:
                record(s.step, s.epochs_done, loss_v)
            elif int(s.epochs_done) > last_epoch and not s.done:
                record(s.step, s.epochs_done, loss_v)
            last_epoch = int(s.epochs_done)
            t0 = time.perf_counter()
    s = trainer.stats
    record(s.step, s.epochs_done, loss_v)
    trainer.close()


if __name__ == "__main__":
    main()
