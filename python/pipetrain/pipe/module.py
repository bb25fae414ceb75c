"""PipelineModule: a model as a list of layers cut into pipeline stages (DeepSpeed's
PipelineModule), each rank building only the layers of its own stage."""
import random

import torch
from torch import nn

from .. import _C
from .._layers import native_layer
from ..errors import ConfigError
from ..skip.skippable import Skippable
from .spec import LayerSpec, TiedLayerSpec
from .topology import PipeDataParallelTopology

__all__ = ['PipelineModule']


class _Function(nn.Module):
    """A plain function in the layer list (``lambda x: x.view(-1, 784)``), as a layer."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *args):
        return self.fn(*args)

    def __repr__(self):
        return f'Function({getattr(self.fn, "__name__", type(self.fn).__name__)})'


def _seed_all(seed):
    random.seed(seed)
    try:
        import numpy  # pylint: disable=import-outside-toplevel
        numpy.random.seed(seed % (2 ** 32))
    except ImportError:
        pass
    torch.manual_seed(seed)


class PipelineModule(nn.Module):
    """A sequence of layers for pipetrain's engine (DeepSpeed's ``PipelineModule``).

    Args:
        layers: LayerSpec, TiedLayerSpec, nn.Module or plain callables, in order.
        num_stages (int): pipeline stages (or give ``topology``); the world size must be a
            multiple of it, the rest being data-parallel replicas.
        loss_fn: ``loss_fn(outputs, labels)`` on the last stage; None: the last layer's output
            is the loss.
        seed_layers (bool): seed the generator with ``base_seed + layer index`` (``seed_fn``
            if given) before building each layer, so a layer's weights do not depend on the
            stage that builds it.
        partition_method (str): 'parameters' (balanced trainable-parameter counts),
            'uniform', or 'type:REGEX' (balanced count of layers whose class matches).
        activation_checkpoint_interval (int): recompute every N layers in backward (0: off).

    The world comes from the launcher's environment (``pipetrain launch``, mpirun, torchrun):
    rank r is stage r // (world size / num_stages).
    """

    def __init__(self, layers, num_stages=None, topology=None, loss_fn=None, seed_layers=False, seed_fn=None,
                 base_seed=1234, partition_method='parameters', activation_checkpoint_interval=0,
                 activation_checkpoint_func=None, checkpointable_layers=None):
        super().__init__()
        if num_stages is None and topology is None:
            raise RuntimeError('must provide num_stages or topology')
        self.global_rank, self.world_size, self.local_rank, _ = _C.rank_info()
        if topology is not None:
            num_stages = topology.get_dim('pipe')
        num_stages = int(num_stages)
        if num_stages < 1 or self.world_size % num_stages:
            raise ConfigError(f'PipelineModule(num_stages={num_stages}) in a world of {self.world_size} process(es): '
                              'the world must be a multiple of the stages; launch stages x replicas processes, e.g. '
                              f'`pipetrain launch -n {max(num_stages, 1)} -- python3 script.py`')
        self.num_stages = num_stages
        self.dp_world_size = self.world_size // num_stages
        self._topo = topology or PipeDataParallelTopology(num_pp=num_stages, num_dp=self.dp_world_size)
        self.stage_id = self.global_rank // self.dp_world_size
        self._layer_specs = list(layers)
        if not self._layer_specs:
            raise ConfigError('PipelineModule needs at least one layer')
        self.loss_fn = loss_fn
        self.seed_layers = seed_layers
        self.seed_fn = seed_fn
        self.base_seed = base_seed
        self.partition_method = partition_method
        self.activation_checkpoint_interval = int(activation_checkpoint_interval)
        if activation_checkpoint_func is not None or checkpointable_layers is not None:
            raise ConfigError('activation_checkpoint_func and checkpointable_layers are not supported: pipetrain '
                              'checkpoints every activation_checkpoint_interval layers with its own recomputation')
        self.tied_modules = nn.ModuleDict()
        self.tied_weight_attrs = {}
        self._place(self.num_stages, [self.stage_id])

    # -- partitioning and building ------------------------------------------------------------
    def _type_name(self, index):
        spec = self._layer_specs[index]
        if isinstance(spec, LayerSpec):
            return spec.typename.__name__
        if isinstance(spec, nn.Module):
            return type(spec).__name__
        return getattr(spec, '__name__', type(spec).__name__)

    def _skips(self, index):
        spec = self._layer_specs[index]
        if isinstance(spec, Skippable):
            return ([spec.namespaced(n) for n in sorted(spec.stashable_names)],
                    [spec.namespaced(n) for n in sorted(spec.poppable_names)])
        if isinstance(spec, LayerSpec) and issubclass(spec.typename, Skippable):
            return ([('', n) for n in sorted(spec.typename.stashable_names)],
                    [('', n) for n in sorted(spec.typename.poppable_names)])
        return [], []

    def _make(self, index):
        """Layer ``index`` as a fresh module (tied layers: their shared module, made once)."""
        spec = self._layer_specs[index]
        if isinstance(spec, TiedLayerSpec) and spec.key in self.tied_modules:
            return self.tied_modules[spec.key]
        if self.seed_layers:
            (self.seed_fn or _seed_all)(self.base_seed + index)
        if isinstance(spec, LayerSpec):
            module = spec.build()
        elif isinstance(spec, nn.Module):
            module = spec
        elif callable(spec):
            module = _Function(spec)
        else:
            raise TypeError(f'layer {index} is a {type(spec).__name__}; a PipelineModule takes LayerSpec, '
                            'TiedLayerSpec, nn.Module or callables')
        if isinstance(spec, TiedLayerSpec):
            self.tied_modules[spec.key] = module
            self.tied_weight_attrs[spec.key] = spec.tied_weight_attr
        return module

    def spec_tuples(self, layers):
        """The layer list as the native engine takes it: ``layers[i]`` is a pipetrain._C.Layer,
        a callable making one, or None (another rank's layer)."""
        out = []
        for i, spec in enumerate(self._layer_specs):
            key = spec.key if isinstance(spec, TiedLayerSpec) else ''
            forward = spec.forward_fn if isinstance(spec, TiedLayerSpec) else None
            stash, pop = self._skips(i)
            out.append((self._type_name(i), self._type_name(i), key, layers[i], forward, stash, pop))
        return out

    def _count_builder(self, index):
        """Builds layer ``index`` apart from the model, to count its parameters (unseeded: the
        engine puts the generator back after counting)."""
        def build():
            spec = self._layer_specs[index]
            if isinstance(spec, LayerSpec):
                module = spec.build()
            else:
                module = spec if isinstance(spec, nn.Module) else _Function(spec)
            return native_layer(module, f'layer {index}')
        return build

    def _place(self, parts, virtual_stages):
        """Cuts the layers into ``parts`` parts and builds those in ``virtual_stages`` (this stage's)."""
        method = self.partition_method
        if not isinstance(method, str):
            raise ConfigError(f'partition_method {method!r}: use parameters, uniform or type:REGEX')
        method = 'type:' + method[5:] if method.lower().startswith('type:') else method.lower()
        builders = [self._count_builder(i) for i in range(len(self._layer_specs))]
        balance = _C.partition_layers(self.spec_tuples(builders), method, [], parts)
        offsets = [0]
        for b in balance:
            offsets.append(offsets[-1] + b)
        for name in list(self._modules):
            if name.isdigit():  # the layers built before; the loss (a module too) stays
                del self._modules[name]
        self.tied_modules = nn.ModuleDict()
        self.tied_weight_attrs = {}
        self.parts = offsets
        self.balance = balance
        self.virtual_stages = list(virtual_stages)
        self.local_layers = {}
        for v in virtual_stages:
            for i in range(offsets[v], offsets[v + 1]):
                module = self._make(i)
                self.local_layers[i] = module
                if not isinstance(self._layer_specs[i], TiedLayerSpec):
                    self.add_module(str(i), module)
        self._local_start = offsets[virtual_stages[0]]
        self._local_stop = offsets[virtual_stages[0] + 1]

    def place_for_schedule(self, parts, virtual_stages):
        """Rebuilds for a schedule whose stages hold other parts (interleaved and V-shaped ones);
        nothing when they are already these."""
        if parts != len(self.balance) or list(virtual_stages) != self.virtual_stages:
            self._place(parts, virtual_stages)

    # -- DeepSpeed's accessors -------------------------------------------------------------------
    def topology(self):
        return self._topo

    def num_pipeline_stages(self):
        return self.num_stages

    def stage_owner(self, layer_idx):
        if not 0 <= layer_idx < len(self._layer_specs):
            raise IndexError(f'layer {layer_idx} is not in a model of {len(self._layer_specs)} layers')
        for v in range(len(self.parts) - 1):
            if self.parts[v] <= layer_idx < self.parts[v + 1]:
                return v % self.num_stages
        raise RuntimeError(f'layer {layer_idx} is in no part')

    def forward(self, x):
        """This stage's layers in order (the engine runs them itself; this is for single stages)."""
        for i in sorted(self.local_layers):
            spec = self._layer_specs[i]
            module = self.local_layers[i]
            if isinstance(spec, TiedLayerSpec) and spec.forward_fn is not None:
                x = spec.forward_fn(module, x)
            else:
                x = module(x)
        return x

    def __len__(self):
        return len(self._layer_specs)

