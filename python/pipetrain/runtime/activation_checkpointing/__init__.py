"""deepspeed.runtime.activation_checkpointing: its ``checkpointing`` submodule is
pipetrain.checkpointing itself (one module, one configured state, as deepspeed.checkpointing is)."""
import sys

from ... import checkpointing

# `from deepspeed.runtime.activation_checkpointing.checkpointing import checkpoint` finds it here.
sys.modules[f'{__name__}.checkpointing'] = checkpointing

__all__ = ['checkpointing']
