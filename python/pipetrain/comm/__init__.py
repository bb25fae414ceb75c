"""pipetrain.comm: DeepSpeed's ``deepspeed.comm`` over torch.distributed, for the calls pipeline
scripts make around the engine (rank, barrier, all_reduce, groups).

    import pipetrain as deepspeed
    deepspeed.init_distributed()
    from pipetrain import comm as dist
    if dist.get_rank() == 0: download()
    dist.barrier()

``init_distributed`` makes the torch.distributed default group on the launcher's rendezvous
(pipetrain.initialize calls it too); every other function runs on that group, as DeepSpeed's
torch backend does. DeepSpeed's comms-logging arguments (prof, log_name, debug) are accepted;
``prof=True`` warns that nothing is logged.
"""
import warnings

import torch
import torch.distributed as dist
from torch.distributed import ReduceOp

from .. import _C
from ..errors import UsageError
from .distributed import init_distributed, launch_env
from .grid import PipelineParallelGrid

__all__ = ['init_distributed', 'is_initialized', 'is_available', 'get_rank', 'get_world_size', 'get_local_rank',
           'get_global_rank', 'get_world_group', 'get_backend', 'barrier', 'all_reduce', 'reduce', 'broadcast',
           'all_gather', 'new_group', 'destroy_process_group', 'ReduceOp', 'PipelineParallelGrid', 'launch_env']

_warned_prof = False


def _need_group(what):
    if not dist.is_initialized():
        raise UsageError(f'pipetrain.comm.{what}: torch.distributed is not initialized; call '
                         'pipetrain.init_distributed() (or pipetrain.initialize) first')


def _profile(prof):
    global _warned_prof  # pylint: disable=global-statement
    if prof and not _warned_prof:
        _warned_prof = True
        warnings.warn('pipetrain.comm: prof=True is accepted but communication is not profiled', stacklevel=3)


def is_initialized():
    return dist.is_initialized()


def is_available():
    return dist.is_available()


def get_rank(group=None):
    _need_group('get_rank')
    return dist.get_rank(group) if group is not None else dist.get_rank()


def get_world_size(group=None):
    _need_group('get_world_size')
    return dist.get_world_size(group) if group is not None else dist.get_world_size()


def get_local_rank():
    """This rank's index on its host, from the launcher's variables (LOCAL_RANK under torchrun and
    pipetrain launch, OMPI_COMM_WORLD_LOCAL_RANK under mpirun, SLURM_LOCALID under srun)."""
    return _C.launch_env()['local_rank']


def get_global_rank(group=None, group_rank=0):
    """The global rank of ``group``'s member ``group_rank`` (the world's when group is None)."""
    _need_group('get_global_rank')
    if group is None:
        return group_rank
    if hasattr(dist, 'get_global_rank'):
        return dist.get_global_rank(group, group_rank)
    return dist.distributed_c10d._get_global_rank(group, group_rank)  # pylint: disable=protected-access  # torch 1.13


def get_world_group():
    _need_group('get_world_group')
    return dist.group.WORLD


def get_backend(group=None):
    _need_group('get_backend')
    return dist.get_backend(group)


def new_group(ranks):
    """A group of ``ranks``; as torch.distributed's, every rank of the job calls it, in the same order."""
    _need_group('new_group')
    return dist.new_group(ranks=sorted(ranks))


def destroy_process_group(group=None):
    dist.destroy_process_group(group)


def barrier(group=None, async_op=False, device_ids=None, prof=False, log_name='barrier', debug=None):
    del log_name, debug
    _need_group('barrier')
    _profile(prof)
    kwargs = {'device_ids': device_ids} if device_ids is not None else {}
    return dist.barrier(group=group, async_op=async_op, **kwargs)


def _is_avg(op):
    return hasattr(ReduceOp, 'AVG') and op == ReduceOp.AVG


def all_reduce(tensor, op=ReduceOp.SUM, group=None, async_op=False, prof=False, log_name='all_reduce', debug=None):
    """torch.distributed.all_reduce. ReduceOp.AVG also on gloo (which has none): a sum divided by
    the group's size."""
    del log_name, debug
    _need_group('all_reduce')
    _profile(prof)
    if _is_avg(op) and dist.get_backend(group) != 'nccl':
        if async_op:
            raise UsageError('all_reduce(op=ReduceOp.AVG, async_op=True) on gloo: gloo has no AVG, which '
                             'pipetrain makes of a sum and a division after it; pass async_op=False')
        dist.all_reduce(tensor, op=ReduceOp.SUM, group=group)
        size = dist.get_world_size(group) if group is not None else dist.get_world_size()
        if tensor.is_floating_point() or tensor.is_complex():
            tensor.div_(size)
        else:
            tensor.copy_(torch.div(tensor, size, rounding_mode='floor'))
        return None
    return dist.all_reduce(tensor, op=op, group=group, async_op=async_op)


def reduce(tensor, dst, op=ReduceOp.SUM, group=None, async_op=False, prof=False, log_name='reduce', debug=None):
    del log_name, debug
    _need_group('reduce')
    _profile(prof)
    return dist.reduce(tensor, dst, op=op, group=group, async_op=async_op)


def broadcast(tensor, src, group=None, async_op=False, prof=False, log_name='broadcast', debug=None):
    del log_name, debug
    _need_group('broadcast')
    _profile(prof)
    return dist.broadcast(tensor, src, group=group, async_op=async_op)


def all_gather(tensor_list, tensor, group=None, async_op=False, prof=False, log_name='all_gather', debug=None):
    del log_name, debug
    _need_group('all_gather')
    _profile(prof)
    return dist.all_gather(tensor_list, tensor, group=group, async_op=async_op)


def __getattr__(name):
    # The rest of deepspeed.comm's torch.distributed names (send, recv, all_to_all_single, ...)
    # run unchanged on torch.distributed.
    if not name.startswith('_') and hasattr(dist, name):
        return getattr(dist, name)
    raise AttributeError(f"module 'pipetrain.comm' has no attribute '{name}'")

