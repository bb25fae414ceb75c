"""Helpers DeepSpeed scripts import from deepspeed.utils."""
from .pipe.engine import RepeatingLoader

__all__ = ['RepeatingLoader']
