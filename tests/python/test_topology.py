"""pipetrain.pipe's process topologies against what DeepSpeed's topology tests check: row-major
rank order, coordinates, axis lists, communicator lists, filters and the rank names of
checkpoint files."""
import pytest

from pipetrain.pipe import PipeDataParallelTopology, PipeModelDataParallelTopology, ProcessTopology


def test_two_axes_are_row_major():
    topo = ProcessTopology(axes=['row', 'col'], dims=[2, 2])
    assert topo.world_size() == 4
    assert [topo.get_rank(row=r, col=c) for r in range(2) for c in range(2)] == [0, 1, 2, 3]
    assert topo.get_axis_list(axis='row', idx=0) == [0, 1]
    assert topo.get_axis_list(axis='row', idx=1) == [2, 3]
    assert topo.get_axis_list(axis='col', idx=0) == [0, 2]
    assert topo.get_axis_list(axis='col', idx=1) == [1, 3]


def test_dims_and_an_absent_axis():
    topo = ProcessTopology(axes=['a', 'b', 'c'], dims=[2, 3, 4])
    assert topo.world_size() == 24
    assert [topo.get_dim(a) for a in 'abc'] == [2, 3, 4]
    assert topo.get_dim('pipe') == 0  # as DeepSpeed: an axis the grid lacks has length 0
    assert topo.get_axis_names() == ['a', 'b', 'c']


def test_three_axes_coordinates_and_filters():
    topo = ProcessTopology(axes=['a', 'b', 'c'], dims=[2, 2, 2])
    for rank in range(8):
        a, b, c = rank >> 2, (rank >> 1) & 1, rank & 1
        assert topo.get_rank(a=a, b=b, c=c) == rank
        assert topo.get_coord(rank) == topo.ProcessCoord(a, b, c)
    assert topo.get_coord(6).a == 1 and topo.get_coord(6).c == 0
    assert topo.get_axis_list('b', 1) == [2, 3, 6, 7]
    assert topo.get_axis_list('c', 0) == [0, 2, 4, 6]
    assert topo.filter_match(a=0) == [0, 1, 2, 3]
    assert topo.filter_match(b=1, c=1) == [3, 7]
    assert topo.filter_match(a=1, b=1, c=1) == [7]
    assert topo.filter_match() == list(range(8))


def test_communicator_lists_along_each_axis():
    topo = PipeModelDataParallelTopology(num_pp=2, num_mp=2, num_dp=2)
    assert topo.get_axis_names() == ['pipe', 'data', 'model']
    assert topo.get_rank(pipe=1, data=0, model=1) == 5
    assert topo.get_axis_comm_lists('pipe') == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert topo.get_axis_comm_lists('data') == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert topo.get_axis_comm_lists('model') == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert topo.get_axis_comm_lists('jeff') == []  # an unknown axis is no groups, not an error


def test_rank_repr_names_the_axes_a_checkpoint_file_needs():
    topo = ProcessTopology(axes=['a', 'b'], dims=[2, 2])
    assert [topo.get_rank_repr(rank=r) for r in range(4)] == ['a_00-b_00', 'a_00-b_01', 'a_01-b_00', 'a_01-b_01']
    assert topo.get_rank_repr(rank=3, inner_sep='+') == 'a+01-b+01'
    assert topo.get_rank_repr(rank=3, inner_sep='=', outer_sep='__') == 'a=01__b=01'
    pd = PipeDataParallelTopology(num_pp=2, num_dp=2)
    assert [pd.get_rank_repr(rank=r) for r in range(4)] == [''] * 4
    assert [pd.get_rank_repr(rank=r, omit_axes=['pipe']) for r in range(4)] == ['data_00', 'data_01'] * 2
    assert pd.get_rank_repr(rank=2, omit_axes=[]) == 'pipe_01-data_00'
    pmd = PipeModelDataParallelTopology(num_pp=2, num_mp=2, num_dp=2)
    assert [pmd.get_rank_repr(rank=r) for r in range(8)] == ['model_00', 'model_01'] * 4


def test_pipe_data_topology_puts_a_stages_replicas_next_to_each_other():
    topo = PipeDataParallelTopology(num_pp=3, num_dp=2)
    assert [tuple(topo.get_coord(r)) for r in range(6)] == [(0, 0), (0, 1), (1, 0), (1, 1), (2, 0), (2, 1)]
    assert topo.get_axis_comm_lists('data') == [[0, 1], [2, 3], [4, 5]]
    assert str(topo).startswith('{ProcessCoord(pipe=0, data=0): 0')


def test_bad_coordinates_and_grids_are_value_errors_naming_them():
    topo = ProcessTopology(axes=['x', 'y'], dims=[2, 3])
    with pytest.raises(ValueError, match='filter_match'):
        topo.get_rank(x=1)  # a slice: DeepSpeed sends it to filter_match as well
    with pytest.raises(ValueError, match='outside'):
        topo.get_rank(x=2, y=0)
    with pytest.raises(ValueError, match='rank 6 not found'):
        topo.get_coord(6)
    with pytest.raises(ValueError, match='unknown axes'):
        topo.filter_match(z=0)
    with pytest.raises(ValueError, match='one dimension per axis'):
        ProcessTopology(axes=['x', 'y'], dims=[2])
