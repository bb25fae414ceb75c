"""The skip API (pipetrain.skip): declarations, namespaces, verification, and skips carried
across partitions by GPipe with the same gradients as without a pipeline."""
import copy
import gc
import json
import os
import subprocess
import sys

import pytest
import torch
from torch import nn

import pipetrain
from pipetrain import GPipe, _C
from pipetrain.pipe import LayerSpec, PipelineModule
from pipetrain.skip import Namespace, pop, skippable, stash, verify_skippables


@skippable(stash=['skip'])
class Stash(nn.Module):
    def forward(self, x):
        yield stash('skip', x)
        return x


@skippable(pop=['skip'])
class PopAdd(nn.Module):
    def forward(self, x):
        skip = yield pop('skip')
        return x + skip


@skippable(stash=['1to3'])
class Layer1(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        yield stash('1to3', x)
        return self.fc(x)


@skippable(pop=['1to3'])
class Layer3(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        skip = yield pop('1to3')
        return self.fc(x) * skip


def test_a_skippable_wraps_its_module_and_names():
    layer = Layer1()
    assert isinstance(layer.module.fc, nn.Linear)
    assert Layer1.stashable_names == frozenset({'1to3'}) and Layer1.poppable_names == frozenset()
    assert 'module.fc.weight' in layer.state_dict()
    assert Layer1.__name__ == 'Layer1'


def test_skips_work_without_a_pipeline():
    model = nn.Sequential(Stash(), nn.Linear(4, 4), PopAdd())
    x = torch.randn(3, 4)
    torch.testing.assert_close(model(x), model[1](x) + x)


@pytest.mark.parametrize('balance', [[1, 1, 1], [2, 1], [1, 2], [3]])
@pytest.mark.parametrize('checkpoint', ['never', 'except_last', 'always'])
def test_skips_cross_partitions_with_the_plain_models_gradients(balance, checkpoint):
    torch.manual_seed(2)
    plain = nn.Sequential(Layer1(), nn.Linear(4, 4), Layer3())
    piped = copy.deepcopy(plain)
    gpipe = GPipe(piped, balance, devices=['cpu'] * len(balance), chunks=3, checkpoint=checkpoint)
    x = torch.randn(6, 4, requires_grad=True)
    x2 = x.detach().clone().requires_grad_()
    plain(x).sum().backward()
    out = gpipe(x2)
    out.sum().backward()
    torch.testing.assert_close(out, plain(x).detach(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(x2.grad, x.grad, rtol=1e-5, atol=1e-6)
    for (name, a), b in zip(plain.named_parameters(), piped.parameters()):
        torch.testing.assert_close(b.grad, a.grad, rtol=1e-5, atol=1e-6, msg=name)


def test_namespaces_let_one_block_repeat():
    ns1, ns2 = Namespace(), Namespace()
    model = nn.Sequential(Stash().isolate(ns1), Stash().isolate(ns2), PopAdd().isolate(ns2), PopAdd().isolate(ns1))
    verify_skippables(model)
    gpipe = GPipe(copy.deepcopy(model), [1, 1, 1, 1], devices=['cpu'] * 4, chunks=2)
    x = torch.randn(4, 4)
    torch.testing.assert_close(gpipe(x), x * 3)
    torch.testing.assert_close(model(x), x * 3)
    with pytest.raises(TypeError, match="redeclared 'skip' as stashable but not isolated by namespace"):
        verify_skippables(nn.Sequential(Stash(), Stash(), PopAdd(), PopAdd()))


def test_isolate_only_some_names():
    @skippable(stash=['a', 'b'])
    class Two(nn.Module):
        def forward(self, x):
            yield stash('a', x)
            yield stash('b', x)
            return x

    ns = Namespace()
    layer = Two().isolate(ns, only=['a'])
    assert dict(layer.stashable()) == {ns: 'a', _default(): 'b'}
    assert layer.namespaced('a') == (ns.name, 'a') and layer.namespaced('b') == ('', 'b')
    with pytest.raises(ValueError, match='declares no skip named'):
        Two().isolate(ns, only=['c'])


def _default():
    from pipetrain.skip.namespace import default_namespace  # pylint: disable=import-outside-toplevel
    return default_namespace


def test_namespace_copies_are_equal_and_distinct_namespaces_are_not():
    ns = Namespace()
    assert copy.deepcopy(ns) == ns and Namespace() != ns


@pytest.mark.parametrize('model, message', [
    (lambda: nn.Sequential(PopAdd()), "'0' declared 'skip' as poppable but it was not stashed"),
    (lambda: nn.Sequential(Stash()), "no module declared 'skip' as poppable but stashed"),
    (lambda: nn.Sequential(Stash(), PopAdd(), PopAdd()), "'2' redeclared 'skip' as poppable"),
])
def test_verify_skippables_lists_mismatches(model, message):
    with pytest.raises(TypeError, match='one or more pairs of stash and pop do not match') as info:
        verify_skippables(model())
    assert message in str(info.value)


def test_both_stash_and_pop_of_one_name_is_refused():
    @skippable(stash=['x'], pop=['x'])
    class Both(nn.Module):
        def forward(self, x):
            yield stash('x', x)
            return (yield pop('x'))

    with pytest.raises(TypeError, match="declared 'x' both as stashable and as poppable"):
        verify_skippables(nn.Sequential(Both()))


def test_gpipe_verifies_skips_before_running():
    with pytest.raises(TypeError, match='do not match'):
        GPipe(nn.Sequential(PopAdd()), [1], devices=['cpu'])


def test_undeclared_names_are_refused_when_used():
    @skippable(stash=['declared'])
    class Wrong(nn.Module):
        def forward(self, x):
            yield stash('other', x)
            return x

    with pytest.raises(RuntimeError, match="tried to stash 'other', which it did not declare"):
        Wrong()(torch.randn(1))


def test_none_is_an_optional_skip():
    @skippable(stash=['maybe'])
    class Maybe(nn.Module):
        def forward(self, x):
            yield stash('maybe', None)
            return x

    @skippable(pop=['maybe'])
    class UseIfAny(nn.Module):
        def forward(self, x):
            skip = yield pop('maybe')
            return x if skip is None else x + skip

    gpipe = GPipe(nn.Sequential(Maybe(), nn.Linear(2, 2), UseIfAny()), [1, 2], devices=['cpu', 'cpu'], chunks=2)
    out = gpipe(torch.randn(4, 2))
    out.sum().backward()


def test_a_skippable_without_yields_is_a_plain_layer_only_when_it_declares_nothing():
    @skippable()
    class Plain(nn.Module):
        def forward(self, x):
            return x * 2

    @skippable(stash=['unused'])
    class Unused(nn.Module):
        def forward(self, x):
            return x * 2

    torch.testing.assert_close(Plain()(torch.ones(2)), torch.full((2,), 2.0))
    with pytest.raises(TypeError):
        verify_skippables(nn.Sequential(Unused()))  # the declaration still has to match
    with pytest.raises(RuntimeError, match="'unused' must be stashed but have not"):
        Unused()(torch.ones(2))


@skippable(stash=['a', 'b'])
class DeclaresTwoStashesOne(nn.Module):
    def forward(self, x):
        yield stash('a', x)
        return x


@skippable(pop=['a', 'b'])
class DeclaresTwoPopsOne(nn.Module):
    def forward(self, x):
        a = yield pop('a')
        return x + a


def test_every_declared_name_must_be_stashed_and_popped_in_each_forward():
    # torchgpipe's Skippable checks this after each forward, in a pipeline or not.
    with pytest.raises(RuntimeError, match=r"^'b' must be stashed but have not: DeclaresTwoStashesOne") as info:
        DeclaresTwoStashesOne()(torch.ones(1))
    assert isinstance(info.value, pipetrain.ModuleError) and 'None for an optional skip' in str(info.value)
    # Plain Sequential: stash a and b, pop only a. b is not left for the next forward.
    model = nn.Sequential(Stash2(), DeclaresTwoPopsOne())
    with pytest.raises(RuntimeError, match=r"^'b' must be popped but have not: DeclaresTwoPopsOne"):
        model(torch.ones(1))
    assert not _C.skip_contains('', 'b')
    with pytest.raises(RuntimeError, match="'b' must be stashed but have not"):
        nn.Sequential(DeclaresTwoStashesOne(), DeclaresTwoPopsOne())(torch.ones(1))
    _C.skip_pop('', 'a')  # what the failed forward left


@skippable(stash=['a', 'b'])
class Stash2(nn.Module):
    def forward(self, x):
        yield stash('a', x)
        yield stash('b', x * 2)
        return x


@skippable(pop=['a', 'b'])
class Pop2(nn.Module):
    def forward(self, x):
        a = yield pop('a')
        b = yield pop('b')
        return x + a + b


@pytest.mark.parametrize('balance', [[1, 1], [2]])
def test_gpipe_raises_for_a_declared_skip_a_forward_left_out(balance):
    for model, message in ((nn.Sequential(DeclaresTwoStashesOne(), Pop2()), "'b' must be stashed but have not"),
                           (nn.Sequential(Stash2(), DeclaresTwoPopsOne()), "'b' must be popped but have not")):
        gpipe = GPipe(model, balance, devices=['cpu'] * len(balance), chunks=2)
        with pytest.raises(RuntimeError, match=message):
            gpipe(torch.ones(2, 1))
    good = GPipe(nn.Sequential(Stash2(), Pop2()), balance, devices=['cpu'] * len(balance), chunks=2)
    torch.testing.assert_close(good(torch.ones(2, 1)), torch.full((2, 1), 4.0))


def _engine(layers):
    cfg = {'train_batch_size': 4, 'train_micro_batch_size_per_gpu': 2, 'steps_per_print': 10**6,
           'optimizer': {'type': 'SGD', 'params': {'lr': 0.1}}}
    engine, _, _, _ = pipetrain.initialize(model=PipelineModule(layers=layers, num_stages=1, loss_fn=nn.MSELoss()),
                                           config=cfg)
    return engine


@pytest.mark.parametrize('layers, message', [
    ([LayerSpec(DeclaresTwoStashesOne), LayerSpec(nn.Linear, 1, 1), LayerSpec(Pop2)], "'b' must be stashed but have not"),
    ([LayerSpec(Stash2), LayerSpec(nn.Linear, 1, 1), LayerSpec(DeclaresTwoPopsOne)], "'b' must be popped but have not"),
])
def test_the_engine_raises_for_a_declared_skip_a_layer_left_out(layers, message):
    engine = _engine(layers)
    data = iter([(torch.ones(2, 1), torch.ones(2, 1))] * 2)
    try:
        with pytest.raises(RuntimeError, match=message):
            engine.train_batch(data)
    finally:
        del engine
        gc.collect()


HASH_SEED_SCRIPT = """
import json, torch
from torch import nn
import pipetrain
from pipetrain.pipe import LayerSpec, PipelineModule
from pipetrain.skip import pop, skippable, stash
NAMES = ['alpha', 'beta', 'gamma', 'delta']
@skippable(stash=NAMES)
class StashAll(nn.Module):
    def forward(self, x):
        for n in NAMES:
            yield stash(n, x)
        return x
@skippable(pop=NAMES)
class PopAll(nn.Module):
    def forward(self, x):
        for n in NAMES:
            x = x + (yield pop(n))
        return x
torch.manual_seed(0)
layers = [LayerSpec(nn.Linear, 4, 4), LayerSpec(StashAll), LayerSpec(nn.Linear, 4, 4), PopAll(), LayerSpec(nn.Linear, 4, 2)]
engine, _, _, _ = pipetrain.initialize(model=PipelineModule(layers=layers, num_stages=1, loss_fn=nn.MSELoss()),
                                       config={'train_batch_size': 4, 'train_micro_batch_size_per_gpu': 2,
                                               'optimizer': {'type': 'SGD', 'params': {'lr': 0.1}},
                                               'steps_per_print': 10**6})
loss = engine.train_batch(iter([(torch.rand(2, 4), torch.rand(2, 2)) for _ in range(2)]))
print(json.dumps({'unsorted': list(frozenset(NAMES)) != sorted(NAMES), 'loss': float(loss)}))
"""


def test_skippables_with_several_names_train_whatever_the_hash_seed(tmp_path):
    # Python iterates a skippable's declared names (frozensets) in an order PYTHONHASHSEED picks;
    # the engine must not depend on it.
    script = tmp_path / 'seeded.py'
    script.write_text(HASH_SEED_SCRIPT)
    reports = []
    for seed in ('0', '1', '2'):
        # A fresh rendezvous of its own: not the port an engine of this process left in the environment.
        env = {k: v for k, v in os.environ.items()
               if k not in ('MASTER_ADDR', 'MASTER_PORT', 'RANK', 'LOCAL_RANK', 'WORLD_SIZE', 'LOCAL_WORLD_SIZE')}
        env.update(PYTHONHASHSEED=seed, OMP_NUM_THREADS='1')
        result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=120,
                                check=False)
        assert result.returncode == 0, f'PYTHONHASHSEED={seed}:\n{result.stderr[-3000:]}'
        reports.append(json.loads(result.stdout.splitlines()[-1]))
    assert sum(r['unsorted'] for r in reports) >= 2  # the seeds do iterate the names out of order
    assert len({r['loss'] for r in reports}) == 1
