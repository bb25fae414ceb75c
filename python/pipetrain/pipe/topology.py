"""Process grids: ranks laid out on named axes, first axis outermost (DeepSpeed's ProcessTopology,
PipeDataParallelTopology and PipeModelDataParallelTopology, with the same rank order)."""
from collections import namedtuple
from itertools import product

__all__ = ['ProcessTopology', 'PipeDataParallelTopology', 'PipeModelDataParallelTopology']


class ProcessTopology:
    """Ranks on a grid of named axes in row-major order: with ``axes=['x', 'y']`` the coordinates
    (x, y) and (x, y+1) are consecutive ranks.

        >>> t = ProcessTopology(axes=['x', 'y'], dims=[2, 3])
        >>> t.get_rank(x=1, y=0), t.get_coord(4), t.get_axis_list('y', 0)
        (3, ProcessCoord(x=1, y=1), [0, 3])
    """

    def __init__(self, axes, dims):
        self.axes = list(axes)
        self.dims = [int(d) for d in dims]
        if len(self.axes) != len(self.dims):
            raise ValueError(f'ProcessTopology: {len(self.axes)} axes {self.axes} but {len(self.dims)} dims '
                             f'{self.dims}; give one dimension per axis')
        if len(set(self.axes)) != len(self.axes):
            raise ValueError(f'ProcessTopology: axes {self.axes} name an axis twice')
        if any(d < 1 for d in self.dims):
            raise ValueError(f'ProcessTopology: dims {self.dims} must all be >= 1')
        self.ProcessCoord = namedtuple('ProcessCoord', self.axes)
        # Rank r is the r-th coordinate in row-major order; both directions as tables, since
        # callers look ranks up in loops.
        self._coords = [self.ProcessCoord(*c) for c in product(*(range(d) for d in self.dims))]
        self.mapping = {c: r for r, c in enumerate(self._coords)}

    def get_rank(self, **coord_kwargs):
        """The rank at the given coordinates (every axis named)."""
        if len(coord_kwargs) != len(self.axes):
            raise ValueError(f'get_rank({coord_kwargs}) must name every axis {self.axes}; '
                             'use filter_match() for a slice')
        unknown = set(coord_kwargs) - set(self.axes)
        if unknown:
            raise ValueError(f'get_rank: unknown axes {sorted(unknown)}; the axes are {self.axes}')
        key = self.ProcessCoord(**coord_kwargs)
        if key not in self.mapping:
            raise ValueError(f'get_rank: coordinates {coord_kwargs} are outside the dims '
                             f'{dict(zip(self.axes, self.dims))}')
        return self.mapping[key]

    def get_axis_names(self):
        return self.axes

    def get_rank_repr(self, rank, omit_axes=('data', 'pipe'), inner_sep='_', outer_sep='-'):
        """``rank``'s coordinates as text (checkpoint file names): 'model_01' for rank 1 of a
        pipe x data x model grid, '' when only omitted axes remain."""
        omit = frozenset(omit_axes)
        coord = self.get_coord(rank)
        return outer_sep.join(f'{a}{inner_sep}{getattr(coord, a):02d}' for a in self.axes if a not in omit)

    def get_dim(self, axis):
        """The length of ``axis``; 0 for an axis the grid does not have (as DeepSpeed)."""
        return self.dims[self.axes.index(axis)] if axis in self.axes else 0

    def get_coord(self, rank):
        if not isinstance(rank, int) or not 0 <= rank < len(self._coords):
            raise ValueError(f'rank {rank} not found in topology: ranks are 0..{len(self._coords) - 1}')
        return self._coords[rank]

    def get_axis_comm_lists(self, axis):
        """The rank lists of the groups along ``axis``: ranks equal in every other axis, one list
        per combination of the others (row-major); [] for an unknown axis."""
        if axis not in self.axes:
            return []
        others = [a for a in self.axes if a != axis]
        lists = []
        for values in product(*(range(self.get_dim(a)) for a in others)):
            fixed = dict(zip(others, values))
            lists.append([self.mapping[self.ProcessCoord(**fixed, **{axis: i})] for i in range(self.get_dim(axis))])
        return lists

    def filter_match(self, **filter_kwargs):
        """The ranks, ascending, whose coordinates match every given axis value."""
        unknown = set(filter_kwargs) - set(self.axes)
        if unknown:
            raise ValueError(f'filter_match: unknown axes {sorted(unknown)}; the axes are {self.axes}')
        return [r for r, c in enumerate(self._coords)
                if all(getattr(c, k) == v for k, v in filter_kwargs.items())]

    def get_axis_list(self, axis, idx):
        """The ranks, ascending, whose coordinate on ``axis`` is ``idx``."""
        if axis not in self.axes:
            raise ValueError(f'get_axis_list: unknown axis {axis!r}; the axes are {self.axes}')
        i = self.axes.index(axis)
        return [r for r, c in enumerate(self._coords) if c[i] == idx]

    def world_size(self):
        return len(self._coords)

    def __str__(self):
        return str(self.mapping)


class PipeDataParallelTopology(ProcessTopology):
    """Pipeline stages outermost, data-parallel replicas innermost (the replicas of a stage are
    consecutive ranks: their gradient all-reduce stays on one host)."""

    def __init__(self, num_pp, num_dp):
        super().__init__(axes=['pipe', 'data'], dims=[num_pp, num_dp])


class PipeModelDataParallelTopology(ProcessTopology):
    """Pipe, data and model (tensor-parallel) axes, in that order; ``num_mp`` is the model axis."""

    def __init__(self, num_pp, num_mp, num_dp):
        super().__init__(axes=['pipe', 'data', 'model'], dims=[num_pp, num_dp, num_mp])
