"""deepspeed.checkpointing: activation checkpointing for a script's own blocks (checkpoint,
configure, is_configured, reset, model_parallel_cuda_manual_seed).

``checkpoint(function, *args)`` keeps only the block's inputs in the forward pass and runs it
again in the backward pass with the random state of the first run (dropout draws the same
masks). pipetrain's layers checkpoint themselves through PipelineModule's
``activation_checkpoint_interval``; this module is for the blocks a script checkpoints by hand.
"""
import json
import os
import warnings

import torch
import torch.utils.checkpoint

from .errors import ConfigError

__all__ = ['checkpoint', 'configure', 'is_configured', 'reset', 'model_parallel_cuda_manual_seed']

_configured = False
# The settings configure() accepted, for a script that reads them back.
settings = {'partition_activations': False, 'contiguous_checkpointing': False, 'num_checkpoints': None,
            'checkpoint_in_cpu': False, 'synchronize': False, 'profile': False}

# configure()'s arguments under their names in the config's "activation_checkpointing" block.
_CONFIG_KEYS = {'partition_activations': 'partition_activations',
                'contiguous_checkpointing': 'contiguous_memory_optimization',
                'num_checkpoints': 'number_checkpoints', 'checkpoint_in_cpu': 'cpu_checkpointing',
                'synchronize': 'synchronize_checkpoint_boundary', 'profile': 'profile'}

# What each setting would do in DeepSpeed, and why pipetrain's result is the same without it.
_NOT_HONOURED = {
    'partition_activations': 'splits the saved inputs across model-parallel ranks; pipetrain has no '
                             'tensor parallelism in Python, each rank keeps its inputs whole',
    'contiguous_checkpointing': 'copies the saved inputs into one preallocated buffer; they stay separate tensors',
    'num_checkpoints': 'sizes the contiguous buffer, which pipetrain does not make',
    'checkpoint_in_cpu': 'moves the saved inputs to host memory; they stay on their device',
    'synchronize': 'synchronises the device around each checkpoint; no synchronisation is added',
    'profile': "times each checkpoint's forward and recomputation; nothing is timed",
}


def checkpoint(function, *args):
    """Returns ``function(*args)`` without keeping its intermediate activations; the backward
    pass recomputes them, with the RNG state (CPU and CUDA) the forward pass started from."""
    return torch.utils.checkpoint.checkpoint(function, *args, use_reentrant=False, preserve_rng_state=True)


def _read_config(deepspeed_config):
    if deepspeed_config is None:
        return {}
    if isinstance(deepspeed_config, (str, os.PathLike)):
        with open(deepspeed_config, encoding='utf-8') as f:
            deepspeed_config = json.load(f)
    if not isinstance(deepspeed_config, dict):
        raise ConfigError(f'deepspeed_config is a {type(deepspeed_config).__name__}; give a dict or the path of a '
                          'DeepSpeed JSON file')
    block = deepspeed_config.get('activation_checkpointing', {})
    if not isinstance(block, dict):
        raise ConfigError(f'activation_checkpointing is {block!r}; it is a JSON object of DeepSpeed\'s keys '
                          f'({", ".join(_CONFIG_KEYS.values())})')
    unknown = sorted(set(block) - set(_CONFIG_KEYS.values()))
    if unknown:
        raise ConfigError(f'activation_checkpointing: unknown key(s) {unknown}; the keys are '
                          f'{sorted(_CONFIG_KEYS.values())}')
    return {arg: block[key] for arg, key in _CONFIG_KEYS.items() if key in block}


def configure(mpu_, deepspeed_config=None, partition_activations=None, contiguous_checkpointing=None,
              num_checkpoints=None, checkpoint_in_cpu=None, synchronize=None, profile=None):
    """DeepSpeed's ``checkpointing.configure``: settings from the config's
    ``activation_checkpointing`` block (``deepspeed_config``: dict or JSON path), overridden by
    the arguments given. pipetrain honours none of the six memory and timing options (the
    gradients are the same without them): a setting turned on is named in one warning."""
    global _configured  # pylint: disable=global-statement
    del mpu_  # only partition_activations and the model-parallel RNG would use it
    chosen = _read_config(deepspeed_config)
    given = {'partition_activations': partition_activations, 'contiguous_checkpointing': contiguous_checkpointing,
             'num_checkpoints': num_checkpoints, 'checkpoint_in_cpu': checkpoint_in_cpu,
             'synchronize': synchronize, 'profile': profile}
    chosen.update({k: v for k, v in given.items() if v is not None})
    if chosen.get('contiguous_checkpointing') and chosen.get('num_checkpoints') is None:
        raise ConfigError('contiguous_checkpointing needs num_checkpoints (the number of checkpointed blocks), as '
                          "in DeepSpeed; or leave contiguous_checkpointing off, which pipetrain ignores anyway")
    ignored = [k for k in _NOT_HONOURED if chosen.get(k) not in (None, False, 0)]
    if ignored:
        warnings.warn('pipetrain.checkpointing.configure ignores ' +
                      '; '.join(f'{k}={chosen[k]!r} ({_NOT_HONOURED[k]})' for k in ignored) +
                      '. Checkpointing and its gradients are unchanged; remove the setting(s) to silence this',
                      UserWarning, stacklevel=2)
    settings.update(chosen)
    _configured = True


def is_configured():
    """True once configure() has been called (DeepSpeed's)."""
    return _configured


def reset():
    """DeepSpeed frees its contiguous buffers here between batches; pipetrain keeps none."""


def model_parallel_cuda_manual_seed(seed):
    """Seeds the accelerator's generator with ``seed`` (DeepSpeed seeds it with the same value).
    DeepSpeed also keeps a second, model-parallel generator seeded ``seed + 2718 + tp_rank`` for
    tensor-parallel layers; pipetrain's Python models have none, so there is no second one."""
    from .accelerator import get_accelerator  # pylint: disable=import-outside-toplevel
    get_accelerator().manual_seed(seed)
