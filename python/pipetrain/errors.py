"""pipetrain's exceptions: the native runtime's typed errors as Python classes.

Every error the runtime raises is a ``PipelineError`` (a ``RuntimeError``); those that are about
a bad argument are also the built-in kind a Python user catches for it: ``ConfigError`` is a
``ValueError``, ``BatchError`` a ``TypeError``, ``TimeoutError`` the built-in ``TimeoutError``.
An exception raised by Python code inside the runtime (a layer, the loss, the data iterator)
is not wrapped: it comes out as itself, with its traceback and a note saying where it was raised.
"""
import builtins

__all__ = [
    'PipelineError', 'ConfigError', 'BalanceError', 'DeviceError', 'ModuleError', 'BatchError',
    'ScheduleError', 'CommError', 'TimeoutError', 'PeerError', 'CheckpointError', 'DataError',
    'NumericError', 'UsageError',
]


class PipelineError(RuntimeError):
    """Base class of the errors pipetrain's runtime raises."""


class ConfigError(PipelineError, ValueError):
    """A setting is wrong: an option, a config file's key, a balance."""


class BalanceError(ConfigError):
    """The balance does not fit the model."""


class DeviceError(ConfigError):
    """Too few devices for the partitions, or a device the runtime cannot use."""


class ModuleError(PipelineError, ValueError):
    """The model cannot be pipelined as given (duplicate children, bad skip declarations)."""


class BatchError(PipelineError, TypeError):
    """A value between layers or stages is not a tensor or tuple of tensors, or has a wrong shape."""


class ScheduleError(PipelineError, ValueError):
    """A schedule is malformed or cannot be made for these parameters."""


class CommError(PipelineError):
    """Moving tensors between stages failed."""


class TimeoutError(CommError, builtins.TimeoutError):  # noqa: A001 - named as the runtime's
    """A wait ran past its timeout (a peer hangs, or a layer takes longer than task_timeout)."""


class PeerError(CommError, ConnectionError):
    """Another rank died or closed its connection."""


class CheckpointError(PipelineError):
    """A checkpoint cannot be written or read (missing, truncated, bad checksum, other model)."""


class DataError(PipelineError):
    """The data source is wrong (an item that is not a pair of inputs and labels, say)."""


class NumericError(PipelineError, ArithmeticError):
    """A loss or gradient is NaN or infinite."""


class UsageError(PipelineError):
    """The API was used in a way it does not support (engine.forward instead of train_batch)."""
