"""PipelineModule as DeepSpeed's: partitions cut where DeepSpeed cuts them, topologies,
checkpoint and seed arguments, layers kept across placement, and (on 2 processes, against the
one-process oracle) in-place layers at stage and group starts, Linear without bias, functions."""
import json
import pathlib

import pytest
import torch
import torch.utils.checkpoint
from torch import nn

import pipetrain.checkpointing
from conftest import launch
from pipetrain.errors import ConfigError
from pipetrain.pipe import (LayerSpec, PipeDataParallelTopology, PipeModelDataParallelTopology, PipelineModule,
                            ProcessTopology, TiedLayerSpec)
import pipeline_module_cases

HERE = pathlib.Path(__file__).resolve().parent


@pytest.fixture
def world(monkeypatch):
    """Sets this process up as rank `rank` of `size` (PipelineModule reads the launcher's
    environment; nothing connects until initialize)."""
    def set_world(size, rank=0):
        monkeypatch.setenv('WORLD_SIZE', str(size))
        monkeypatch.setenv('RANK', str(rank))
        monkeypatch.setenv('LOCAL_RANK', str(rank))
        monkeypatch.setenv('LOCAL_WORLD_SIZE', str(size))
        monkeypatch.setenv('MASTER_ADDR', '127.0.0.1')
        monkeypatch.setenv('MASTER_PORT', '29999')
    return set_world


def cifar_alexnet():
    """DeepSpeedExamples' CIFAR AlexNet as a layer list: features, a flattening lambda, classifier."""
    return [nn.Conv2d(3, 64, 11, 4, 5), nn.ReLU(inplace=True), nn.MaxPool2d(2, 2),
            nn.Conv2d(64, 192, 5, padding=2), nn.ReLU(inplace=True), nn.MaxPool2d(2, 2),
            nn.Conv2d(192, 384, 3, padding=1), nn.ReLU(inplace=True), nn.Conv2d(384, 256, 3, padding=1),
            nn.ReLU(inplace=True), nn.Conv2d(256, 256, 3, padding=1), nn.ReLU(inplace=True), nn.MaxPool2d(2, 2),
            lambda x: x.view(x.size(0), -1),
            nn.Dropout(), nn.Linear(256, 4096), nn.ReLU(inplace=True), nn.Dropout(), nn.Linear(4096, 4096),
            nn.ReLU(inplace=True), nn.Linear(4096, 10)]


# DeepSpeed's parts for these lists, from its own partition_balanced / partition_uniform.
def test_parameters_cut_the_cifar_alexnet_where_deepspeed_does(world):
    layers = cifar_alexnet()
    for stages, parts in [(2, [0, 18, 21]), (3, [0, 10, 18, 21]), (4, [0, 8, 15, 18, 21])]:
        world(stages)
        model = PipelineModule(layers, num_stages=stages, partition_method='parameters')
        assert model.parts == parts and model.partitions() == parts
        assert model.balance == [b - a for a, b in zip(parts, parts[1:])]


def test_functions_count_no_parameters(world):
    world(2)
    layers = [nn.Linear(4, 4), lambda x: x, lambda x: x, lambda x: x, nn.Linear(4, 4)]  # weights 20, 0, 0, 0, 20
    assert PipelineModule(layers, num_stages=2).parts == [0, 4, 5]


def test_frozen_parameters_do_not_count(world):
    world(2)
    layers = [nn.Linear(4, 4) for _ in range(4)]
    assert PipelineModule(layers, num_stages=2).parts == [0, 2, 4]
    layers[0].requires_grad_(False)
    assert PipelineModule(layers, num_stages=2).parts == [0, 3, 4]


