"""pipetrain.GPipe as torchgpipe's users know it: arguments, attributes, errors, the module
interface, and behaviour at the edges (tuples, non-tensors, exceptions, empty models)."""
from collections import OrderedDict
import copy
import json
import threading
import time
import warnings

import pytest
import torch
from torch import nn

import pipetrain
from pipetrain import GPipe
from pipetrain.gpipe import verify_module


def linears(n, width=1):
    return [nn.Linear(width, width) for _ in range(n)]


def test_parameters_are_the_models_own():
    a, b = linears(2)
    gpipe = GPipe(nn.Sequential(a, b), balance=[1, 1], devices=['cpu', 'cpu'])
    assert [id(p) for p in gpipe.parameters()] == [id(p) for p in (a.weight, a.bias, b.weight, b.bias)]


def test_public_attributes_are_normalised():
    class Text:
        def __str__(self):
            return 'never'

    gpipe = GPipe(nn.Sequential(nn.Linear(1, 1)), balance=(1,), devices=('cpu',), chunks=3.0, checkpoint=Text())
    assert gpipe.balance == [1]
    assert gpipe.devices == [torch.device('cpu')]
    assert gpipe.chunks == 3 and isinstance(gpipe.chunks, int)
    assert gpipe.checkpoint == 'never' and isinstance(gpipe.checkpoint, str)


@pytest.mark.parametrize('balance', [[3], [1, 2], [1, 1, 1]])
def test_behaves_like_a_sequential(balance):
    a, b, c = linears(3)
    gpipe = GPipe(nn.Sequential(a, b, c), balance, devices=['cpu'] * 3)
    assert len(gpipe) == 3
    assert list(gpipe) == [a, b, c]
    assert gpipe[0] is a and gpipe[2] is c and gpipe[-1] is c and gpipe[-3] is a
    for bad in (3, -4):
        with pytest.raises(IndexError):
            gpipe[bad]  # pylint: disable=pointless-statement


def test_balance_must_cover_the_model_and_names_pipetrain_balance():
    model = nn.Sequential(*linears(2))
    for balance in ([1], [3], [1, 2]):
        with pytest.raises(ValueError, match='different length') as info:
            GPipe(model, balance=balance, devices=['cpu'] * 2)
        assert 'pipetrain.balance' in str(info.value)
    with pytest.raises(ValueError, match='balance is required'):
        GPipe(model)


def test_balance_entries_must_be_positive():
    model = nn.Sequential(*linears(2))
    for balance in ([0, 2], [-1, 3]):
        with pytest.raises(ValueError, match=r'all balance numbers must be positive integer \(balance: '):
            GPipe(model, balance=balance, devices=['cpu'] * 2)


@pytest.mark.parametrize('chunks', [0, -1])
def test_chunks_must_be_positive(chunks):
    with pytest.raises(ValueError, match='number of chunks must be positive integer'):
        GPipe(nn.Sequential(nn.Linear(1, 1)), balance=[1], devices=['cpu'], chunks=chunks)


def test_too_few_devices_is_an_index_error():
    with pytest.raises(IndexError, match=r'too few devices to hold given partitions \(devices: 1, partitions: 4\)'):
        GPipe(nn.Sequential(*linears(4)), balance=[1, 1, 1, 1], devices=['cpu'])


def test_extra_devices_are_dropped_and_cpu_is_the_default_without_cuda():
    gpipe = GPipe(nn.Sequential(*linears(3)), [1, 1, 1], devices=['cpu'] * 5)
    assert gpipe.devices == [torch.device('cpu')] * 3
    if not torch.cuda.is_available():
        assert GPipe(nn.Sequential(*linears(2)), [1, 1]).devices == [torch.device('cpu')] * 2


@pytest.mark.parametrize('rows', [7, 2, 1])
def test_any_batch_size_is_legal(rows):
    model = GPipe(nn.Sequential(nn.Linear(1, 1)), balance=[1], devices=['cpu'], chunks=4)
    with warnings.catch_warnings():
        warnings.simplefilter('error')
        assert model(torch.rand(rows, 1)).shape == (rows, 1)


