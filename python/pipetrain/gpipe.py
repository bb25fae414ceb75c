"""GPipe: torchgpipe's module, on pipetrain's native runtime.

    from pipetrain import GPipe          # was: from torchgpipe import GPipe
    model = GPipe(nn.Sequential(a, b, c, d), balance=[2, 2], chunks=8)
    output = model(input)
    loss_fn(output, target).backward()

The model is split into partitions as torchgpipe splits it and behaves as torchgpipe's
GPipe does (the same arguments, attributes, errors and messages). The difference is
underneath: micro-batches flow through the partitions on pipetrain's native workers, one
thread per partition, with its activation checkpointing (recomputation with the random state
restored) and its skip routing; each Python layer holds the GIL only while its own forward
runs, and torch.nn layers of a few types run natively (``pipetrain._layers``).

Without CUDA the default devices are the CPU, once per partition (torchgpipe needs GPUs):
the partitions then run concurrently on the CPU's cores.
"""
from collections import OrderedDict

import torch
from torch import nn

from . import _C
from ._layers import _has_hooks, layer_name, native_layer
from .batchnorm import DeferredBatchNorm
from .errors import UsageError
from .skip.skippable import Skippable, verify_skippables

__all__ = ['GPipe', 'verify_module', 'BalanceError']

#: Seconds a micro-batch may take in one partition before forward raises pipetrain.TimeoutError.
DEFAULT_TASK_TIMEOUT = 600.0


def recommend_auto_balance(message):
    """The message, with how to let pipetrain.balance choose a balance."""
    return f'''{message}

If your model is still under development, its optimal balance would change
frequently. In this case, we highly recommend 'pipetrain.balance' for naive
automatic balancing:

  from pipetrain import GPipe
  from pipetrain.balance import balance_by_time

  partitions = torch.cuda.device_count()  # or the number of CPU partitions
  sample = torch.empty(...)
  balance = balance_by_time(partitions, model, sample)

  model = GPipe(model, balance, ...)
'''


def verify_module(module):
    if not isinstance(module, nn.Sequential):
        raise TypeError('module must be nn.Sequential to be partitioned')
    named_children = list(module.named_children())
    if len(named_children) != len(module):
        raise ValueError('module with duplicate children is not supported')
    num_parameters = len(list(module.parameters()))
    num_child_parameters = sum(len(list(child.parameters())) for child in module.children())
    if num_parameters != num_child_parameters:
        raise ValueError('module with duplicate parameters in distinct children is not supported')


class BalanceError(ValueError):
    pass


def split_module(module, balance, devices):
    """Partitions (an nn.ModuleList of nn.Sequential), the balance and the devices kept."""
    balance = list(balance)
    if len(module) != sum(balance):
        raise BalanceError('module and sum of balance have different length '
                           f'(module: {len(module)}, sum of balance: {sum(balance)})')
    if any(x <= 0 for x in balance):
        raise BalanceError(f'all balance numbers must be positive integer (balance: {balance})')
    if len(balance) > len(devices):
        raise IndexError('too few devices to hold given partitions '
                         f'(devices: {len(devices)}, partitions: {len(balance)})')
    partitions, children = [], list(module.named_children())
    start = 0
    for j, size in enumerate(balance):
        partition = nn.Sequential(OrderedDict(children[start:start + size]))
        partition.to(devices[j])
        partitions.append(partition)
        start += size
    return nn.ModuleList(partitions), balance, list(devices[:len(balance)])


MOVING_DENIED = TypeError('denied to move parameters and buffers, because GPipe should manage device placement')


def _check_input(value):
    if isinstance(value, tuple):
        for x in value:
            _check_input(x)
        return
    if not isinstance(value, torch.Tensor):
        raise TypeError(f'expected Tensor, but got {value.__class__.__name__}')


def _default_devices(partitions):
    if torch.cuda.is_available():
        return list(range(torch.cuda.device_count()))
    return ['cpu'] * max(partitions, 1)


