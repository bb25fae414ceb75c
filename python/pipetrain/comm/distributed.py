"""init_distributed: the torch.distributed default group of a pipetrain job (DeepSpeed's
``deepspeed.init_distributed``), on the rendezvous the launcher gave (pipetrain launch, torchrun,
mpirun, srun) as pipetrain's native engine reads it.

One TCPStore serves the job on MASTER_PORT: torch.distributed's rank 0 serves it multi-tenant
and pipetrain's engine shares it (its keys under "pipetrain/"), or torchrun's agent serves it
and both join as clients (TORCHELASTIC_USE_AGENT_STORE=True).
"""
import atexit
import json
import os
import socket
import warnings

import torch
import torch.distributed as dist

from .. import _C
from ..errors import ConfigError

__all__ = ['init_distributed', 'launch_env']

TORCH_DISTRIBUTED_DEFAULT_PORT = 29500
try:
    from torch.distributed.constants import default_pg_timeout
except ImportError:  # pragma: no cover - every torch this package supports has it
    from datetime import timedelta
    default_pg_timeout = timedelta(minutes=30)

# What torch.distributed's env:// rendezvous reads, filled from the launcher's variables: under
# mpirun or srun a DeepSpeed script finds them in os.environ (DeepSpeed's MPI discovery sets them).
_EXPORTED = (('RANK', 'rank'), ('WORLD_SIZE', 'world_size'), ('LOCAL_RANK', 'local_rank'),
             ('LOCAL_WORLD_SIZE', 'local_world_size'), ('MASTER_ADDR', 'master_addr'), ('MASTER_PORT', 'master_port'))


def launch_env():
    """This process in its job as the launcher's environment says: a dict of rank, world_size,
    local_rank, local_world_size, master_addr, master_port, launcher ('torchrun', 'OpenMPI',
    'Slurm', 'no launcher'), agent_store."""
    return _C.launch_env()


def _free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def _export(env):
    for var, key in _EXPORTED:
        os.environ.setdefault(var, str(env[key]))
    if env['launcher'] == 'OpenMPI':
        os.environ.setdefault('LOCAL_SIZE', str(env['local_world_size']))  # DeepSpeed's MPI discovery's name


def _backend(dist_backend):
    if dist_backend is None:
        return 'nccl' if torch.cuda.is_available() and dist.is_nccl_available() else 'gloo'
    name = str(dist_backend).lower()
    available = {'gloo': dist.is_gloo_available(), 'nccl': dist.is_nccl_available() and torch.cuda.is_available(),
                 'mpi': dist.is_mpi_available()}
    if not available.get(name, False):
        usable = [b for b, ok in available.items() if ok]
        raise ConfigError(f'dist_backend {dist_backend!r} is not available in this torch (usable: {usable}); '
                          'leave it None for gloo on CPU, nccl on GPUs')
    return name


def _check_config(config):
    if config is None:
        return
    if isinstance(config, (str, os.PathLike)):
        with open(config, encoding='utf-8') as f:
            config = json.load(f)
    if isinstance(config, dict) and (config.get('comms_logger') or {}).get('enabled'):
        warnings.warn("init_distributed: the config's comms_logger is not supported; communication is not logged",
                      stacklevel=3)


def _adopt(rank, world_size, env):
    if env['world_size'] > 1 and dist.get_world_size() != env['world_size']:
        raise ConfigError(f'torch.distributed is initialized with world size {dist.get_world_size()} but the '
                          f"launcher ({env['launcher']}) started {env['world_size']} ranks; make the group over every "
                          'rank of the job (init_process_group with the default env:// rendezvous)')
    for name, given, actual in (('rank', rank, dist.get_rank()), ('world_size', world_size, dist.get_world_size())):
        if given >= 0 and given != actual:
            raise ConfigError(f'init_distributed({name}={given}) but torch.distributed is initialized with '
                              f'{name} {actual}; leave it -1')


def _gloo_backends():
    """The gloo backends of every group (torch 2.x, where a group holds its backends; none in 1.13)."""
    backends = []
    world = getattr(dist.distributed_c10d, '_world', None)  # torch 2.x's registry of groups
    for group in list(world.pg_map) if world is not None else []:
        try:
            backends.append(group._get_backend(torch.device('cpu')))  # pylint: disable=protected-access
        except (AttributeError, RuntimeError):
            pass
    return backends


def _destroy_at_exit():
    # Left to the interpreter's teardown, torch 1.13's gloo groups sometimes end a rank with
    # "terminate called without an active exception" (about one exit in ten of a 4-rank job);
    # destroyed while every module still lives, they close cleanly.
    if not dist.is_initialized():
        return
    # torch 2.x: a gloo worker that drops a finished collective's tensor, whose Python object the
    # script has let go, takes the GIL while it holds its queue lock; ~ProcessGroupGloo run by
    # destroy_process_group under the GIL waits for that lock: a hang in one 4-rank exit in three.
    # Holding the backends past destroy_process_group moves their destructors to the release of
    # these references, whose holder lets the GIL go first.
    backends = _gloo_backends()
    dist.destroy_process_group()
    del backends


