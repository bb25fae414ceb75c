"""deepspeed.runtime.utils: set_random_seed."""
import random

import numpy
import torch

__all__ = ['set_random_seed']


def set_random_seed(seed):
    """Seeds Python's ``random``, NumPy's global generator and torch's (DeepSpeed's
    ``set_random_seed``), so that a script's data and initial weights repeat run to run."""
    random.seed(seed)
    numpy.random.seed(seed)
    torch.manual_seed(seed)
