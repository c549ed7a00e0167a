"""tide.torch: PyTorch on tide, shaped like Horovod's horovod.torch.

    import tide.torch as tt
    tt.init()
    tt.broadcast_parameters(model.state_dict(), root_rank=0)
    opt = tt.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                  compression=tt.Compression.hitopk(0.01))
    tt.broadcast_optimizer_state(opt, root_rank=0)

Parameters and tensors may be on the CPU or on a CUDA GPU (staged through
pinned host memory; top-k compression selects on the GPU).

Launch with `tiderun -np 4 python3 train.py` (or mpirun, srun). docs/torch.md.
"""
from .._lib import (TideError, InvalidArgumentError, PeerError, MismatchError, TideTimeoutError,  # noqa: F401
                    AbortedError)
from ._comm import (init, shutdown, is_initialized, rank, size, local_rank, local_size, cross_rank,  # noqa: F401
                    cross_size, compute_threads, comm_handle, Sum, Average, Min, Max, Adasum, Handle,
                    allreduce, allreduce_, allreduce_async, allreduce_async_, synchronize, poll, allgather,
                    broadcast, broadcast_, broadcast_async_, barrier, broadcast_parameters, broadcast_object,
                    broadcast_optimizer_state)
from ._optimizer import Compression, DistributedOptimizer  # noqa: F401
# horovod.torch's signatures (they replace _comm's simpler forms of the same names)
from ._horovod import (allreduce, allreduce_, allreduce_async, allreduce_async_, grouped_allreduce,  # noqa: F401
                       grouped_allreduce_, grouped_allreduce_async, grouped_allreduce_async_, allgather,
                       broadcast, broadcast_async, reducescatter, alltoall, allgather_object, mpi_built, mpi_enabled, gloo_built,
                       gloo_enabled, nccl_built, ddl_built, ccl_built, cuda_built, rocm_built,
                       mpi_threads_supported)
from ._select import topk, gpu_available  # noqa: F401
from ._trainer import Trainer, StepStats, Batch, gns_estimate, adascale_gain  # noqa: F401