def cuda_device_for(local_rank, device_count):
    """The CUDA device index of the process with this LOCAL_RANK: its own GPU where the node's
    GPUs are all visible, the one GPU where the launcher shows each process one
    (CUDA_VISIBLE_DEVICES per rank, srun --gpus-per-task=1)."""
    if device_count == 1:
        return 0
    if 0 <= local_rank < device_count:
        return local_rank
    raise ConfigError(f'LOCAL_RANK {local_rank} but this process sees {device_count} CUDA devices; start at most '
                      f'{device_count} processes per node, or show each process its own GPU (CUDA_VISIBLE_DEVICES)')


def _set_cuda_device(env):
    """Makes the process's own GPU the current CUDA device (DeepSpeed's engine does the same with
    LOCAL_RANK), so that NCCL groups, .cuda() and pipetrain's 'cuda' device name pick it."""
    if torch.cuda.is_available() and torch.cuda.device_count() > 0:
        torch.cuda.set_device(cuda_device_for(int(env.get('local_rank', 0)), torch.cuda.device_count()))


def init_distributed(dist_backend=None, auto_mpi_discovery=True, distributed_port=TORCH_DISTRIBUTED_DEFAULT_PORT,
                     verbose=True, timeout=default_pg_timeout, init_method=None, dist_init_required=None,
                     config=None, rank=-1, world_size=-1):
    """Creates torch.distributed's default group for this job, or adopts the one the script made.

    The rank, world size and rendezvous address come from the launcher's variables (pipetrain
    launch or torchrun: RANK...; mpirun: OMPI_COMM_WORLD_*; srun: SLURM_*), which are exported to
    os.environ as RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT.
    ``distributed_port`` is MASTER_PORT under mpirun or srun when it is not set (else derived from
    the job id). ``dist_init_required=False`` makes nothing. A single process without a launcher
    gets a group of one on a free port (and exports nothing). Where CUDA is available, the
    current CUDA device becomes LOCAL_RANK's GPU (the only one, where each process sees one).
    """
    _check_config(config)
    if dist_init_required is False and not dist.is_initialized():
        return
    env = _C.launch_env()
    _set_cuda_device(env)
    if dist.is_initialized():
        _adopt(rank, world_size, env)
        return
    if env['launcher'] in ('OpenMPI', 'Slurm'):
        if not auto_mpi_discovery and 'RANK' not in os.environ:
            raise ConfigError(f"init_distributed(auto_mpi_discovery=False) under {env['launcher']}: RANK, "
                              'WORLD_SIZE, MASTER_ADDR and MASTER_PORT are not set; let it discover them (True) or '
                              'export them')
        if 'MASTER_PORT' not in os.environ and int(distributed_port) != TORCH_DISTRIBUTED_DEFAULT_PORT:
            os.environ['MASTER_PORT'] = str(int(distributed_port))
            env = _C.launch_env()
    for name, given in (('rank', rank), ('world_size', world_size)):
        if given >= 0 and given != env[name]:
            raise ConfigError(f"init_distributed({name}={given}) but the launcher ({env['launcher']}) gives "
                              f'{name} {env[name]}; leave it -1')
    backend = _backend(dist_backend)
    # torch 2.4+'s rendezvous asks for its libuv store server unless USE_LIBUV=0, and a torch
    # built without libuv (Debian's) refuses that; the plain server, which pipetrain's engine
    # uses too, serves a job of any size pipetrain runs. An explicit choice stays.
    os.environ.setdefault('USE_LIBUV', '0')
    atexit.register(_destroy_at_exit)  # only for a group made here: an adopted one is the script's
    if env['master_port'] == 0:
        # One process without a launcher: a group of one on a free port of its own. Nothing is
        # exported: a process this one starts must not take the variables for a launcher's.
        dist.init_process_group(backend, init_method=init_method or f"tcp://{env['master_addr']}:{_free_port()}",
                                timeout=timeout, rank=0, world_size=1)
        return
    _export(env)
    if verbose and env['rank'] == 0:
        print(f"pipetrain: initializing torch.distributed ({backend}, {env['world_size']} ranks via "
              f"{env['launcher']}, master {env['master_addr']}:{env['master_port']})", flush=True)
    if init_method is None and os.environ.get('TORCHELASTIC_USE_AGENT_STORE') == 'True':
        # A client of torchrun's agent store. torch's own rendezvous makes that client with its
        # default, libuv, which a torch built without libuv (Debian's 2.x) refuses whatever
        # USE_LIBUV says: the client is made here, plain.
        dist.init_process_group(backend, store=_agent_store_client(env, timeout), rank=env['rank'],
                                world_size=env['world_size'], timeout=timeout)
        return
    dist.init_process_group(backend, init_method=init_method or 'env://', timeout=timeout, rank=env['rank'],
                            world_size=env['world_size'])


def _agent_store_client(env, timeout):
    args = (env['master_addr'], env['master_port'], env['world_size'], False)
    kwargs = {'timeout': timeout} if timeout is not None else {}
    try:
        return dist.TCPStore(*args, use_libuv=False, **kwargs)
    except TypeError:  # torch before 2.4: no such argument, always the plain client
        return dist.TCPStore(*args, **kwargs)
