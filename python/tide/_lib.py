"""ctypes view of libtide: the library, the prototypes this package calls,
the mirrored structs, and tide's errors as Python exceptions.

Why ctypes and not a C extension: docs/torch.md. The structs below mirror
include/tide.h field by field; test/torch/test_abi.py checks their sizes and
offsets against the C compiler's (test/torch_abi.c), so a field added to the
header without its mirror here fails a test instead of corrupting memory.
"""
import ctypes
import ctypes.util
import os

# ---- errors ------------------------------------------------------------------


class TideError(RuntimeError):
    """A call into libtide failed. code is the negative TIDE_E* value, name
    its name ("TIDE_EPEER"), message tide's own explanation (for a failed
    communicator, tide_comm_last_error: it names the ranks involved)."""

    def __init__(self, code, name, message, call=""):
        self.code = code
        self.name = name
        self.message = message
        self.call = call
        prefix = call + ": " if call else ""
        super().__init__("%s%s: %s" % (prefix, name, message))


class InvalidArgumentError(TideError, ValueError):
    """TIDE_EINVAL."""


class PeerError(TideError):
    """TIDE_EPEER: a peer failed or disconnected; the communicator is unusable."""


class MismatchError(TideError):
    """TIDE_EMISMATCH: the ranks called different collectives (or sizes)."""


class TideTimeoutError(TideError, TimeoutError):
    """TIDE_ETIMEDOUT: a peer did not answer within TIDE_TIMEOUT_MS."""


class AbortedError(TideError):
    """TIDE_EABORTED."""


_ERRNO = {"TIDE_EINVAL": InvalidArgumentError, "TIDE_EPEER": PeerError,
          "TIDE_EMISMATCH": MismatchError, "TIDE_ETIMEDOUT": TideTimeoutError,
          "TIDE_EABORTED": AbortedError}

# ---- the library -------------------------------------------------------------


def _library_path():
    """TIDE_LIBRARY, else the libtide next to an installed package (written
    by `make install` into _install.py, relative to this file), else the
    system's (ldconfig)."""
    env = os.environ.get("TIDE_LIBRARY")
    if env:
        return env
    try:
        from . import _install  # generated at install time
        path = os.path.normpath(os.path.join(os.path.dirname(__file__), _install.LIBRARY))
        if os.path.exists(path):
            return path
    except ImportError:
        pass
    found = ctypes.util.find_library("tide")
    return found or "libtide.so.0"


def _mpi_backend():
    """True when tide_comm_init will join through MPI (TIDE_BACKEND=mpi)."""
    return os.environ.get("TIDE_BACKEND", "").strip().lower() == "mpi"


_LIBRARY = _library_path()
try:
    # RTLD_LOCAL unless the MPI backend needs RTLD_GLOBAL (Open MPI's plugins
    # look up libmpi's symbols globally): global, libtide would also export
    # its dependencies (OpenBLAS) into the process, where torch's BLAS meets them.
    lib = ctypes.CDLL(_LIBRARY, mode=ctypes.RTLD_GLOBAL if _mpi_backend() else ctypes.RTLD_LOCAL)
except OSError as e:
    raise ImportError("tide: cannot load libtide (%s); set TIDE_LIBRARY to the path of libtide.so, "
                      "or install tide (make install)" % e) from None


def load_global_for_mpi():
    """Makes libtide and its dependencies (libmpi) global when TIDE_BACKEND=mpi
    was set after the import: dlopen again with RTLD_GLOBAL promotes the
    loaded library. Called by tide.torch.init before tide_comm_init."""
    if _mpi_backend():
        ctypes.CDLL(_LIBRARY, mode=ctypes.RTLD_GLOBAL)

c_int, c_size_t, c_double, c_void_p, c_char_p = (ctypes.c_int, ctypes.c_size_t, ctypes.c_double,
                                                 ctypes.c_void_p, ctypes.c_char_p)
c_long, c_uint64, c_float, c_int64 = ctypes.c_long, ctypes.c_uint64, ctypes.c_float, ctypes.c_int64
P = ctypes.POINTER