class GPipe(nn.Module):
    """Wraps an :class:`nn.Sequential` to train it as a pipeline (torchgpipe's GPipe).

    Args:
        module (nn.Sequential): the model to pipeline.
        balance (ints): layers per partition.

    Keyword Args:
        devices: one device per partition (default: every CUDA device; on a machine without
            CUDA, the CPU for every partition).
        chunks (int): micro-batches per mini-batch (default 1).
        checkpoint (str): 'always', 'except_last' (default) or 'never'.
        deferred_batch_norm (bool): BatchNorm statistics per mini-batch instead of per
            micro-batch (default False).
        task_timeout (float): seconds one micro-batch may take in one partition before
            forward raises pipetrain.TimeoutError (default 600).
        native_layers (bool): run torch.nn layers of the known types natively (default True,
            or PIPETRAIN_NATIVE_LAYERS=0).
        intra_op_threads (int): OpenMP threads of each partition's worker (0: LibTorch's default).
        deferred_linear (bool): nn.Linear layers run natively take the engine's fast path: their
            input gradients per micro-batch, each weight gradient once per step in one product
            (default True). A backward with retain_graph=True through them raises
            pipetrain.UsageError: pass False to backward through one forward more than once.

    Raises:
        TypeError: the module is not an nn.Sequential.
        ValueError: invalid arguments, or a wrong balance.
        IndexError: fewer devices than partitions.
    """

    balance = []
    devices = []
    chunks = 1
    checkpoint = 'except_last'

    def __init__(self, module, balance=None, *, devices=None, chunks=chunks, checkpoint=checkpoint,
                 deferred_batch_norm=False, task_timeout=DEFAULT_TASK_TIMEOUT, native_layers=None,
                 intra_op_threads=0, deferred_linear=True):
        super().__init__()
        chunks = int(chunks)
        checkpoint = str(checkpoint)
        if balance is None:
            raise ValueError(recommend_auto_balance('balance is required'))
        balance = list(balance)  # once: any iterable, a generator included, as torchgpipe takes it
        if chunks <= 0:
            raise ValueError('number of chunks must be positive integer')
        if checkpoint not in ['always', 'except_last', 'never']:
            raise ValueError("checkpoint is not one of 'always', 'except_last', or 'never'")
        verify_module(module)
        verify_skippables(module)
        self.chunks = chunks
        self.checkpoint = checkpoint
        if deferred_batch_norm:
            module = DeferredBatchNorm.convert_deferred_batch_norm(module, chunks)
        if devices is None:
            devices = _default_devices(len(balance))
        devices = [torch.device(d) for d in devices]
        try:
            self.partitions, self.balance, self.devices = split_module(module, balance, devices)
        except BalanceError as exc:
            raise ValueError(recommend_auto_balance(str(exc))) from None
        self._task_timeout = float(task_timeout)
        self._intra_op_threads = int(intra_op_threads)
        self._deferred_linear = bool(deferred_linear)
        self._native_layers = native_layers
        self._native = None
        self._native_key = None
        self._deferred = [m for m in self.modules() if isinstance(m, DeferredBatchNorm)]

    def __len__(self):
        return sum(len(p) for p in self.partitions)

    def __getitem__(self, index):
        layers = list(self)
        if not -len(layers) <= index < len(layers):
            raise IndexError(f'GPipe layer index {index} is out of range for a model of {len(layers)} layers')
        return layers[index]

    def __iter__(self):
        for partition in self.partitions:
            yield from partition

    # GPipe places each partition on its device; moving it is refused, casting allowed.
    def cuda(self, device=None):
        raise MOVING_DENIED

    def cpu(self):
        raise MOVING_DENIED

    def to(self, *args, **kwargs):
        if 'device' in kwargs or 'tensor' in kwargs:
            raise MOVING_DENIED
        if args and (isinstance(args[0], (torch.device, int, str)) or torch.is_tensor(args[0])):
            raise MOVING_DENIED
        return super().to(*args, **kwargs)

    def _runtime(self):
        """The native pipeline for the model as it is now. Made at the first forward, and again
        when hooks were added or removed: a layer with hooks runs as Python (so they fire), and
        a partition with hooks runs as one Python layer (so its own hooks fire too)."""
        key = (_has_global_hooks(), tuple(_has_hooks(p) for p in self.partitions),
               tuple(_has_hooks(layer) for layer in self))
        if self._native is not None and key == self._native_key:
            return self._native
        layers, balance, offset = [], [], 0
        for j, partition in enumerate(self.partitions):
            first, offset = offset, offset + len(partition)
            if key[1][j]:
                if any(isinstance(layer, Skippable) for layer in partition):
                    raise ValueError(f'partition {j} has hooks and skippable layers; pipetrain runs a partition with '
                                     'hooks as one Python layer, which cannot route its skips: put the hooks on '
                                     'the layers instead')
                layers.append(_C.python_layer(partition, f'partition {j}'))
                balance.append(1)
                continue
            for i, layer in enumerate(partition, start=first):
                layers.append(native_layer(layer, layer_name(i, layer), False if key[0] else self._native_layers))
            balance.append(len(partition))
        self._native = _C.GPipe(layers, balance, [str(d) for d in self.devices], self.chunks, self.checkpoint,
                                self.training, self._task_timeout, self._intra_op_threads, self._deferred_linear)
        self._native_key = key
        return self._native

    def forward(self, input):  # pylint: disable=redefined-builtin
        """The model on a mini-batch (a tensor or a tuple of tensors), pipelined."""
        _check_input(input)
        if not self.devices:
            return input  # an empty nn.Sequential is the identity
        try:
            output = self._runtime().forward(input, self.training)
        except BaseException:
            for bn in self._deferred:
                bn.discard()
            raise
        for bn in self._deferred:
            bn.commit()
        return output

    def _last_native(self):
        if self._native is None:
            raise UsageError('GPipe: no step has run yet; call the model (and backward) first')
        return self._native

    def last_step_events(self):
        """The last step's tasks as dicts (partition, op: 'forward', 'backward' or
        'backward_weight', micro_batch: -1 for a partition's weight gradients, start, end:
        seconds from the step's start, the time between forward and backward taken out)."""
        return [dict(partition=j, op=op, micro_batch=mb, start=t0, end=t1)
                for j, op, mb, t0, t1 in self._last_native().last_step_events()]

    def chrome_trace(self):
        """The last step as a Chrome / Perfetto trace (a JSON string; rows "partition j")."""
        return self._last_native().chrome_trace()

    def last_step_bubble(self):
        """{'measured': idle fraction of the partitions over the last step, 'simulated': the
        simulator's for the fill-drain schedule with the costs that step measured}."""
        measured, simulated = self._last_native().last_step_bubble()
        return {'measured': measured, 'simulated': simulated}


def _has_global_hooks():
    hooks = nn.modules.module
    return bool(getattr(hooks, '_global_forward_hooks', None) or getattr(hooks, '_global_forward_pre_hooks', None)
                or getattr(hooks, '_global_backward_hooks', None))