def test_invalid_checkpoint_mode():
    with pytest.raises(ValueError, match="checkpoint is not one of 'always', 'except_last', or 'never'"):
        GPipe(nn.Sequential(nn.Linear(1, 1)), balance=[1], devices=['cpu'], chunks=2, checkpoint='sometimes')


class CountCalls(nn.Module):
    """A Linear that counts its forwards: a checkpointed micro-batch runs twice, once more in backward."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(1, 1)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return self.linear(x)


@pytest.mark.parametrize('mode, expected', [('always', 2), ('except_last', 1), ('never', 0)])
def test_checkpoint_modes_checkpoint_that_many_micro_batches(mode, expected):
    layer = CountCalls()
    model = GPipe(nn.Sequential(layer), balance=[1], devices=['cpu'], chunks=2, checkpoint=mode)
    model(torch.rand(2, 1)).sum().backward()
    assert layer.calls == 2 + expected


def test_eval_mode_checkpoints_nothing():
    layer = CountCalls()
    model = GPipe(nn.Sequential(layer), balance=[1], devices=['cpu'], chunks=2, checkpoint='always')
    model(torch.rand(2, 1)).sum().backward()
    assert layer.calls == 4
    model.eval()
    model(torch.rand(2, 1)).sum().backward()
    assert layer.calls == 6


def test_no_grad_builds_no_graph_and_partition_hooks_fire():
    model = GPipe(nn.Sequential(nn.Linear(1, 1)), balance=[1], devices=['cpu'], chunks=2)
    seen = []
    model.partitions[0].register_forward_hook(lambda module, args, output: seen.append(output))
    with torch.no_grad():
        model(torch.rand(2, 1))
    assert len(seen) == 2 and all(o.grad_fn is None for o in seen)


def test_a_layers_exception_comes_out_as_itself_with_its_traceback():
    class Expected(Exception):
        pass

    class Raise(nn.Module):
        def forward(self, *_):
            raise Expected('from the layer')

    model = GPipe(nn.Sequential(nn.Linear(1, 1), Raise()), balance=[1, 1], devices=['cpu'] * 2, chunks=2)
    with pytest.raises(Expected, match='from the layer') as info:
        model(torch.rand(2, 1))
    assert any(entry.name == 'forward' and 'Raise' in str(entry.locals.get('self', ''))
               or entry.name == 'forward' for entry in info.traceback)
    notes = getattr(info.value, '__notes__', [])
    assert any('layer 1 (Raise)' in n for n in notes), notes


def test_a_failure_stops_the_earlier_partitions_at_the_next_tick():
    class Expected(Exception):
        pass

    counter = 0

    class Count(nn.Module):
        def forward(self, x):
            nonlocal counter
            time.sleep(0.1)
            counter += 1
            return x

    class Raise(nn.Module):
        def forward(self, x):
            raise Expected()

    class Pass(nn.Module):
        def forward(self, x):
            return x

    model = GPipe(nn.Sequential(Pass(), Pass(), Count(), Raise()), [1, 1, 1, 1], devices=['cpu'] * 4, chunks=3)
    with pytest.raises(Expected):
        model(torch.rand(3))
    # Micro-batch 0 fails in partition 3 at tick 3, when partition 2 runs micro-batch 1; the
    # tick after is never started, so micro-batch 2 never reaches Count.
    assert counter == 2


def test_freeing_a_model_while_a_failed_task_still_runs_python_does_not_hang(tmp_path):
    # Python frees the model with the GIL held; a worker still finishing a Python layer then
    # needs the GIL to return, so the native pipeline must be freed without it. Run apart, so a
    # regression is a failed test rather than a hung suite.
    script = tmp_path / 'free.py'
    script.write_text("""
import gc, time, torch
from torch import nn
from pipetrain import GPipe
class Slow(nn.Module):
    def forward(self, x):
        time.sleep(0.02)
        return x * 2  # a new tensor that Python made, freed by the worker after the failure
