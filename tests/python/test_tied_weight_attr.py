"""TiedLayerSpec's tied_weight_attr as DeepSpeed's: only the named parameters are shared across
stages (broadcast at start, gradients all-reduced); the module's others stay each stage's own.
On 2 processes against a one-process oracle with exactly that sharing."""
import pathlib

import pytest
import torch
from torch import nn

from conftest import launch
from pipetrain.pipe import LayerSpec, PipelineModule, TiedLayerSpec
import tied_weight_attr_cases as cases

HERE = pathlib.Path(__file__).resolve().parent
MODELS = ['embed', 'list']


@pytest.fixture(scope='module')
def results(tmp_path_factory):
    out = tmp_path_factory.mktemp('tied_weight_attr')
    launch(2, HERE / 'tied_weight_attr_worker.py', ','.join(MODELS), out)
    return out


@pytest.mark.parametrize('model', MODELS)
def test_only_the_named_attributes_are_tied_across_stages(results, model):
    losses, state = cases.oracle(model, steps=2)
    ranks = [torch.load(results / f'{model}-rank{r}.pt') for r in range(2)]
    seen = set()
    for r in ranks:
        assert r['losses'] == pytest.approx(losses, rel=1e-5, abs=1e-7)
        for index, values in r['state'].items():
            seen.add(index)
            for key, value in values.items():
                torch.testing.assert_close(value, state[index][key], rtol=2e-5, atol=1e-6,
                                           msg=f'{model}: layer {index} {key}')
    assert seen == {0, 1, 2, 3}
    for r in ranks:  # saved and loaded into a fresh model: each use's own bias comes back
        for index, values in r['state'].items():
            for key, value in values.items():
                torch.testing.assert_close(r['loaded'][index][key], value, rtol=0, atol=0,
                                           msg=f'{model}: layer {index} {key} after a checkpoint round trip')
    first, last = ranks[0]['state'][0], ranks[1]['state'][3]
    for name in cases.tied_attrs(model):
        torch.testing.assert_close(first[name], last[name])
    # The bias is each stage's own: a tie of the whole module would have made them equal.
    assert not torch.allclose(first['bias'], last['bias'])
    if model == 'embed':  # the embedding's use never reads its bias: stage 0's stays where it started
        start = cases.EmbedProj(10, 8)
        cases.start_values(start, 0)
        torch.testing.assert_close(first['bias'], start.bias.detach())


def test_a_missing_attribute_warns_and_ties_the_whole_module(world2):
    layers = [TiedLayerSpec('proj', nn.Linear, 4, 4, tied_weight_attr=['weight', 'scale']), LayerSpec(nn.ReLU),
              LayerSpec(nn.Linear, 4, 4), TiedLayerSpec('proj', nn.Linear, 4, 4, tied_weight_attr=['weight', 'scale'])]
    with pytest.warns(UserWarning, match=r"tied_weight_attr \['scale'\] is not a parameter"):
        model = PipelineModule(layers, num_stages=2, partition_method='uniform')
    assert model.spec_tuples([None] * 4)[0][7] is None


def test_the_named_attributes_reach_the_engine(world2):
    model = PipelineModule(cases.specs('list'), num_stages=2, partition_method='uniform')
    tuples = model.spec_tuples([None] * 4)
    assert [t[7] for t in tuples] == [['weight', 'scale'], None, None, ['weight', 'scale']]


@pytest.fixture
def world2(monkeypatch):
    for name, value in [('WORLD_SIZE', '2'), ('RANK', '0'), ('LOCAL_RANK', '0'), ('LOCAL_WORLD_SIZE', '2'),
                        ('MASTER_ADDR', '127.0.0.1'), ('MASTER_PORT', '29999')]:
        monkeypatch.setenv(name, value)
