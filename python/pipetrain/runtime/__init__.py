"""deepspeed.runtime: the paths DeepSpeed scripts import from (runtime.utils, runtime.pipe,
runtime.activation_checkpointing), over pipetrain's own modules."""
import importlib

from . import utils

__all__ = ['utils', 'pipe', 'activation_checkpointing']


def __getattr__(name):
    # The pipeline engine is imported on first use; importlib rather than `from . import`, which
    # would ask this module for the attribute again and recurse.
    if name in ('pipe', 'activation_checkpointing'):
        return importlib.import_module(f'{__name__}.{name}')
    raise AttributeError(f"module '{__name__}' has no attribute '{name}'")
