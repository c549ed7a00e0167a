"""Learning-rate schedules: tide's own (src/optim/schedule.c) through ctypes,
so the Python Trainer and tide-train compute the same rate at every step
(test/torch/test_schedule.py checks). No torch needed."""
import ctypes

from . import _lib


def lr_schedule(schedule, lr, epochs, dataset_size, base_batch, warmup_epochs=0.0, final_lr=0.0):
    """The schedule (a tide_lr_schedule_t) of `epochs` epochs of progress over
    dataset_size samples at global batch base_batch: schedule is "constant",
    "step", "cosine" or "poly" (tide_lr_schedule_from_epochs in tide.h says how
    each is set). Raises InvalidArgumentError naming a bad argument."""
    lib = _lib.lib
    kind = ctypes.c_int()
    _lib.check(lib.tide_lr_parse(str(schedule).encode(), ctypes.byref(kind)), "schedule %r" % (schedule,))
    out = _lib.LrSchedule()
    _lib.check(lib.tide_lr_schedule_from_epochs(kind.value, float(lr), float(final_lr), float(epochs),
                                                float(warmup_epochs), int(dataset_size), int(base_batch),
                                                ctypes.byref(out)), "tide_lr_schedule_from_epochs")
    return out


def lr_at(schedule, step):
    """The rate of a schedule (from lr_schedule) at step (progress counted in
    base-batch steps), as the trainer applies it; NaN for an invalid one."""
    return _lib.lib.tide_lr_at(ctypes.byref(schedule), int(step))
