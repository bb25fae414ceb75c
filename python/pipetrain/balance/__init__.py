"""Automatic balancing for pipetrain.GPipe (torchgpipe.balance's functions).

    from pipetrain.balance import balance_by_time
    balance = balance_by_time(partitions, model, sample)
    model = GPipe(model, balance, chunks=8)

Layers are profiled by the native runtime on a copy of the model (the model itself is not
touched), and the balance is the exact min-max split of the per-layer costs: the contiguous
split whose most expensive partition is as cheap as possible.
"""
import copy

import torch
from torch import nn

from .. import _C
from .._layers import layer_name, native_layer

__all__ = ['balance_by_time', 'balance_by_size', 'balance_cost']


def balance_cost(cost, partitions):
    """The min-max balance of per-layer costs (a list of numbers) into ``partitions`` parts."""
    return _C.min_max_partition([float(c) for c in cost], int(partitions))


def _profiled_layers(module, sample, device):
    if not isinstance(module, nn.Sequential):
        raise TypeError('module must be nn.Sequential to be partitioned')
    if device is None:
        device = next(iter(module.parameters()), torch.empty(0)).device
    device = torch.device(device)
    copied = copy.deepcopy(module).to(device)
    copied.train()
    if isinstance(sample, tuple):
        sample = tuple(t.to(device) for t in sample)
    else:
        sample = sample.to(device)
    return [native_layer(layer, layer_name(i, layer)) for i, layer in enumerate(copied)], sample


def balance_by_time(partitions, module, sample, *, timeout=1.0, device=None):
    """A balance from each layer's measured forward plus backward time on ``sample``.

    Args:
        partitions (int): the number of partitions.
        module (nn.Sequential): the model (a copy of it is profiled).
        sample (Tensor or tuple): an input, preferably of micro-batch size.

    Keyword Args:
        timeout (float): seconds of profiling to spend (at least two passes run).
        device: where to profile (default: where the model's parameters are).
    """
    layers, sample = _profiled_layers(module, sample, device)
    costs = _C.time_costs(layers, sample, float(timeout), True)
    return balance_cost(costs, partitions)


def balance_by_size(partitions, module, input, *, chunks=1, param_scale=2.0, device=None):  # noqa: A002
    """A balance from each layer's memory: its parameters' bytes times ``param_scale`` (2 for
    SGD with momentum: weights and gradients; 4 for Adam) plus its output's bytes on one
    micro-batch of ``input`` (``input`` cut into ``chunks``)."""
    if isinstance(input, tuple):
        sample = tuple(t.chunk(chunks)[0] for t in input)
    else:
        sample = input.chunk(chunks)[0]
    layers, sample = _profiled_layers(module, sample, device)
    costs = _C.size_costs(layers, sample, float(param_scale), True)
    return balance_cost(costs, partitions)
