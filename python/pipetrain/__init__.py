"""pipetrain: pipeline-parallel training on a native C++ runtime.

torchgpipe's and DeepSpeed's pipeline APIs over pipetrain's LibTorch engine; code written for
either runs by changing its import:

    from pipetrain import GPipe                                  # torchgpipe
    from pipetrain.balance import balance_by_time
    from pipetrain.skip import skippable, stash, pop, Namespace

    import pipetrain as deepspeed                                # DeepSpeed's pipeline engine
    from pipetrain.pipe import PipelineModule, LayerSpec, TiedLayerSpec
"""
import importlib

import torch  # noqa: F401  - the extension needs libtorch_python loaded first

from . import _C
from .checkpoint import is_checkpointing, is_recomputing
from .errors import (BalanceError, BatchError, CheckpointError, CommError, ConfigError, DataError, DeviceError,
                     ModuleError, NumericError, PeerError, PipelineError, ScheduleError, TimeoutError, UsageError)
from .gpipe import GPipe
from . import balance, skip  # noqa: E402

__version__ = _C.__version__

# DeepSpeed's top-level names, each imported on first use from the submodule that holds it, so
# that a torchgpipe user never pays for the DeepSpeed front end. A name mapped to None is the
# submodule itself.
_LAZY = {
    'pipe': None, 'runtime': None, 'utils': None, 'accelerator': None, 'checkpointing': None, 'comm': None,
    'initialize': 'pipe', 'PipelineModule': 'pipe', 'PipelineEngine': 'pipe',
    'add_config_arguments': 'arguments', 'log_dist': 'utils', 'logger': 'utils',
    'get_accelerator': 'accelerator', 'init_distributed': 'comm',
}

__all__ = [
    'GPipe', 'is_checkpointing', 'is_recomputing', 'balance', 'skip',
    'PipelineError', 'ConfigError', 'BalanceError', 'DeviceError', 'ModuleError', 'BatchError', 'ScheduleError',
    'CommError', 'TimeoutError', 'PeerError', 'CheckpointError', 'DataError', 'NumericError', 'UsageError',
    *_LAZY,
]


def _submodule(name):
    # importlib, not `from . import name`: the latter asks this module for the attribute first,
    # which re-enters __getattr__ and recurses until the submodule happens to be imported.
    return importlib.import_module(f'{__name__}.{name}')


def __getattr__(name):
    where = _LAZY.get(name, '')
    if where == '':
        raise AttributeError(f"module 'pipetrain' has no attribute '{name}'")
    if where is None:
        return _submodule(name)
    value = getattr(_submodule(where), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))
