"""tide.torch: PyTorch on tide, shaped like Horovod's horovod.torch.

    import tide.torch as tt
    tt.init()
    tt.broadcast_parameters(model.state_dict(), root_rank=0)
    opt = tt.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                  compression=tt.Compression.hitopk(0.01))
    tt.broadcast_optimizer_state(opt, root_rank=0)

Parameters and tensors may be on the CPU or on a CUDA GPU (staged through
pinned host memory; top-k compression selects on the GPU).

Launch with `tiderun -np 4 python3 train.py` (or mpirun, srun); an elastic
script (tide.torch.elastic) with `tiderun --elastic`. docs/torch.md.
"""
from .._lib import (TideError, InvalidArgumentError, PeerError, MismatchError, TideTimeoutError,  # noqa: F401
                    AbortedError)
from ._comm import (shutdown, is_initialized, rank, size, local_rank, local_size, cross_rank,  # noqa: F401
                    cross_size, compute_threads, comm_handle, Sum, Average, Min, Max, Adasum, Handle,
                    synchronize, poll, broadcast_parameters, broadcast_optimizer_state)
from ._optimizer import Compression, DistributedOptimizer  # noqa: F401
# horovod.torch's collectives, matched by name (python/tide/torch/_controller.py)
from ._horovod import (init, Product, allreduce, allreduce_, allreduce_async, allreduce_async_,  # noqa: F401
                       grouped_allreduce, grouped_allreduce_, grouped_allreduce_async, grouped_allreduce_async_,
                       allgather, allgather_async, grouped_allgather, grouped_allgather_async, broadcast,
                       broadcast_, broadcast_async, broadcast_async_, broadcast_object, allgather_object,
                       alltoall, alltoall_async, reducescatter, reducescatter_async, grouped_reducescatter,
                       grouped_reducescatter_async, sparse_allreduce_async, barrier, join, ProcessSet,
                       global_process_set, add_process_set, remove_process_set, HorovodInternalError,
                       mpi_built, mpi_enabled, gloo_built, gloo_enabled, nccl_built, ddl_built, ccl_built,
                       cuda_built, rocm_built, mpi_threads_supported)
from ._controller import negotiation_stats  # noqa: F401
from ._sync_batch_norm import SyncBatchNorm  # noqa: F401
from ._select import topk, gpu_available  # noqa: F401
from ._trainer import Trainer, StepStats, Batch, gns_estimate, adascale_gain  # noqa: F401
# Horovod Elastic (hvd.elastic.run, TorchState) on tide's in-place membership
from . import elastic  # noqa: E402,F401
from .elastic import HostsUpdatedInterrupt  # noqa: E402,F401
