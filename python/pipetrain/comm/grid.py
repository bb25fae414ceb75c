"""PipelineParallelGrid: torch.distributed groups along the axes of a process topology, with the
mpu-style accessors DeepSpeed's engine exposes as ``engine.grid`` and ``engine.mpu``
(deepspeed.runtime.pipe.topology.PipelineParallelGrid)."""
import warnings

import torch.distributed as dist

from ..errors import ConfigError
from .distributed import init_distributed

__all__ = ['PipelineParallelGrid']


def _prime_factors(n):
    factors, p = [], 2
    while n > 1:
        while n % p == 0:
            factors.append(p)
            n //= p
        p += 1
    return factors


class PipelineParallelGrid:
    """This rank's place in a pipe x data (x model) grid and the torch.distributed groups of it.

    Groups (all created by every rank in the same order, as torch.distributed requires):
    data-parallel groups (the replicas of one stage), pipe-parallel groups (the stages of one
    replica), model-parallel groups (DeepSpeed's meaning: every rank of one data replica, pipe x
    model) and slice groups (the model axis; this rank alone when there is none). Without a
    topology the world is factored into pipe and data axes as DeepSpeed does.
    """

    def __init__(self, topology=None, process_group=None):
        if process_group is not None:
            warnings.warn('PipelineParallelGrid: process_group is ignored; the groups span the default group',
                          stacklevel=2)
        if not dist.is_initialized():
            init_distributed(verbose=False)
        self.global_rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        if topology is None:
            # Imported here: pipetrain.pipe's engine imports this package.
            from ..pipe.topology import PipeDataParallelTopology  # pylint: disable=import-outside-toplevel
            num_pp = num_dp = 1
            for i, prime in enumerate(_prime_factors(self.world_size)):
                if i % 2 == 0:
                    num_pp *= prime
                else:
                    num_dp *= prime
            topology = PipeDataParallelTopology(num_pp=num_pp, num_dp=num_dp)
        if topology.world_size() != self.world_size:
            raise ConfigError(f'PipelineParallelGrid: the topology {dict(zip(topology.get_axis_names(), topology.dims))} '
                              f'has {topology.world_size()} ranks but the job has {self.world_size}; launch '
                              f'{topology.world_size()} processes or change the topology')
        self._topo = topology
        self.data_parallel_size = max(topology.get_dim('data'), 1)
        self.pipe_parallel_size = max(topology.get_dim('pipe'), 1)
        self.model_parallel_size = max(topology.get_dim('model'), 1)
        self.slice_parallel_size = self.model_parallel_size
        coord = topology.get_coord(self.global_rank)
        self.stage_id = getattr(coord, 'pipe', 0)
        self.data_parallel_id = getattr(coord, 'data', 0)

        # Model parallel (DeepSpeed's engine meaning): every rank of one data replica.
        self.ds_model_proc_group, self.ds_model_rank, self.ds_model_world_size = None, -1, 0
        for dp in range(self.data_parallel_size):
            ranks = sorted(topology.get_axis_list('data', dp)) if 'data' in topology.axes else list(
                range(self.world_size))
            group = dist.new_group(ranks=ranks)
            if self.global_rank in ranks:
                self.ds_model_proc_group, self.ds_model_world_size = group, len(ranks)
                self.ds_model_rank = ranks.index(self.global_rank)

        self.dp_group, self.dp_proc_group = self._axis_groups('data')
        self.pp_group, self.pp_proc_group = self._axis_groups('pipe')
        self.slice_group, self.slice_proc_group = self._axis_groups('model')
        self.p2p_groups = self._p2p_lists()
        self.is_first_stage = self.stage_id == 0
        self.is_last_stage = self.stage_id == self.pipe_parallel_size - 1

    def _axis_groups(self, axis):
        """(this rank's list, its group) along ``axis``; an axis the topology lacks is one group
        per rank (each rank alone), as DeepSpeed's slice groups without a model axis."""
        lists = self._topo.get_axis_comm_lists(axis) or [[r] for r in range(self.world_size)]
        mine = None
        for ranks in lists:
            group = dist.new_group(ranks=ranks)
            if self.global_rank in ranks:
                mine = (list(ranks), group)
        return mine

    def _p2p_lists(self):
        """[rank, next stage's rank] of every pipe group, wrapping around (DeepSpeed's p2p lists)."""
        pairs = []
        for ranks in self._topo.get_axis_comm_lists('pipe') or [[r] for r in range(self.world_size)]:
            for i, r in enumerate(ranks):
                pairs.append([r, ranks[(i + 1) % len(ranks)]])
        return pairs

    # -- DeepSpeed's accessors ---------------------------------------------------------------------
    def get_stage_id(self):
        return self.stage_id

    def get_data_parallel_id(self):
        return self.data_parallel_id

    def topology(self):
        return self._topo

    def stage_to_global(self, stage_id, **kwargs):
        """The global rank of ``stage_id`` in this rank's replica (other axes may be overridden)."""
        me = self._topo.get_coord(self.global_rank)
        return self._topo.get_rank(**me._replace(pipe=stage_id, **kwargs)._asdict())

    def get_global_rank(self):
        return self.global_rank

    def get_pipe_parallel_rank(self):
        return self.stage_id

    def get_pipe_parallel_world_size(self):
        return self.pipe_parallel_size

    def get_pipe_parallel_group(self):
        return self.pp_proc_group

    def get_data_parallel_rank(self):
        return self.data_parallel_id

    def get_data_parallel_world_size(self):
        return self.data_parallel_size

    def get_data_parallel_group(self):
        return self.dp_proc_group

    def get_data_parallel_group_ranks(self):
        return list(self.dp_group)

    def get_model_parallel_rank(self):
        return self.ds_model_rank

    def get_model_parallel_world_size(self):
        return self.ds_model_world_size

    def get_model_parallel_group(self):
        return self.ds_model_proc_group

    def get_slice_parallel_rank(self):
        coord = self._topo.get_coord(self.global_rank)
        return getattr(coord, 'model', 0)

    def get_slice_parallel_world_size(self):
        return self.slice_parallel_size

    def get_slice_parallel_group(self):
        return self.slice_proc_group
