"""pipetrain: pipeline-parallel training on a native C++ runtime.

torchgpipe's and DeepSpeed's pipeline APIs over pipetrain's LibTorch engine; code written for
either runs by changing its import:

    from pipetrain import GPipe                                  # torchgpipe
    from pipetrain.balance import balance_by_time
    from pipetrain.skip import skippable, stash, pop, Namespace

    import pipetrain as deepspeed                                # DeepSpeed's pipeline engine
    from pipetrain.pipe import PipelineModule, LayerSpec, TiedLayerSpec
"""
import torch  # noqa: F401  - the extension needs libtorch_python loaded first

from . import _C
from .checkpoint import is_checkpointing, is_recomputing
from .errors import (BalanceError, BatchError, CheckpointError, CommError, ConfigError, DataError, DeviceError,
                     ModuleError, NumericError, PeerError, PipelineError, ScheduleError, TimeoutError, UsageError)
from .gpipe import GPipe
from . import balance, skip  # noqa: E402

__version__ = _C.__version__

__all__ = [
    'GPipe', 'is_checkpointing', 'is_recomputing', 'balance', 'skip', 'pipe', 'initialize', 'init_distributed',
    'PipelineError', 'ConfigError', 'BalanceError', 'DeviceError', 'ModuleError', 'BatchError', 'ScheduleError',
    'CommError', 'TimeoutError', 'PeerError', 'CheckpointError', 'DataError', 'NumericError', 'UsageError',
]


def __getattr__(name):
    # The DeepSpeed front end is imported on first use: a torchgpipe user never pays for it.
    if name in ('pipe', 'initialize', 'init_distributed'):
        from . import pipe
        return pipe if name == 'pipe' else getattr(pipe, name)
    raise AttributeError(f"module 'pipetrain' has no attribute '{name}'")
