"""initialize's config and arguments as DeepSpeed reads them: the config from args, config or
config_params; args.local_rank; mpu; the tensorboard block; the config's warnings."""
import json
import os
import warnings

from .. import _C
from ..errors import ConfigError

__all__ = ['PYTHON_KEYS', 'read_config', 'check_local_rank', 'check_mpu', 'tensorboard_dir', 'warn_config']

# DeepSpeed config keys of the Python front end alone: the training loader's.
PYTHON_KEYS = ('dataloader_drop_last',)


def read_config(args, config, config_params):
    """The config as DeepSpeed's initialize finds it: args.deepspeed_config (or the older
    args.deepscale_config), else config, else config_params; a dict or a JSON file's path."""
    from_args = None
    if args is not None:
        scale = getattr(args, 'deepscale_config', None)
        speed = getattr(args, 'deepspeed_config', None)
        if scale is not None and speed is not None:
            raise ConfigError(f'args.deepscale_config ({scale!r}) and args.deepspeed_config ({speed!r}) are both set; '
                              'keep deepspeed_config (deepscale_config is its old name)')
        from_args = speed if speed is not None else scale
    if config is None:
        config = config_params
    if from_args is not None and config is not None:
        raise ConfigError(f'the config is given twice: args.deepspeed_config ({from_args!r}) and '
                          'initialize(config=...); DeepSpeed refuses this too. Keep one')
    if from_args is not None:
        config = from_args
    if config is None:
        raise ConfigError('pipetrain.initialize needs a config: config=dict, the path of a DeepSpeed JSON file, or '
                          'args.deepspeed_config (--deepspeed_config)')
    if isinstance(config, (str, os.PathLike)):
        with open(config, encoding='utf-8') as f:
            return json.load(f)
    if not isinstance(config, dict):
        raise ConfigError(f'config is a {type(config).__name__}; give a dict or the path of a JSON file')
    return dict(config)


def check_local_rank(args):
    """DeepSpeed sets args.local_rank from the launcher's LOCAL_RANK, and refuses one that differs."""
    local_rank = _C.rank_info()[2]
    given = getattr(args, 'local_rank', None) if args is not None else None
    if given is not None and given >= 0 and given != local_rank:
        raise ConfigError(f'args.local_rank is {given} but the launcher says LOCAL_RANK={local_rank}; drop '
                          '--local_rank or launch with a matching one')
    if args is not None and hasattr(args, 'local_rank'):
        args.local_rank = local_rank


def check_mpu(mpu):
    if mpu is None:
        return
    try:
        from ..comm import PipelineParallelGrid  # pylint: disable=import-outside-toplevel
    except ImportError:
        PipelineParallelGrid = ()  # pylint: disable=invalid-name
    if PipelineParallelGrid and isinstance(mpu, PipelineParallelGrid):
        return  # the engine's own grid: the same groups it builds
    raise ConfigError(f'mpu: a {type(mpu).__name__}; pipetrain builds its own process groups (pipe x data) from '
                      "the PipelineModule's topology, and a model-parallel unit of another library cannot drive "
                      'them. Leave mpu out')


def tensorboard_dir(cfg):
    block = cfg.get('tensorboard')
    if not isinstance(block, dict) or not block.get('enabled', False):
        return None
    base = block.get('output_path') or os.path.join(os.path.expanduser('~'), 'tensorboard')
    return os.path.join(base, block.get('job_name', 'DeepSpeedJobName'))


def warn_config(cfg):
    """The config's warnings (DeepSpeed keys pipetrain ignores, unknown keys), once, on rank 0."""
    found = _C.check_config(json.dumps(cfg))
    if found and _C.rank_info()[0] == 0:
        for warning in found:
            warnings.warn(warning, stacklevel=4)