class Raise(nn.Module):
    def forward(self, x):
        raise KeyError('boom')
class Pass(nn.Module):
    def forward(self, x):
        return x
for _ in range(80):
    model = GPipe(nn.Sequential(Pass(), Slow(), Raise()), [1, 1, 1], devices=['cpu'] * 3, chunks=3)
    try:
        model(torch.rand(3))
    except KeyError as exc:
        held = exc  # its traceback keeps the model alive in a cycle, freed by the collector below
    del model, held
    gc.collect()
print('freed')
""")
    import subprocess, sys  # pylint: disable=import-outside-toplevel,multiple-imports
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0 and 'freed' in result.stdout, result.stderr


CAUGHT_FAILURES = """
import gc, json, threading, weakref, torch
from torch import nn
from pipetrain import GPipe
class Boom(Exception):
    pass
class Raise(nn.Module):
    def forward(self, x):
        raise Boom('bad batch')
freed_on, caught, main = [], 0, threading.get_ident()
for r in range(300):
    model = GPipe(nn.Sequential(nn.Linear(1, 1), Raise()), [1, 1], devices=['cpu'] * 2, chunks=2)
    weakref.finalize(model, lambda: freed_on.append(threading.get_ident() == main))
    for retry in range(2):  # an OOM retry, a bad batch skipped: caught, and the loop goes on
        try:
            model(torch.rand(2, 1))
        except Boom:  # let go at once, while the workers may still hold their copies
            caught += 1
    del model  # its last references may be the exception's traceback, held natively
    gc.collect(0)
    if r % 100 == 99:
        gc.collect()
