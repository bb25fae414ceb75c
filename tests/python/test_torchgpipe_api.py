"""torchgpipe's public API as its users' tests check it, run on pipetrain (only the import
changed): GPipe's arguments and errors, deferred batch norm, the checkpointing flags, the
balance functions' signatures, and the skip API's rules. Written from torchgpipe's documented
behaviour; where pipetrain differs on purpose the test says how."""
import copy
import inspect

import pytest
import torch
from torch import nn

import pipetrain
from pipetrain import GPipe, is_checkpointing, is_recomputing
from pipetrain.balance import balance_by_size, balance_by_time
from pipetrain.batchnorm import DeferredBatchNorm
from pipetrain.skip import Namespace, pop, skippable, stash, verify_skippables


def linears(n, width=2):
    return [nn.Linear(width, width) for _ in range(n)]


# -- GPipe's arguments --------------------------------------------------------------------------

@pytest.mark.parametrize('balance', [(x for x in [2, 2]), iter([2, 2]), range(2, 3), (2, 2), [2, 2]],
                         ids=['generator', 'iterator', 'range', 'tuple', 'list'])
def test_balance_is_any_iterable_read_once(balance):
    layers = linears(4) if not isinstance(balance, range) else linears(2)
    model = GPipe(nn.Sequential(*layers), balance, devices=['cpu'] * 2, chunks=2)
    expected = [2, 2] if len(layers) == 4 else [2]
    assert model.balance == expected and isinstance(model.balance, list)
    assert [len(p) for p in model.partitions] == expected
    x = torch.rand(4, 2)
    torch.testing.assert_close(model(x), nn.Sequential(*layers)(x))


def test_a_generator_balance_without_devices():
    # The default devices count the partitions: that must not use up the generator.
    model = GPipe(nn.Sequential(*linears(4)), balance=(x for x in [2, 2]))
    assert model.balance == [2, 2] and len(model.devices) == 2
    assert model(torch.rand(2, 2)).shape == (2, 2)


@pytest.mark.parametrize('devices', [['cpu', 'cpu'], [torch.device('cpu')] * 2, ('cpu', 'cpu', 'cpu')])
def test_devices_are_normalised_and_extras_dropped(devices):
    model = GPipe(nn.Sequential(*linears(2)), [1, 1], devices=devices)
    assert model.devices == [torch.device('cpu')] * 2


def test_the_errors_are_torchgpipes_types_and_messages():
    model = nn.Sequential(*linears(2))
    with pytest.raises(ValueError, match='balance is required'):
        GPipe(model)
    with pytest.raises(ValueError, match=r'module and sum of balance have different length \(module: 2, sum of '
                                         r'balance: 3\)'):
        GPipe(model, [1, 2], devices=['cpu'] * 2)
    with pytest.raises(ValueError, match=r'all balance numbers must be positive integer \(balance: \[0, 2\]\)'):
        GPipe(model, [0, 2], devices=['cpu'] * 2)
    with pytest.raises(IndexError, match=r'too few devices to hold given partitions \(devices: 1, partitions: 2\)'):
        GPipe(model, [1, 1], devices=['cpu'])
    with pytest.raises(ValueError, match='number of chunks must be positive integer'):
        GPipe(model, [2], devices=['cpu'], chunks=0)
    with pytest.raises(ValueError, match="checkpoint is not one of 'always', 'except_last', or 'never'"):
        GPipe(model, [2], devices=['cpu'], checkpoint='sometimes')
    with pytest.raises(TypeError, match='module must be nn.Sequential to be partitioned'):
        GPipe(nn.ModuleList(linears(2)), [2], devices=['cpu'])
    # Every balance error recommends the balance functions, as torchgpipe's recommends its own.
    with pytest.raises(ValueError, match=r'pipetrain\.balance'):
        GPipe(model, [3], devices=['cpu'])


def test_moving_is_denied_with_torchgpipes_error_and_casting_allowed():
    model = GPipe(nn.Sequential(*linears(2)), [1, 1], devices=['cpu'] * 2)
    moves = [lambda: model.cuda(), lambda: model.cpu(), lambda: model.to('cpu'), lambda: model.to(0),
             lambda: model.to(torch.device('cpu')), lambda: model.to(device='cpu'), lambda: model.to(torch.rand(1)),
             lambda: model.to(tensor=torch.rand(1))]
    for move in moves:
        with pytest.raises(TypeError, match='denied to move parameters and buffers, because GPipe should manage '
                                            'device placement'):
            move()
    model.to(torch.double)
    assert all(p.dtype == torch.double for p in model.parameters())
    model.to(dtype=torch.float)
    assert model(torch.rand(2, 2)).dtype == torch.float


