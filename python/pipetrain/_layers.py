"""Python modules as layers of pipetrain's native runtime.

Each child of a pipelined model becomes a ``pipetrain._C.Layer``. Modules of a few torch.nn types
that pipetrain runs itself (Linear, the element-wise activations, Flatten, Identity, Dropout)
become native modules built around the Python module's own parameter tensors: they run without
the GIL, and the engine gives Linear layers its fused weight-gradient kernels. Everything else,
and any module with hooks, runs as the Python module itself, called under the GIL from the
native worker that owns its partition or stage.

The Python module stays the owner of its tensors: gradients land in its parameters'
``.grad``, optimizer steps and checkpoints change its parameters in place, and replacing a
parameter object after the model is pipelined is not seen by the runtime.
"""
import os

from torch import nn

from . import _C

__all__ = ['native_layer', 'native_layers_enabled']

_NATIVE_TYPES = {}


def _native(cls):
    def register(fn):
        _NATIVE_TYPES[cls] = fn
        return fn
    return register


@_native(nn.Linear)
def _linear(m, name):
    return _C.linear_layer(m, name, m.weight, m.bias)


@_native(nn.ReLU)
def _relu(m, name):
    return _C.relu_layer(m, name, m.inplace)


@_native(nn.GELU)
def _gelu(m, name):
    return _C.gelu_layer(m, name, getattr(m, 'approximate', 'none'))


@_native(nn.Tanh)
def _tanh(m, name):
    return _C.tanh_layer(m, name)


@_native(nn.Sigmoid)
def _sigmoid(m, name):
    return _C.sigmoid_layer(m, name)


@_native(nn.Identity)
def _identity(m, name):
    return _C.identity_layer(m, name)


@_native(nn.Flatten)
def _flatten(m, name):
    return _C.flatten_layer(m, name, m.start_dim, m.end_dim)


@_native(nn.Dropout)
def _dropout(m, name):
    # pipetrain's Dropout: masks from the task's own generator, so concurrent partitions and
    # recomputation draw the same masks whatever the timing.
    return _C.dropout_layer(m, name, m.p, m.inplace)


def native_layers_enabled():
    """Whether torch.nn layers of the known types run natively (PIPETRAIN_NATIVE_LAYERS=0: no)."""
    return os.environ.get('PIPETRAIN_NATIVE_LAYERS', '1') not in ('0', 'false', 'off', 'no')


def _has_hooks(module):
    return any(getattr(module, attr, None) for attr in
               ('_forward_hooks', '_forward_pre_hooks', '_backward_hooks',
                '_state_dict_hooks', '_load_state_dict_pre_hooks'))


def native_layer(module, name, native=None):
    """The layer the runtime runs for ``module`` (a child of the pipelined model)."""
    from .skip.skippable import Skippable  # late: skip imports this module's package

    if native is None:
        native = native_layers_enabled()
    if isinstance(module, Skippable):
        stash_keys, pop_keys = module.skip_keys()
        return _C.python_skippable_layer(module, stash_keys, pop_keys, name)
    build = _NATIVE_TYPES.get(type(module))
    if native and build is not None and not _has_hooks(module):
        return build(module, name)
    return _C.python_layer(module, name)


def layer_name(index, module):
    return f'layer {index} ({type(module).__name__})'