gc.collect()
print(json.dumps({'caught': caught, 'freed': len(freed_on), 'on_main': sum(freed_on)}))
"""


def test_caught_failed_forwards_free_their_models_on_the_calling_thread(tmp_path):
    # A layer's exception carries its traceback, which keeps the GPipe alive: were the last
    # reference to it dropped on a pipeline worker, the model and its workers would be destroyed
    # there and the pool would join itself (std::terminate). Run apart, so an abort is a failed
    # test; the finalizers say on which thread each model was freed.
    script = tmp_path / 'caught.py'
    script.write_text(CAUGHT_FAILURES)
    import subprocess, sys  # pylint: disable=import-outside-toplevel,multiple-imports
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(result.stdout.splitlines()[-1]) == {'caught': 600, 'freed': 300, 'on_main': 300}


def test_tuple_inputs_and_outputs():
    class Two(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc_a = nn.Linear(1, 1)
            self.fc_b = nn.Linear(1, 1)

        def forward(self, a_and_b):
            a, b = a_and_b
            return (self.fc_a(a), self.fc_b(b))

    model = GPipe(nn.Sequential(Two()), balance=[1], devices=['cpu'], chunks=2)
    a = torch.rand(10, 1, requires_grad=True)
    b = torch.rand(10, 1, requires_grad=True)
    a_out, b_out = model((a, b))
    (a_out + b_out).mean().backward()
    assert a.grad is not None and b.grad is not None


def test_a_singleton_tuple_stays_a_tuple():
    class One(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(1, 1)

        def forward(self, only):
            (a,) = only
            return (self.fc(a),)

    model = GPipe(nn.Sequential(One()), balance=[1], devices=['cpu'], chunks=2)
    a = torch.rand(10, 1, requires_grad=True)
    (out,) = model((a,))
    out.mean().backward()
    assert all(p.grad is not None for p in model.parameters()) and a.grad is not None


def test_varargs_are_refused():
    model = GPipe(nn.Sequential(nn.Linear(1, 1)), balance=[1], devices=['cpu'])
    with pytest.raises(TypeError):
        model(torch.rand(1), torch.rand(1))  # pylint: disable=too-many-function-args


def test_non_tensor_inputs_and_outputs_are_type_errors():
    class Text(nn.Module):
        def forward(self, _):
            return 'hello'

    class Pair(nn.Module):
        def forward(self, x):
            return (x, 'hello')

    for layer in (Text(), Pair()):
        model = GPipe(nn.Sequential(layer), balance=[1], devices=['cpu'])
        with pytest.raises(TypeError, match='str'):
            model(torch.rand(1))
    model = GPipe(nn.Sequential(nn.Linear(1, 1)), balance=[1], devices=['cpu'])
    with pytest.raises(TypeError, match='expected Tensor, but got str'):
        model('hello')
    with pytest.raises(TypeError, match='expected Tensor, but got str'):
        model((torch.rand(1), 'hello'))


def test_devices_and_partitions():
    model = GPipe(nn.Sequential(*linears(2)), [1, 1], devices=['cpu', 'cpu'])
    assert isinstance(model.partitions, nn.ModuleList)
    assert all(isinstance(p, nn.Sequential) for p in model.partitions)
    assert 'partitions.0.0.weight' in model.state_dict()
    assert 'partitions.1.1.bias' in model.state_dict()  # children keep their names


def test_moving_is_denied_casting_is_allowed():
    model = GPipe(nn.Sequential(*linears(2)), [1, 1], devices=['cpu', 'cpu'])
    for move in (lambda: model.cuda(), lambda: model.cpu(), lambda: model.to(torch.device('cuda')),
                 lambda: model.to(0), lambda: model.to('cuda'), lambda: model.to(device=0),
                 lambda: model.to(torch.rand(1)), lambda: model.to(tensor=torch.rand(1))):
        with pytest.raises(TypeError, match='GPipe should manage device placement'):
            move()
    model.to(torch.double)
    assert model(torch.rand(3, 1, dtype=torch.double)).dtype == torch.double
    model.to(dtype=torch.float)
    assert model(torch.rand(3, 1)).dtype == torch.float


def test_an_empty_model_is_the_identity_for_tensors_only():
    model = GPipe(nn.Sequential(), [])
    assert model(torch.tensor(42)) == torch.tensor(42)
    assert model((torch.tensor(42),)) == (torch.tensor(42),)
    with pytest.raises(TypeError):
        model(42)


def test_named_children_keep_their_names_and_gpipe_has_no_getattr_for_them():
    model = GPipe(nn.Sequential(OrderedDict([('a', nn.Linear(1, 1)), ('b', nn.Linear(1, 1))])), [1, 1],
                  devices=['cpu', 'cpu'])
    names = {n for n, _ in model.named_modules()}
    assert {'partitions.0.a', 'partitions.1.b'} <= names
    with pytest.raises(AttributeError):
        model.a  # pylint: disable=pointless-statement


def test_verify_module_errors():
    with pytest.raises(TypeError, match='module must be nn.Sequential to be partitioned'):
        verify_module(nn.Module())
    conv = nn.Conv2d(3, 3, 1)
    with pytest.raises(ValueError, match='module with duplicate children is not supported'):
        verify_module(nn.Sequential(conv, conv))

    class Holder(nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

    with pytest.raises(ValueError, match='module with duplicate parameters in distinct children is not supported'):
        verify_module(nn.Sequential(Holder(conv), Holder(conv)))


def test_a_hung_layer_is_a_timeout_error_not_a_hang():
    release, returned = threading.Event(), threading.Event()

    class Hang(nn.Module):
        def forward(self, x):
            release.wait(120)  # a hang guard only: the test releases it
            returned.set()
            return x

    model = GPipe(nn.Sequential(Hang()), [1], devices=['cpu'], task_timeout=0.5)
    with pytest.raises(pipetrain.TimeoutError, match='task_timeout') as info:
        model(torch.rand(2, 1))
    # The forward gave up on the layer: it returned while the layer still hung.
    assert not returned.is_set()
    assert isinstance(info.value, TimeoutError) and isinstance(info.value, pipetrain.PipelineError)
    release.set()
    assert returned.wait(120)  # the abandoned task ends before the interpreter moves on


def test_native_and_python_layers_are_chosen_by_type():
    class Custom(nn.Linear):
        pass

    linear, custom, relu = nn.Linear(2, 2), Custom(2, 2), nn.ReLU()
    hooked = nn.Linear(2, 2)
    hooked.register_forward_hook(lambda *_: None)
    from pipetrain._layers import native_layer  # pylint: disable=import-outside-toplevel
    assert native_layer(linear, 'a').native and native_layer(relu, 'c').native
    assert not native_layer(custom, 'b').native  # a subclass may change forward
    assert not native_layer(hooked, 'd').native  # its hooks must fire
    assert not native_layer(linear, 'e', native=False).native


def test_deepcopy_of_a_gpipe_model_source_still_works():
    model = nn.Sequential(*linears(2, 4))
    twin = copy.deepcopy(model)
    gpipe = GPipe(model, [1, 1], devices=['cpu', 'cpu'], chunks=2)
    x = torch.rand(4, 4)
    assert torch.allclose(gpipe(x), twin(x))


def test_retain_graph_needs_deferred_linear_off():
    """nn.Linear layers take the fast path by default, whose kept inputs serve one backward:
    retain_graph names the option; without the fast path two backwards add up as without GPipe."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
    x = torch.randn(4, 4)
    out = GPipe(model, balance=[2, 1], devices=['cpu', 'cpu'], chunks=2)(x).sum()
    with pytest.raises(RuntimeError, match='deferred_linear=False'):
        out.backward(retain_graph=True)

    plain = copy.deepcopy(model)
    gpipe = GPipe(model, balance=[2, 1], devices=['cpu', 'cpu'], chunks=2, deferred_linear=False)
    for p in model.parameters():
        p.grad = None
    out = gpipe(x).sum()
    out.backward(retain_graph=True)
    out.backward()
    ref = plain(x).sum()
    ref.backward(retain_graph=True)
    ref.backward()
    for a, b in zip(model.parameters(), plain.parameters()):
        assert torch.allclose(a.grad, b.grad, atol=1e-6)