# dtype and op numbers (include/tide.h)
F32, F64, I32, I64, F16, BF16 = range(6)
SUM, AVG, MIN, MAX = range(4)
TOPK_EXACT, TOPK_MSTOPK, TOPK_RANDOMK, TOPK_SAMPLED = range(4)
TOPK_PER_TENSOR, TOPK_GLOBAL = range(2)


class Tensor(ctypes.Structure):
    _fields_ = [("name", c_char_p), ("offset", c_size_t), ("count", c_size_t), ("ndim", c_int),
                ("shape", c_int * 4)]


class OptimConfig(ctypes.Structure):
    _fields_ = [("kind", c_int), ("momentum", c_float), ("beta1", c_float), ("beta2", c_float),
                ("eps", c_float), ("weight_decay", c_float), ("trust_coef", c_float),
                ("exclude_1d", c_int)]


class LrSchedule(ctypes.Structure):
    _fields_ = [("kind", c_int), ("base_lr", c_float), ("warmup_steps", c_long),
                ("warmup_start_factor", c_float), ("total_steps", c_long), ("step_size", c_long),
                ("gamma", c_float), ("power", c_float), ("final_lr", c_float)]


class TrainerConfig(ctypes.Structure):
    _fields_ = [("dataset_size", c_uint64), ("seed", c_uint64), ("batch", c_int), ("max_batch", c_int),
                ("max_accum", c_int), ("base_batch", c_long), ("epochs", c_double),
                ("optim", OptimConfig), ("schedule", LrSchedule), ("exchange", c_int),
                ("density", c_double), ("selector", c_int), ("sparse_warmup_epochs", c_double),
                ("gns_decay", c_double), ("tensor_stats", c_int), ("pto", c_int)]


class Batch(ctypes.Structure):
    _fields_ = [("indices", P(c_uint64)), ("count", c_size_t), ("micro", c_int), ("micro_count", c_int),
                ("epoch", c_uint64), ("step", c_long), ("done", c_int)]


class StepStats(ctypes.Structure):
    _fields_ = [("stepped", c_int), ("step", c_long), ("progress", c_double), ("epochs_done", c_double),
                ("epoch", c_uint64), ("epoch_end", c_int), ("done", c_int), ("global_batch", c_long),
                ("planned_batch", c_long), ("batch", c_int), ("accum", c_int), ("ranks", c_int),
                ("nodes", c_int), ("exchange", c_int), ("loss", c_double), ("lr", c_double),
                ("lr_factor", c_double), ("gain", c_double), ("scale", c_double), ("grad_sq", c_double),
                ("trace_sigma", c_double), ("noise_scale", c_double), ("gain_ratio", c_double),
                ("compute_s", c_double), ("exchange_s", c_double), ("optim_s", c_double),
                ("step_s", c_double), ("compute_min_s", c_double), ("compute_median_s", c_double),
                ("compute_max_s", c_double), ("slowest_rank", c_int), ("comm_share", c_double),
                ("mean_step_s", c_double), ("throughput", c_double), ("kfac_s", c_double),
                ("data_s", c_double),
                # multiplexing (docs/elastic.md)
                ("paused_s", c_double), ("pauses", c_long), ("solo_step_s", c_double),
                ("background_jobs", c_int)]


class TopkOpts(ctypes.Structure):
    _fields_ = [("seed", c_uint64), ("mstopk_rounds", c_int), ("num_threads", c_int)]


class TopkStats(ctypes.Structure):
    _fields_ = [("threshold", c_float), ("t1", c_float), ("t2", c_float), ("full_passes", ctypes.c_uint32),
                ("candidates", c_uint64), ("fallback", c_int), ("threads", c_int)]


# Mirrored structs, for the ABI test: name in tide.h -> ctypes class.
class DataSummary(ctypes.Structure):
    _fields_ = [("images", c_size_t), ("classes", c_size_t), ("shards", c_size_t), ("bytes", c_uint64)]


class DataCacheStats(ctypes.Structure):
    _fields_ = [("entries", c_size_t), ("bytes", c_uint64), ("bound_bytes", c_uint64), ("hits", c_uint64),
                ("misses", c_uint64), ("refetched", c_uint64), ("evicted", c_uint64), ("bytes_served", c_uint64),
                ("bytes_fetched", c_uint64)]