def test_inputs_must_be_tensors_or_tuples_of_tensors():
    model = GPipe(nn.Sequential(*linears(1)), [1], devices=['cpu'])
    for bad, name in ((42, 'int'), ('x', 'str'), ([torch.rand(1, 2)], 'list'), ((torch.rand(1, 2), 'x'), 'str')):
        with pytest.raises(TypeError, match=f'expected Tensor, but got {name}'):
            model(bad)


def test_an_empty_mini_batch_goes_through():
    model = GPipe(nn.Sequential(*linears(2)), [1, 1], devices=['cpu'] * 2, chunks=4)
    assert model(torch.rand(0, 2)).shape == (0, 2)


def test_tuples_keep_their_shape_and_each_tensor_is_chunked():
    class Split(nn.Module):
        def forward(self, x):
            return x[:, :1], x[:, 1:] * 2

    class Join(nn.Module):
        def forward(self, pair):
            a, b = pair
            return (a + b,)

    model = GPipe(nn.Sequential(Split(), Join()), [1, 1], devices=['cpu'] * 2, chunks=3)
    x = torch.rand(5, 2, requires_grad=True)
    out = model(x)
    assert isinstance(out, tuple) and len(out) == 1
    torch.testing.assert_close(out[0], x[:, :1] + x[:, 1:] * 2)
    out[0].sum().backward()
    torch.testing.assert_close(x.grad, torch.tensor([[1.0, 2.0]]).expand(5, 2))


# -- checkpointing ----------------------------------------------------------------------------

@pytest.mark.parametrize('mode, forward_flags, recomputed', [
    ('always', [(True, False), (True, False)], 2),
    ('except_last', [(True, False), (False, False)], 1),
    ('never', [(False, False), (False, False)], 0),
])
def test_is_checkpointing_and_is_recomputing_inside_layers(mode, forward_flags, recomputed):
    seen = []

    class Probe(nn.Module):
        def forward(self, x):
            seen.append((is_checkpointing(), is_recomputing()))
            return x * 2

    model = GPipe(nn.Sequential(nn.Linear(2, 2), Probe()), [1, 1], devices=['cpu'] * 2, chunks=2, checkpoint=mode)
    out = model(torch.rand(4, 2))
    assert seen == forward_flags
    out.sum().backward()
    assert seen[2:] == [(False, True)] * recomputed
    assert (is_checkpointing(), is_recomputing()) == (False, False)  # outside a layer
    seen.clear()
    with torch.no_grad():
        model(torch.rand(4, 2))
    assert seen == [(False, False)] * 2  # without autograd nothing is checkpointed
    seen.clear()
    model.eval()
    model(torch.rand(4, 2))
    assert seen == [(False, False)] * 2  # evaluation checkpoints nothing


def test_except_last_leaves_the_last_micro_batch_that_exists_unchecked():
    seen = []

    class Probe(nn.Module):
        def forward(self, x):
            seen.append(is_checkpointing())
            return x

    model = GPipe(nn.Sequential(Probe()), [1], devices=['cpu'], chunks=4, checkpoint='except_last')
    model(torch.rand(2, 2, requires_grad=True))
    assert seen == [True, False]  # 2 micro-batches of 4 chunks (torchgpipe: both checkpointed)


# -- deferred batch norm ------------------------------------------------------------------------

def tilted(rows, seed):
    """A batch whose channels have very different means and variances."""
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(rows, 3, 4, 4, generator=g)
    return x * torch.tensor([1.0, 10.0, 100.0]).view(1, 3, 1, 1) + torch.arange(rows).float().view(rows, 1, 1, 1)


