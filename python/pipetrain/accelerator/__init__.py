"""deepspeed.accelerator: get_accelerator() and set_accelerator().

The accelerator is CUDA when torch sees a GPU, else the CPU; DS_ACCELERATOR=cpu or =cuda chooses
it, as in DeepSpeed (its other accelerators, xpu, npu, mps, hpu, are not part of pipetrain).
"""
import os

import torch

from ..errors import ConfigError
from .accelerators import CPU_Accelerator, CUDA_Accelerator

__all__ = ['get_accelerator', 'set_accelerator', 'CPU_Accelerator', 'CUDA_Accelerator']

_accelerator = None


def _choose():
    name = os.environ.get('DS_ACCELERATOR')
    if name is None:
        return CUDA_Accelerator() if torch.cuda.is_available() else CPU_Accelerator()
    if name == 'cpu':
        return CPU_Accelerator()
    if name == 'cuda':
        if not torch.cuda.is_available():
            raise ConfigError('DS_ACCELERATOR=cuda but torch sees no CUDA device; unset DS_ACCELERATOR or set it '
                              'to cpu')
        return CUDA_Accelerator()
    raise ConfigError(f"DS_ACCELERATOR={name!r}: pipetrain has the 'cpu' and 'cuda' accelerators; set one of "
                      'them or unset it')


def get_accelerator():
    """The accelerator of this process, chosen on first call and the same object afterwards."""
    global _accelerator  # pylint: disable=global-statement
    if _accelerator is None:
        _accelerator = _choose()
    return _accelerator


def set_accelerator(accel_obj):
    """Makes ``accel_obj`` the one get_accelerator() returns (DeepSpeed's)."""
    global _accelerator  # pylint: disable=global-statement
    _accelerator = accel_obj
