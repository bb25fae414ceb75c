"""The engine's checkpoints as DeepSpeed's save_checkpoint/load_checkpoint take them: pipetrain's
per-layer checkpoints (the native side writes and reads them), any picklable client_state
(pickled into the manifest, written once by rank 0), a client optimizer's and scheduler's state
(one file per rank beside the layers), and checkpoints DeepSpeed itself wrote."""
import base64
import inspect
import os
import pickle
import warnings

import torch

from .. import _C
from ..errors import CheckpointError

__all__ = ['save', 'load']

_PICKLE_KEY = 'client_state_pickle'
# The keys of DeepSpeed's mp_rank_XX_model_states.pt that are its own; the rest is client state.
_DEEPSPEED_KEYS = {'module', 'buffer_names', 'optimizer', 'param_shapes', 'frozen_param_shapes', 'shared_params',
                   'frozen_param_fragments', 'lr_scheduler', 'data_sampler', 'random_ltd',
                   'sparse_tensor_module_names', 'skipped_steps', 'global_steps', 'global_samples', 'dp_world_size',
                   'mp_world_size'}


def _client_file(path, rank):
    return os.path.join(path, f'client_optimizer_rank{rank:05d}.pt')


def _torch_load(path):
    # What DeepSpeed's own files hold is more than tensors (argparse namespaces, configs), and
    # DeepSpeed loads them whole; torch 2.x would refuse them by default.
    extra = {'weights_only': False} if 'weights_only' in inspect.signature(torch.load).parameters else {}
    return torch.load(path, map_location='cpu', **extra)


def save(engine, save_dir, tag, client_state, save_latest):
    """Collective. Returns the tag written."""
    extra = ''
    if client_state is not None:
        try:
            blob = pickle.dumps(client_state)
        except Exception as e:  # pickle raises several types; the message names the value
            raise CheckpointError(f'client_state cannot be pickled ({e}); pass picklable values') from e
        import json  # pylint: disable=import-outside-toplevel
        extra = json.dumps({_PICKLE_KEY: base64.b64encode(blob).decode('ascii')})
    save_dir = os.fspath(save_dir)
    tag = engine._native.save(save_dir, '' if tag is None else str(tag), extra, bool(save_latest))
    client = engine._client
    if client is not None:
        # Each rank's own optimizer and scheduler state; written after the layers, atomically.
        state = {'optimizer': client.optimizer.state_dict(),
                 'lr_scheduler': None if client.lr_scheduler is None else client.lr_scheduler.state_dict()}
        path = _client_file(os.path.join(save_dir, tag), engine.global_rank)
        torch.save(state, path + '.tmp')
        os.replace(path + '.tmp', path)
    return tag


def _client_state(extra_json):
    if not extra_json:
        return {}
    import json  # pylint: disable=import-outside-toplevel
    extra = json.loads(extra_json)
    if isinstance(extra, dict) and set(extra) == {_PICKLE_KEY}:
        return pickle.loads(base64.b64decode(extra[_PICKLE_KEY]))
    return extra  # written as JSON by an older pipetrain or by `pipetrain train`


def load(engine, load_dir, tag, strict, optimizer_states, lr_scheduler_states, module_only):
    """Returns (path, client_state), or (None, None) when there is no checkpoint to load."""
    load_dir = os.fspath(load_dir)
    if tag is None:
        tag = _C.latest_tag(load_dir)
        if not tag:
            warnings.warn(f'no latest file in {load_dir}: nothing loaded (DeepSpeed returns (None, None) too); '
                          'pass the tag to load', stacklevel=3)
            return None, None
    tag = str(tag)
    tag_dir = os.path.join(load_dir, tag)
    if not os.path.exists(os.path.join(tag_dir, 'manifest.json')) and not os.path.exists(
            os.path.join(tag_dir + '.old', 'manifest.json')) and _C.is_deepspeed_checkpoint(tag_dir):
        return _load_deepspeed(engine, tag_dir, strict, optimizer_states, module_only)
    path, step, extra = engine._native.load(load_dir, tag, bool(strict), bool(optimizer_states), bool(module_only))
    if not module_only:
        # DeepSpeed's scheduler keeps its own state; left out, it starts again at this step.
        engine._native.set_scheduler_start(0 if lr_scheduler_states else step)
    client = engine._client
    if client is not None and not module_only and (optimizer_states or lr_scheduler_states):
        file = _client_file(path, engine.global_rank)
        if not os.path.exists(file):
            raise CheckpointError(f'{file} is missing: the checkpoint was saved without a client optimizer on this '
                                  'rank (or by another layout); pass load_optimizer_states=False and '
                                  'load_lr_scheduler_states=False to load the layers alone')
        state = _torch_load(file)
        if optimizer_states:
            client.optimizer.load_state_dict(state['optimizer'])
        if lr_scheduler_states and client.lr_scheduler is not None and state['lr_scheduler'] is not None:
            client.lr_scheduler.load_state_dict(state['lr_scheduler'])
    return path, _client_state(extra)


def _load_deepspeed(engine, tag_dir, strict, optimizer_states, module_only):
    if not strict:
        warnings.warn('load_module_strict=False: a DeepSpeed checkpoint loads strictly (every key of every layer)',
                      stacklevel=4)
    path = engine._native.load_deepspeed(tag_dir)
    states = os.path.join(path, 'mp_rank_00_model_states.pt')
    if not os.path.exists(states):
        return path, {}
    checkpoint = _torch_load(states)
    if not module_only and 'global_steps' in checkpoint:
        engine.global_steps = int(checkpoint['global_steps'])
    if optimizer_states and not module_only and checkpoint.get('optimizer') is not None:
        warnings.warn(f"{states}: DeepSpeed's optimizer state is not loaded (pipetrain reads DeepSpeed's layers); "
                      'the optimizer starts afresh', stacklevel=4)
    return path, {k: v for k, v in checkpoint.items() if k not in _DEEPSPEED_KEYS}