def test_backward_runs_on_the_partition_workers():
    """The backward of each partition runs on the thread that ran its forward, not the caller's."""
    threads = {}

    class Where(nn.Module):
        def __init__(self, j):
            super().__init__()
            self.j = j
            self.linear = nn.Linear(2, 2)

        def forward(self, x):
            threads.setdefault(('forward', self.j), set()).add(threading.get_ident())
            y = self.linear(x)
            y.register_hook(lambda g: threads.setdefault(('backward', self.j), set()).add(threading.get_ident()))
            return y

    model = GPipe(nn.Sequential(Where(0), Where(1)), balance=[1, 1], devices=['cpu', 'cpu'], chunks=2,
                  checkpoint='never')
    model(torch.randn(4, 2)).sum().backward()
    for j in (0, 1):
        assert threads[('backward', j)] == threads[('forward', j)]
        assert threading.get_ident() not in threads[('backward', j)]
    assert threads[('backward', 0)] != threads[('backward', 1)]


def test_a_step_s_timeline_trace_and_bubble():
    """Every task of the last step on its partition's row, in the clock's order; the trace and
    the bubble (measured and simulated) from the same events. Counts and orderings only."""
    model = GPipe(nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4)), balance=[2, 1],
                  devices=['cpu', 'cpu'], chunks=3, checkpoint='never')
    with pytest.raises(pipetrain.UsageError, match='no step has run'):
        model.last_step_bubble()
    model(torch.randn(6, 4)).sum().backward()
    events = model.last_step_events()
    for j in (0, 1):
        row = sorted((e for e in events if e['partition'] == j), key=lambda e: e['start'])
        assert [e['micro_batch'] for e in row if e['op'] == 'forward'] == [0, 1, 2]
        assert [e['micro_batch'] for e in row if e['op'] == 'backward'] == [2, 1, 0]
        assert [e['micro_batch'] for e in row if e['op'] == 'backward_weight'] == [-1]
    trace = json.loads(model.chrome_trace())
    names = {e.get('name') for e in trace['traceEvents']}
    assert {'F0', 'F2', 'B0', 'B2'} <= names
    bubble = model.last_step_bubble()
    assert 0 <= bubble['measured'] < 1 and 0 < bubble['simulated'] < 1