@pytest.mark.parametrize('checkpoint', ['always', 'except_last', 'never'])
@pytest.mark.parametrize('momentum', [0.1, None])
def test_deferred_batch_norm_tracks_statistics_per_mini_batch(checkpoint, momentum):
    bn = nn.BatchNorm2d(3, momentum=momentum)
    model = GPipe(nn.Sequential(nn.Identity(), copy.deepcopy(bn)), [1, 1], devices=['cpu'] * 2, chunks=4,
                  checkpoint=checkpoint, deferred_batch_norm=True)
    deferred = model[1]
    assert isinstance(deferred, DeferredBatchNorm) and deferred.chunks == 4
    for step in range(3):
        x = tilted(8, step)
        model(x).mean().backward()  # recomputation must not count a micro-batch twice
        bn(x)
        torch.testing.assert_close(deferred.running_mean, bn.running_mean, rtol=1e-5, atol=1e-4)
        torch.testing.assert_close(deferred.running_var, bn.running_var, rtol=1e-5, atol=1e-3)
        assert int(deferred.num_batches_tracked) == int(bn.num_batches_tracked) == step + 1
    # Evaluation normalises by the running statistics, as BatchNorm's does.
    model.eval()
    bn.eval()
    x = tilted(8, 9)
    torch.testing.assert_close(model(x), bn(x), rtol=1e-5, atol=1e-4)