STRUCTS = {"tide_data_summary_t": DataSummary, "tide_data_cache_stats_t": DataCacheStats,
           "tide_topk_opts_t": TopkOpts, "tide_topk_stats_t": TopkStats, "tide_tensor_t": Tensor, "tide_optim_config_t": OptimConfig, "tide_lr_schedule_t": LrSchedule,
           "tide_trainer_config_t": TrainerConfig, "tide_batch_t": Batch, "tide_step_stats_t": StepStats}

_PROTOS = {
    "tide_strerror": (c_char_p, [c_int]),
    "tide_err_name": (c_char_p, [c_int]),
    "tide_comm_init": (c_int, [P(c_void_p)]),
    "tide_comm_destroy": (None, [c_void_p]),
    "tide_comm_rank": (c_int, [c_void_p]),
    "tide_comm_size": (c_int, [c_void_p]),
    "tide_comm_local_rank": (c_int, [c_void_p]),
    "tide_comm_local_size": (c_int, [c_void_p]),
    "tide_comm_node": (c_int, [c_void_p]),
    "tide_comm_node_count": (c_int, [c_void_p]),
    "tide_comm_last_error": (c_char_p, [c_void_p]),
    "tide_compute_threads": (c_int, [c_void_p, P(c_int)]),
    "tide_barrier": (c_int, [c_void_p]),
    "tide_broadcast": (c_int, [c_void_p, c_void_p, c_size_t, c_int, c_int]),
    "tide_allreduce": (c_int, [c_void_p, c_void_p, c_void_p, c_size_t, c_int, c_int]),
    "tide_allgather": (c_int, [c_void_p, c_void_p, c_void_p, c_size_t, c_int]),
    "tide_allgatherv": (c_int, [c_void_p, c_void_p, c_size_t, c_void_p, P(c_size_t), c_int]),
    "tide_ibroadcast": (c_int, [c_void_p, c_void_p, c_size_t, c_int, c_int, P(c_void_p)]),
    "tide_iallreduce": (c_int, [c_void_p, c_void_p, c_void_p, c_size_t, c_int, c_int, P(c_void_p)]),
    "tide_iallgather": (c_int, [c_void_p, c_void_p, c_void_p, c_size_t, c_int, P(c_void_p)]),
    "tide_iallgatherv": (c_int, [c_void_p, c_void_p, c_size_t, c_void_p, P(c_size_t), c_int, P(c_void_p)]),
    "tide_adasum_allreduce": (c_int, [c_void_p, c_void_p, c_void_p, c_size_t, c_int, P(Tensor), c_size_t]),
    "tide_iadasum_allreduce": (c_int, [c_void_p, c_void_p, c_void_p, c_size_t, c_int, P(Tensor), c_size_t,
                                       P(c_void_p)]),
    "tide_wait": (c_int, [c_void_p]),
    "tide_test": (c_int, [c_void_p, P(c_int)]),
    "tide_compressor_create": (c_int, [c_int, c_double, c_int, P(Tensor), c_size_t, c_size_t, c_void_p,
                                       P(c_void_p)]),
    "tide_compressor_k": (c_size_t, [c_void_p]),
    "tide_compressor_set_density": (c_int, [c_void_p, c_double]),
    "tide_compressor_compress": (c_int, [c_void_p, c_void_p, c_size_t, c_void_p, c_void_p, P(c_size_t)]),
    "tide_compressor_last_error": (c_char_p, [c_void_p]),
    "tide_compressor_destroy": (None, [c_void_p]),
    "tide_compressor_create_gpu": (c_int, [c_int, c_double, c_size_t, c_void_p, c_void_p, P(c_void_p)]),
    "tide_gpu_available": (c_int, [c_char_p, c_size_t]),
    "tide_gpu_device_name": (c_int, [c_char_p, c_size_t]),
    "tide_topk_select_opts": (c_int, [c_int, P(TopkOpts), c_void_p, c_size_t, c_size_t, c_char_p, c_void_p,
                                      c_void_p, P(TopkStats)]),
    "tide_gpu_topk_select": (c_int, [c_int, P(TopkOpts), c_void_p, c_int, c_size_t, c_size_t, c_char_p, c_void_p,
                                     c_void_p, c_int, c_void_p, P(TopkStats)]),
    "tide_sparse_allgather": (c_int, [c_void_p, c_void_p, c_void_p, c_size_t, c_void_p, c_size_t, c_int]),
    "tide_hitopk_shard": (c_int, [c_void_p, c_size_t, P(c_size_t), P(c_size_t)]),
    "tide_hitopk_allreduce": (c_int, [c_void_p, c_void_p, c_void_p, c_size_t, c_void_p, c_int]),
    "tide_gns_estimate": (c_int, [c_double, c_double, c_double, c_double, P(c_double), P(c_double)]),
    "tide_adascale_gain": (c_double, [c_double, c_double, c_double]),
    "tide_optim_parse": (c_int, [c_char_p, P(c_int)]),
    "tide_optim_config_default": (None, [c_int, P(OptimConfig)]),
    "tide_lr_parse": (c_int, [c_char_p, P(c_int)]),
    "tide_lr_schedule_from_epochs": (c_int, [c_int, c_float, c_float, c_double, c_double, c_size_t, c_long,
                                             P(LrSchedule)]),
    "tide_lr_at": (c_float, [P(LrSchedule), c_long]),
    "tide_data_export": (c_int, [c_char_p, c_char_p, c_char_p, c_char_p, c_long, c_uint64, P(DataSummary)]),
    "tide_data_index": (c_int, [c_char_p, c_uint64, c_char_p, P(DataSummary)]),
    "tide_data_cache_dir": (c_int, [c_char_p, c_size_t]),
    "tide_data_cache_stats": (c_int, [c_char_p, P(DataCacheStats)]),
    "tide_trainer_base_batch": (c_int, [c_void_p, c_int, P(c_long)]),
    "tide_replica_checksum": (c_int, [c_void_p, c_void_p, c_size_t, P(c_uint64), P(c_int)]),
    "tide_exchange_parse": (c_int, [c_char_p, P(c_int)]),
    "tide_exchange_name": (c_char_p, [c_int]),
    "tide_topk_parse": (c_int, [c_char_p, P(c_int)]),
    "tide_trainer_config_default": (None, [P(TrainerConfig)]),
    "tide_trainer_create": (c_int, [c_void_p, P(TrainerConfig), c_void_p, c_void_p, c_size_t, P(Tensor),
                                    c_size_t, P(c_void_p)]),
    "tide_trainer_destroy": (None, [c_void_p]),
    "tide_trainer_next": (c_int, [c_void_p, P(Batch)]),
    "tide_trainer_step": (c_int, [c_void_p, c_double, P(StepStats)]),
    "tide_trainer_stats": (P(StepStats), [c_void_p]),
    "tide_trainer_last_error": (c_char_p, [c_void_p]),
    "tide_trainer_adapt": (c_int, [c_void_p, c_char_p]),
    # elastic membership (tide.torch.elastic)
    "tide_comm_epoch": (c_long, [c_void_p]),
    "tide_comm_joined": (c_int, [c_void_p]),
    "tide_comm_resize": (c_int, [c_void_p, c_int, c_int, P(c_void_p)]),
    "tide_comm_elastic_status": (c_int, [c_void_p, P(c_int), P(c_int)]),
    "tide_comm_elastic_request": (c_int, [c_void_p, c_int]),
    "tide_comm_elastic_finish": (c_int, [c_void_p]),
    "tide_param_get": (c_int, [c_char_p, P(c_char_p), P(c_int64)]),
}
for _name, (_res, _args) in _PROTOS.items():
    _fn = getattr(lib, _name)
    _fn.restype = _res
    _fn.argtypes = _args


def error(rc, message=None, call=""):
    """The exception for return code rc (< 0): tide's message when given
    (a communicator's last error), else the code's own."""
    name = lib.tide_err_name(rc).decode()
    if not message:
        message = lib.tide_strerror(rc).decode()
    return _ERRNO.get(name, TideError)(rc, name, message, call)


def comm_error(comm, rc, call=""):
    msg = lib.tide_comm_last_error(comm) if comm else None
    return error(rc, msg.decode(errors="replace") if msg else None, call)


def check(rc, call=""):
    if rc < 0:
        raise error(rc, None, call)
    return rc
