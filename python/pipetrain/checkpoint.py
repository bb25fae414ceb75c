"""Which phase of activation checkpointing the current forward runs in."""
from ._C import is_checkpointing, is_recomputing

__all__ = ['is_checkpointing', 'is_recomputing']
