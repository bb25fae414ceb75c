"""The process grid of a pipeline: ranks by (pipe, data) coordinates, pipe outermost (DeepSpeed's
PipeDataParallelTopology order, the one pipetrain's engine uses)."""
from collections import namedtuple

__all__ = ['PipeDataParallelTopology', 'ProcessTopology']


class ProcessTopology:
    """Ranks laid out on named axes, the first outermost."""

    def __init__(self, axes, dims):
        self.axes = list(axes)
        self.dims = list(dims)
        self.ProcessCoord = namedtuple('ProcessCoord', self.axes)

    def get_dim(self, axis):
        return self.dims[self.axes.index(axis)] if axis in self.axes else 1

    def world_size(self):
        size = 1
        for d in self.dims:
            size *= d
        return size

    def get_coord(self, rank):
        coords = []
        for d in reversed(self.dims):
            coords.append(rank % d)
            rank //= d
        return self.ProcessCoord(*reversed(coords))

    def get_rank(self, **coords):
        rank = 0
        for axis, d in zip(self.axes, self.dims):
            rank = rank * d + coords.get(axis, 0)
        return rank


class PipeDataParallelTopology(ProcessTopology):
    def __init__(self, num_pp, num_dp):
        super().__init__(axes=['pipe', 'data'], dims=[num_pp, num_dp])