def test_uniform_and_type_regex_as_deepspeed(world):
    layers = cifar_alexnet()
    world(4)
    assert PipelineModule(layers, num_stages=4, partition_method='uniform').parts == [0, 6, 11, 16, 21]
    world(2)
    assert PipelineModule(layers, num_stages=2, partition_method='type:Linear').parts == [0, 20, 21]
    assert PipelineModule(layers, num_stages=2, partition_method='type:conv').parts == [0, 8, 21]
    world(3)
    assert PipelineModule(layers, num_stages=3, partition_method='TYPE:relu').parts == [0, 9, 16, 21]
    with pytest.raises(ConfigError, match="'type:embedding' matches no layer"):
        PipelineModule(layers, num_stages=3, partition_method='type:Embedding')


def test_profile_and_unknown_methods_are_refused_as_deepspeed_does(world):
    world(2)
    for method in ('profile', 'bytes'):
        with pytest.raises(NotImplementedError, match=method):
            PipelineModule([nn.Linear(2, 2), nn.Linear(2, 2)], num_stages=2, partition_method=method)
        with pytest.raises(ConfigError):
            PipelineModule([nn.Linear(2, 2), nn.Linear(2, 2)], num_stages=2, partition_method=method)


def test_the_stage_and_replica_are_the_topology_coordinates_of_the_rank(world):
    world(4, rank=3)
    model = PipelineModule([nn.Linear(2, 2) for _ in range(4)], topology=PipeDataParallelTopology(num_pp=2, num_dp=2))
    assert (model.stage_id, model.data_parallel_id, model.num_stages, model.dp_world_size) == (1, 1, 2, 2)
    assert model.topology().get_dim('data') == 2 and model.local_layers.keys() == {2, 3}
    world(4, rank=2)
    model = PipelineModule([nn.Linear(2, 2) for _ in range(4)],
                           topology=PipeModelDataParallelTopology(num_pp=4, num_mp=1, num_dp=1))
    assert (model.stage_id, model.data_parallel_id, model.num_pipeline_stages()) == (2, 0, 4)


def test_topologies_pipetrain_cannot_run_are_refused_naming_why(world):
    layers = [nn.Linear(2, 2) for _ in range(4)]
    world(4)
    with pytest.raises(ConfigError, match='has 2 ranks but the job has 4'):
        PipelineModule(layers, topology=PipeDataParallelTopology(num_pp=2, num_dp=1))
    with pytest.raises(ConfigError, match="'model' axis of 2"):
        PipelineModule(layers, topology=PipeModelDataParallelTopology(num_pp=2, num_mp=2, num_dp=1))
    with pytest.raises(ConfigError, match='pipe-outermost'):
        PipelineModule(layers, topology=ProcessTopology(axes=['data', 'pipe'], dims=[2, 2]))


def test_checkpoint_arguments(world):
    world(1)
    layers = [nn.Linear(2, 2), nn.Linear(2, 2)]
    for func in (torch.utils.checkpoint.checkpoint, pipetrain.checkpointing.checkpoint):  # deepspeed.checkpointing's
        PipelineModule(layers, num_stages=1, activation_checkpoint_interval=1, activation_checkpoint_func=func)
    with pytest.raises(ConfigError, match='my_checkpoint'):
        def my_checkpoint(fn, *args):
            return fn(*args)
        PipelineModule(layers, num_stages=1, activation_checkpoint_interval=1, activation_checkpoint_func=my_checkpoint)
    with pytest.raises(ConfigError, match='checkpointable_layers is a str'):
        PipelineModule(layers, num_stages=1, checkpointable_layers='Linear')


def test_tied_weight_attr_is_kept_as_given(world):
    """(Training with it: test_tied_weight_attr.py.)"""
    def layers(attr):
        return [TiedLayerSpec('proj', nn.Linear, 4, 4, tied_weight_attr=attr), LayerSpec(nn.ReLU),
                LayerSpec(nn.Linear, 4, 4), TiedLayerSpec('proj', nn.Linear, 4, 4, tied_weight_attr=attr)]
    world(2)
    PipelineModule(layers('weight'), num_stages=2, partition_method='uniform')  # DeepSpeed's way: no refusal
    with pytest.warns(UserWarning, match=r"tied_weight_attr \['scale'\] is not a parameter"):
        PipelineModule(layers(['weight', 'scale']), num_stages=2, partition_method='uniform')
    model = PipelineModule(layers(['weight', 'bias']), num_stages=2, partition_method='uniform')
    assert model.tied_weight_attrs == {'proj': ['weight', 'bias']}
    world(1)  # one stage: one module for both uses, in DeepSpeed as here
    PipelineModule(layers('weight'), num_stages=1)