def test_deferred_batch_norm_normalises_each_micro_batch_by_its_own_statistics():
    bn = nn.BatchNorm2d(3)
    model = GPipe(nn.Sequential(copy.deepcopy(bn)), [1], devices=['cpu'], chunks=2, deferred_batch_norm=True)
    x = tilted(4, 0)
    torch.testing.assert_close(model(x), torch.cat([bn(x[:2]), bn(x[2:])]), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize('rows', [3, 5])
def test_deferred_batch_norm_commits_a_short_mini_batch_at_its_end(rows):
    # Fewer micro-batches than chunks (3 rows in 4 chunks, or 5 rows as 3 micro-batches): pipetrain's
    # GPipe commits after each forward; torchgpipe would wait for the missing micro-batches and mix
    # them into the next mini-batch's statistics.
    bn = nn.BatchNorm2d(3)
    model = GPipe(nn.Sequential(copy.deepcopy(bn)), [1], devices=['cpu'], chunks=4, deferred_batch_norm=True)
    for step in range(2):
        x = tilted(rows, step)
        model(x)
        bn(x)
    torch.testing.assert_close(model[0].running_mean, bn.running_mean, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(model[0].running_var, bn.running_var, rtol=1e-5, atol=1e-3)
    assert int(model[0].num_batches_tracked) == 2


def test_deferred_batch_norm_commits_by_itself_outside_gpipe():
    bn = nn.BatchNorm2d(3, momentum=None)
    dbn = DeferredBatchNorm.convert_deferred_batch_norm(copy.deepcopy(bn), chunks=4)
    x = tilted(8, 1)
    for part in x.chunk(4):
        dbn(part)
    bn(x)
    torch.testing.assert_close(dbn.running_mean, bn.running_mean, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(dbn.running_var, bn.running_var, rtol=1e-5, atol=1e-3)
    assert int(dbn.num_batches_tracked) == 1 and dbn.tracked == 0 and not dbn.sum.requires_grad


def test_convert_deferred_batch_norm_shares_the_tensors_and_keeps_what_it_cannot_convert():
    untracked = nn.BatchNorm2d(3, track_running_stats=False)
    assert DeferredBatchNorm.convert_deferred_batch_norm(untracked, chunks=2) is untracked
    dbn = DeferredBatchNorm(3, chunks=2)
    assert DeferredBatchNorm.convert_deferred_batch_norm(dbn, chunks=2) is dbn
    assert DeferredBatchNorm.convert_deferred_batch_norm(dbn, chunks=3) is not dbn
    nested = nn.Sequential(nn.Conv2d(3, 3, 1), nn.Sequential(nn.BatchNorm2d(3)))
    converted = DeferredBatchNorm.convert_deferred_batch_norm(nested, chunks=2)
    inner = converted[1][0]
    assert isinstance(inner, DeferredBatchNorm) and inner.weight is nested[1][0].weight
    assert inner.running_mean is nested[1][0].running_mean
    with pytest.raises(ValueError, match='expected at least 3D input'):
        DeferredBatchNorm(3)(torch.rand(2, 3))


# -- balance ------------------------------------------------------------------------------------

def test_balance_functions_take_torchgpipes_arguments():
    by_time = inspect.signature(balance_by_time).parameters
    by_size = inspect.signature(balance_by_size).parameters
    assert list(by_time)[:3] == ['partitions', 'module', 'sample']
    assert list(by_size)[:3] == ['partitions', 'module', 'input']
    for keyword in ('timeout', 'device'):
        assert by_time[keyword].kind is inspect.Parameter.KEYWORD_ONLY
    for keyword in ('chunks', 'param_scale', 'device'):
        assert by_size[keyword].kind is inspect.Parameter.KEYWORD_ONLY
    model = nn.Sequential(nn.Conv2d(3, 2, 1), nn.Flatten(), nn.Linear(128, 10))
    model.eval()
    balance = balance_by_time(2, model, torch.rand(10, 3, 8, 8), timeout=0.05, device='cpu')
    assert len(balance) == 2 and sum(balance) == 3 and min(balance) >= 1
    assert not model.training  # profiled in training mode on a copy; the model keeps its mode
    balance = balance_by_size(2, model, torch.rand(10, 3, 8, 8), chunks=2, param_scale=4.0, device='cpu')
    assert len(balance) == 2 and sum(balance) == 3
    with pytest.raises(TypeError):
        balance_by_time(2, model, torch.rand(10, 3, 8, 8), 1.0)  # timeout is keyword-only


def test_balance_cost_splits_as_torchgpipes_blockpartition_and_refuses_what_it_refuses():
    from pipetrain.balance import balance_cost  # pylint: disable=import-outside-toplevel
    assert balance_cost([1, 2, 3, 4, 5, 6], 2) == [4, 2]
    assert balance_cost([0, 0], 2) == [1, 1]
    model = nn.Sequential(*linears(2))
    for partitions in (0, -1, 3):  # non-positive, or more partitions than layers
        with pytest.raises(ValueError, match='cannot split 2 layers'):
            balance_by_time(partitions, model, torch.rand(2, 2), timeout=0.01, device='cpu')
    with pytest.raises(ValueError):
        balance_cost([], 1)


def test_balance_by_time_leaves_existing_gradients_alone():
    # torchgpipe refuses a model whose parameters have gradients; pipetrain profiles a copy, so
    # it accepts it and the gradients stay as they were.
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
    model(torch.rand(2, 4)).sum().backward()
    before = [p.grad.clone() for p in model.parameters()]
    balance_by_time(2, model, torch.rand(2, 4), timeout=0.05, device='cpu')
    for p, g in zip(model.parameters(), before):
        torch.testing.assert_close(p.grad, g)


# -- skips --------------------------------------------------------------------------------------

@skippable(stash=['1to3'])
class Layer1(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(2, 2)

    def forward(self, x):
        yield stash('1to3', x)
        return self.fc(x)


@skippable(pop=['1to3'])
class Layer3(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(2, 2)

    def forward(self, x):
        skip = yield pop('1to3')
        return self.fc(x) + skip


@pytest.mark.parametrize('balance', [[3], [1, 2], [2, 1], [1, 1, 1]])
@pytest.mark.parametrize('checkpoint', ['never', 'always', 'except_last'])
def test_1to3_matches_the_plain_model(balance, checkpoint):
    plain = nn.Sequential(Layer1(), nn.Linear(2, 2), Layer3())
    piped = GPipe(copy.deepcopy(plain), balance, devices=['cpu'] * len(balance), chunks=3, checkpoint=checkpoint)
    x = torch.rand(6, 2, requires_grad=True)
    y = x.detach().clone().requires_grad_()
    plain(x).norm().backward()
    piped(y).norm().backward()
    torch.testing.assert_close(y.grad, x.grad)
    for a, b in zip(plain.parameters(), piped.parameters()):
        torch.testing.assert_close(b.grad, a.grad)


def test_a_none_skip_reaches_its_pop():
    @skippable(stash=['none'])
    class StashNone(nn.Module):
        def forward(self, x):
            yield stash('none', None)
            return x

    @skippable(pop=['none'])
    class PopNone(nn.Module):
        def forward(self, x):
            none = yield pop('none')
            assert none is None
            return x

    model = GPipe(nn.Sequential(StashNone(), PopNone()), [1, 1], devices=['cpu'] * 2, chunks=5)
    x = torch.rand(10, requires_grad=True)
    model(x).sum().backward()
    assert x.grad.mean().item() == 1


def test_stash_pop_rules_outside_gpipe():
    @skippable(stash=['foo'])
    class Stash(nn.Module):
        def forward(self, x):
            yield stash('foo', x)
            return x * 2

    @skippable(pop=['foo'])
    class Pop(nn.Module):
        def forward(self, x):
            foo = yield pop('foo')
            return foo

    @skippable()
    class Undeclared(nn.Module):
        def forward(self, x):
            yield stash('foo', x)
            return x

    @skippable(pop=['foo'])
    class PopNothing(nn.Module):
        def forward(self, x):
            yield pop('foo')
            return x

    assert Pop()(Stash()(torch.tensor(42))).item() == 42
    with pytest.raises(RuntimeError):
        Undeclared()(torch.tensor(1))
    with pytest.raises(RuntimeError):
        PopNothing()(torch.tensor(1))  # nothing was stashed
    Stash()(torch.tensor(1))
    with pytest.raises(RuntimeError, match="'foo' must be popped but have not"):
        skippable(pop=['foo'])(nn.Identity)()(torch.tensor(1))  # declares a pop and does not pop


def test_namespaces_are_distinct_copies_are_equal_and_isolate_returns_the_layer():
    ns1, ns2 = Namespace(), Namespace()
    assert ns1 != ns2 and copy.copy(ns1) == ns1 and copy.copy(ns1) is not ns1
    layer = Layer1()
    assert layer.isolate(ns1) is layer
    model = nn.Sequential(Layer1().isolate(ns1), Layer1().isolate(ns2), Layer3().isolate(ns2), Layer3().isolate(ns1))
    verify_skippables(model)
    x = torch.rand(4, 2)
    torch.testing.assert_close(GPipe(copy.deepcopy(model), [2, 2], devices=['cpu'] * 2, chunks=2)(x), model(x))


def test_isolate_only_takes_one_name_as_a_string_too():
    # torchgpipe's docstring writes isolate(ns, only='alice'); torchgpipe then iterates the string's
    # letters. pipetrain takes a string as the one name it is.
    @skippable(stash=['alice', 'bob'])
    class StashStash(nn.Module):
        def forward(self, x):
            yield stash('alice', x)
            yield stash('bob', x)
            return x

    ns_alice, ns_bob = Namespace(), Namespace()
    layer = StashStash().isolate(ns_alice, only='alice').isolate(ns_bob, only=['bob'])
    assert layer.namespaced('alice') == (ns_alice.name, 'alice') and layer.namespaced('bob') == (ns_bob.name, 'bob')


def test_verify_skippables_messages_are_torchgpipes():
    @skippable(stash=['x'], pop=['x'])
    class Both(nn.Module):
        def forward(self, x):
            return x

    cases = [
        (nn.Sequential(Layer1(), nn.Linear(2, 2)), "no module declared '1to3' as poppable but stashed"),
        (nn.Sequential(nn.Linear(2, 2), Layer3()), "'1' declared '1to3' as poppable but it was not stashed"),
        (nn.Sequential(Layer1(), Layer3(), Layer3()), "'2' redeclared '1to3' as poppable but not isolated by namespace"),
        (nn.Sequential(Layer1(), Layer1(), Layer3()), "'1' redeclared '1to3' as stashable but not isolated by namespace"),
        (nn.Sequential(Both()), "'0' declared 'x' both as stashable and as poppable"),
    ]
    for model, message in cases:
        with pytest.raises(TypeError, match='one or more pairs of stash and pop do not match') as info:
            verify_skippables(model)
        assert f'* {message}' in str(info.value)
    with pytest.raises(TypeError, match='do not match'):
        GPipe(nn.Sequential(Layer1(), nn.Linear(2, 2)), [1, 1], devices=['cpu'] * 2)  # checked at construction


def test_skippable_repr_and_module():
    layer = Layer1()
    assert repr(layer).startswith('@skippable(Layer1(') and isinstance(layer.module.fc, nn.Linear)
    assert pipetrain.skip.Skippable in type(layer).__mro__


def test_balance_functions_profile_a_model_with_skips():
    model = nn.Sequential(Layer1(), nn.Linear(2, 2), Layer3())
    for balance in (balance_by_time(2, model, torch.rand(4, 2), timeout=0.05, device='cpu'),
                    balance_by_size(2, model, torch.rand(4, 2), device='cpu')):
        assert len(balance) == 2 and sum(balance) == 3
        GPipe(copy.deepcopy(model), balance, devices=['cpu'] * 2, chunks=2)(torch.rand(4, 2)).sum().backward()