def test_checkpointable_layers_warns_that_every_group_is_recomputed(world):
    world(1)
    with pytest.warns(UserWarning, match=r"checkpointable_layers=\['Linear'\]: pipetrain recomputes every group"):
        PipelineModule([nn.Linear(2, 2), nn.ReLU()], num_stages=1, activation_checkpoint_interval=1,
                       checkpointable_layers=['Linear'])


def test_seed_fn_gets_base_seed_plus_the_index_of_each_layer_built_here(world):
    world(2, rank=1)
    seeds = []
    model = PipelineModule([LayerSpec(nn.Linear, 2, 2) for _ in range(5)], num_stages=2, partition_method='uniform',
                           seed_layers=True, seed_fn=seeds.append, base_seed=100)
    assert model.parts == [0, 3, 5] and seeds == [103, 104]


def test_placing_for_another_schedule_keeps_the_modules_it_already_holds(world):
    world(2)
    model = PipelineModule([nn.Linear(2, 2) for _ in range(8)], num_stages=2, partition_method='uniform')
    first = model.local_layers[0]
    with torch.no_grad():
        first.weight.fill_(0.25)  # loaded after construction
    first.requires_grad_(False)  # and frozen
    model.place_for_schedule(4, [0, 2])  # interleaved: parts 0 and 2 of 4
    assert set(model.local_layers) == {0, 1, 4, 5}
    assert model.local_layers[0] is first and bool((first.weight == 0.25).all()) and not first.weight.requires_grad
    assert [layer is not None for layer in model.runtime_layers()] == [True, True, False, False, True, True, False,
                                                                      False]


CASES = [
    {'name': 'inplace-first-native', 'model': 'inplace'},
    {'name': 'inplace-first-python', 'model': 'inplace', 'native': False},
    {'name': 'inplace-groups', 'model': 'inplace-groups', 'interval': 1, 'partition': 'parameters'},
    {'name': 'inplace-groups-python', 'model': 'inplace-groups', 'interval': 2, 'native': False},
    {'name': 'no-bias', 'model': 'no-bias', 'partition': 'parameters'},
    {'name': 'functions-topology', 'model': 'functions', 'partition': 'parameters', 'topology': True},
    {'name': 'loaded-and-frozen-after-construction', 'model': 'inplace', 'load_and_freeze': True},
]


@pytest.fixture(scope='module')
def results(tmp_path_factory):
    out = tmp_path_factory.mktemp('pipeline_module')
    (out / 'cases.json').write_text(json.dumps(CASES))
    launch(2, HERE / 'pipeline_module_worker.py', out / 'cases.json', out)
    return out


@pytest.mark.parametrize('case', CASES, ids=[c['name'] for c in CASES])
def test_two_stages_train_as_one_process(results, case):
    steps = case.get('steps', 2)
    losses, state = pipeline_module_cases.oracle(case, steps)
    ranks = [torch.load(results / f"{case['name']}-rank{r}.pt") for r in range(2)]
    seen = set()
    for r in ranks:
        assert r['losses'] == pytest.approx(losses, rel=1e-5, abs=1e-7)
        for index, values in r['state'].items():
            seen.add(index)
            for key, value in values.items():
                torch.testing.assert_close(value, state[index][key], rtol=2e-5, atol=1e-6,
                                           msg=f"{case['name']}: layer {index} {key}")
    assert seen == set(state)
    if case['model'] == 'functions':
        assert ranks[0]['parts'] == [0, 4, 5]  # the functions weigh nothing, as in DeepSpeed
