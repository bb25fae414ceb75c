"""PipelineModule: a model as a list of layers cut into pipeline stages (DeepSpeed's
PipelineModule), each rank building only the layers of its own stage."""
import random
import re
import warnings

import torch
import torch.utils.checkpoint
from torch import nn

from .. import _C
from .._layers import layer_name, native_layer
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


class PartitionMethodError(ConfigError, NotImplementedError):
    """A partition_method DeepSpeed does not implement either (it raises NotImplementedError)."""


def set_random_seed(seed):
    """DeepSpeed's ds_utils.set_random_seed: Python's, NumPy's (when installed) and torch's generators."""
    random.seed(seed)
    try:
        import numpy  # pylint: disable=import-outside-toplevel
        numpy.random.seed(seed % (2 ** 32))
    except ImportError:
        pass
    torch.manual_seed(seed)


def _native_checkpoint_func(fn):
    """Whether ``fn`` is a checkpoint function pipetrain's own recomputation replaces exactly:
    DeepSpeed's, torch's or pipetrain's (all recompute the group in backward, same results)."""
    if fn is None or fn is torch.utils.checkpoint.checkpoint:
        return True
    module = getattr(fn, '__module__', '') or ''
    name = getattr(fn, '__name__', '')
    return name in ('checkpoint', 'non_reentrant_checkpoint') and (
        module.startswith('deepspeed.') or module.startswith('pipetrain.') or module == 'torch.utils.checkpoint')


def _trainable_count(module):
    return sum(p.numel() for p in module.parameters() if p.requires_grad)


def _check_topology(topology, world_size):
    """The (stages, replicas) of a DeepSpeed topology pipetrain's engine can run, or ConfigError."""
    for name in ('get_dim', 'get_coord', 'world_size', 'get_axis_names'):
        if not callable(getattr(topology, name, None)):
            raise ConfigError(f'topology is a {type(topology).__name__} without {name}(); give a '
                              'pipetrain.pipe.ProcessTopology (PipeDataParallelTopology(num_pp, num_dp))')
    if topology.world_size() != world_size:
        raise ConfigError(f'topology {topology.get_axis_names()} of dims '
                          f'{[topology.get_dim(a) for a in topology.get_axis_names()]} has '
                          f'{topology.world_size()} ranks but the job has {world_size} process(es): launch '
                          f'{topology.world_size()} processes or give a topology of {world_size} ranks')
    if topology.get_dim('model') > 1:
        raise ConfigError(f"topology: a 'model' axis of {topology.get_dim('model')}: a Python model has no "
                          'tensor-parallel layers (pipetrain splits only its own C++ layers); use '
                          'PipeModelDataParallelTopology(num_pp, num_mp=1, num_dp) or PipeDataParallelTopology')
    other = [a for a in topology.get_axis_names() if a not in ('pipe', 'data', 'model') and topology.get_dim(a) > 1]
    if other:
        raise ConfigError(f'topology axes {other}: pipetrain runs the pipe, data and model axes only')
    stages = topology.get_dim('pipe') or 1
    replicas = topology.get_dim('data') or 1
    # pipetrain's engine places ranks pipe-outermost (rank = stage * replicas + replica), the
    # order of DeepSpeed's own topologies; another order would need other process groups.
    for rank in range(world_size):
        coord = topology.get_coord(rank)
        stage = getattr(coord, 'pipe', 0)
        replica = getattr(coord, 'data', 0)
        if (stage, replica) != divmod(rank, replicas):
            raise ConfigError(f'topology {topology.get_axis_names()}: rank {rank} is stage {stage}, replica '
                              f'{replica}, but pipetrain runs ranks pipe-outermost (rank {rank} = stage '
                              f'{rank // replicas}, replica {rank % replicas}); use axes in the order pipe, data '
                              '(PipeDataParallelTopology or PipeModelDataParallelTopology)')
    return stages, replicas


class PipelineModule(nn.Module):
    """A sequence of layers for pipetrain's engine (DeepSpeed's ``PipelineModule``).

    Args:
        layers: LayerSpec, TiedLayerSpec, nn.Module or plain callables, in order.
        num_stages (int): pipeline stages (or give ``topology``); the world size must be a
            multiple of it, the rest being data-parallel replicas.
        topology (ProcessTopology): the grid of ranks; this rank's stage is its ``pipe``
            coordinate, its replica its ``data`` one. Axes in the order pipe, data (model of 1).
        loss_fn: ``loss_fn(outputs, labels)`` on the last stage; None: the last layer's output
            is the loss.
        seed_layers (bool): seed the generators with ``base_seed + layer index`` before
            building each layer (``seed_fn(seed)`` if given), so a layer's weights do not depend
            on the stage that builds it.
        partition_method (str): as DeepSpeed, cut for cut: 'parameters' (DeepSpeed's
            partition_balanced over each layer's trainable-parameter count, 0 for functions),
            'uniform', or 'type:REGEX' (balanced count of layers whose class name matches).
        activation_checkpoint_interval (int): recompute groups of N layers in backward (0: off).
        activation_checkpoint_func: DeepSpeed's or torch's checkpoint (pipetrain recomputes
            natively, with the same results); another function is refused.
        checkpointable_layers (list): class names; DeepSpeed skips recomputing groups with
            other layers (and, without the list, groups without parameters).

    The world comes from the launcher's environment (``pipetrain launch``, mpirun, torchrun).
    """

    def __init__(self, layers, num_stages=None, topology=None, loss_fn=None, seed_layers=False, seed_fn=None,
                 base_seed=1234, partition_method='parameters', activation_checkpoint_interval=0,
                 activation_checkpoint_func=None, checkpointable_layers=None):
        super().__init__()
        if num_stages is None and topology is None:
            raise RuntimeError('must provide num_stages or topology')
        self.global_rank, self.world_size, self.local_rank, _ = _C.rank_info()
        if topology is not None:
            num_stages, self.dp_world_size = _check_topology(topology, self.world_size)
            self._topo = topology
        else:
            num_stages = int(num_stages)
            if num_stages < 1 or self.world_size % num_stages:
                raise ConfigError(f'PipelineModule(num_stages={num_stages}) in a world of {self.world_size} '
                                  'process(es): the world must be a multiple of the stages; launch stages x '
                                  f'replicas processes, e.g. `pipetrain launch -n {max(num_stages, 1)} -- python3 '
                                  'script.py`')
            self.dp_world_size = self.world_size // num_stages
            self._topo = PipeDataParallelTopology(num_pp=num_stages, num_dp=self.dp_world_size)
        self.num_stages = num_stages
        coord = self._topo.get_coord(self.global_rank)
        self.stage_id = getattr(coord, 'pipe', 0)
        self.data_parallel_id = getattr(coord, 'data', 0)
        self._layer_specs = list(layers)
        if not self._layer_specs:
            raise ConfigError('PipelineModule needs at least one layer')
        for i, spec in enumerate(self._layer_specs):
            if isinstance(spec, PipelineModule):
                raise NotImplementedError(f'layer {i} is a PipelineModule: nested pipelines are not supported '
                                          '(nor in DeepSpeed); give its layers in the list instead')
            if not (isinstance(spec, (LayerSpec, nn.Module)) or callable(spec)):
                raise TypeError(f'layer {i} is a {type(spec).__name__}; a PipelineModule takes LayerSpec, '
                                'TiedLayerSpec, nn.Module or callables')
        self.loss_fn = loss_fn
        self.seed_layers = seed_layers
        self.seed_fn = seed_fn
        self.base_seed = base_seed
        self.partition_method = partition_method
        self.activation_checkpoint_interval = int(activation_checkpoint_interval)
        if self.activation_checkpoint_interval < 0:
            raise ConfigError(f'activation_checkpoint_interval={activation_checkpoint_interval}: give 0 (off) or '
                              'a number of layers')
        if self.activation_checkpoint_interval and not _native_checkpoint_func(activation_checkpoint_func):
            raise ConfigError(f'activation_checkpoint_func={activation_checkpoint_func!r}: pipetrain recomputes '
                              'checkpointed groups natively and can stand in only for deepspeed.checkpointing.'
                              'checkpoint or torch.utils.checkpoint.checkpoint; leave it at its default')
        self.activation_checkpoint_func = activation_checkpoint_func
        if checkpointable_layers is not None and not isinstance(checkpointable_layers, list):
            raise ConfigError(f'checkpointable_layers is a {type(checkpointable_layers).__name__}: give a list of '
                              'layer class names')
        self.checkpointable_layers = checkpointable_layers
        self.tied_modules = nn.ModuleDict()
        self.tied_weight_attrs = {}
        self.local_layers = {}
        self.parts = self._partition(self.num_stages)
        self.balance = [b - a for a, b in zip(self.parts, self.parts[1:])]
        self._check_tied_weight_attrs()
        if checkpointable_layers is not None and self.activation_checkpoint_interval:
            warnings.warn(f'checkpointable_layers={checkpointable_layers}: pipetrain recomputes every group of '
                          f'{self.activation_checkpoint_interval} layer(s); DeepSpeed would skip the groups with '
                          'other layers. The gradients are the same, only memory and time differ', stacklevel=2)
        self.virtual_stages = [self.stage_id]
        self._build_local()

    def _check_tied_weight_attrs(self):
        """Which parameters each tied key shares across stages, as DeepSpeed's tied_weight_attr:
        only those named; the module's others stay each stage's own (the engine broadcasts and
        all-reduces the named ones alone). None: all of them (one stage holds every use, or an
        attribute is missing, which DeepSpeed fails on)."""
        keys = {}
        for i, spec in enumerate(self._layer_specs):
            if isinstance(spec, TiedLayerSpec):
                keys.setdefault(spec.key, []).append(i)
        self._tied_param_names = {}
        for key, uses in keys.items():
            spec = self._layer_specs[uses[0]]
            attrs = [spec.tied_weight_attr] if isinstance(spec.tied_weight_attr, str) else list(spec.tied_weight_attr)
            self._tied_param_names[key] = None
            if len({self.stage_owner(i) for i in uses}) < 2:
                continue
            with torch.random.fork_rng(devices=[]):
                module = spec.build()
            names = [n for n, _ in module.named_parameters()]
            missing = [a for a in attrs if a not in names]
            if missing:
                # DeepSpeed fails on these (getattr at its first broadcast); the whole module is tied.
                warnings.warn(f'TiedLayerSpec {key!r}: tied_weight_attr {missing} is not a parameter of '
                              f'{type(module).__name__} (its parameters: {names}); pipetrain ties all of them',
                              stacklevel=3)
                continue
            self._tied_param_names[key] = attrs

    # -- partitioning (DeepSpeed's, cut for cut) --------------------------------------------------
    def _count_layer_params(self):
        """Trainable parameters per layer, as DeepSpeed counts them: a LayerSpec is built to count
        (drawing from the generators as DeepSpeed's build does), a function counts 0."""
        counts = []
        for spec in self._layer_specs:
            if isinstance(spec, LayerSpec):
                counts.append(_trainable_count(spec.build()))
            elif isinstance(spec, nn.Module):
                counts.append(_trainable_count(spec))
            else:
                counts.append(0)
        return counts

    def _layer_type_name(self, spec):
        if isinstance(spec, LayerSpec):
            return spec.typename.__name__
        if isinstance(spec, nn.Module):
            return type(spec).__name__
        return getattr(spec, '__name__', None)

    def _type_weights(self, pattern):
        try:
            regex = re.compile(pattern, re.IGNORECASE)
        except re.error as e:
            raise ConfigError(f"partition_method 'type:{pattern}': {e}; give a Python regex of layer class "
                              "names, e.g. 'type:transformer'") from e
        names = [self._layer_type_name(s) for s in self._layer_specs]
        weights = [1 if n is not None and regex.search(n) else 0 for n in names]
        if not any(weights):
            raise ConfigError(f"partition_method 'type:{pattern}' matches no layer (class names: "
                              f"{sorted({n for n in names if n})}); pick a pattern that matches the layers to balance")
        return weights

    def _partition(self, parts):
        """The boundaries of ``parts`` parts (DeepSpeed's ``parts``: [0, ..., len(layers)])."""
        method = self.partition_method
        if not isinstance(method, str):
            raise ConfigError(f'partition_method {method!r}: use parameters, uniform or type:REGEX')
        method = method.lower()  # as DeepSpeed (the type regex matches ignoring case anyway)
        n = len(self._layer_specs)
        if method == 'uniform':
            balance = _C.deepspeed_partition_uniform(n, parts)
        elif method == 'parameters':
            balance = _C.deepspeed_partition_balanced([float(c) for c in self._count_layer_params()], parts)
        elif method.startswith('type:'):
            balance = _C.deepspeed_partition_balanced([float(w) for w in self._type_weights(method.split(':')[1])],
                                                      parts)
        elif method == 'profile':
            raise PartitionMethodError("partition_method 'profile' is not implemented (nor in DeepSpeed): use "
                                       "'parameters', 'uniform' or 'type:REGEX'; pipetrain's GPipe balances by "
                                       'measured time with pipetrain.balance.balance_by_time')
        else:
            raise PartitionMethodError(f'partition_method {self.partition_method!r} is not implemented: use '
                                       "'parameters', 'uniform' or 'type:REGEX'")
        offsets = [0]
        for b in balance:
            offsets.append(offsets[-1] + b)
        return offsets

    # -- building this rank's layers -----------------------------------------------------------------
    def _make(self, index):
        """Layer ``index`` as a module (tied layers: their shared module, made once per rank)."""
        spec = self._layer_specs[index]
        if self.seed_layers:
            (self.seed_fn or set_random_seed)(self.base_seed + index)
        if isinstance(spec, TiedLayerSpec):
            if spec.key not in self.tied_modules:
                self.tied_modules[spec.key] = spec.build()
                self.tied_weight_attrs[spec.key] = spec.tied_weight_attr
            return self.tied_modules[spec.key]
        if isinstance(spec, LayerSpec):
            module = spec.build()
        elif isinstance(spec, nn.Module):
            module = spec
        else:
            module = _Function(spec)
        return module

    def _build_local(self, keep=None):
        """Builds the layers of this rank's parts; a layer in ``keep`` (index -> module, built
        before) stays the module it is, with whatever was loaded into it or frozen since."""
        keep = keep or {}
        self.local_layers = {}
        for v in self.virtual_stages:
            for i in range(self.parts[v], self.parts[v + 1]):
                spec = self._layer_specs[i]
                if i in keep:
                    module = keep[i]
                    if isinstance(spec, TiedLayerSpec) and spec.key not in self.tied_modules:
                        self.tied_modules[spec.key] = module
                        self.tied_weight_attrs[spec.key] = spec.tied_weight_attr
                else:
                    module = self._make(i)
                self.local_layers[i] = module
                if not isinstance(spec, TiedLayerSpec):
                    self.add_module(str(i), module)
        self._local_start = self.parts[self.virtual_stages[0]]
        self._local_stop = self.parts[self.virtual_stages[0] + 1]

    def place_for_schedule(self, parts, virtual_stages):
        """Places the layers for a schedule whose stages hold several parts each (interleaved and
        V-shaped ones). Layers that stay on this rank stay the same modules (weights loaded or
        frozen after construction are kept); only the layers new to it are built."""
        if parts == len(self.balance) and list(virtual_stages) == self.virtual_stages:
            return
        old = dict(self.local_layers)
        tied_old = {key: module for key, module in self.tied_modules.items()}
        for name in list(self._modules):
            if name.isdigit():
                del self._modules[name]
        self.tied_modules = nn.ModuleDict()
        self.tied_weight_attrs = {}
        self.parts = self._partition(parts)
        self.balance = [b - a for a, b in zip(self.parts, self.parts[1:])]
        self.virtual_stages = list(virtual_stages)
        keep = {}
        for v in self.virtual_stages:
            for i in range(self.parts[v], self.parts[v + 1]):
                spec = self._layer_specs[i]
                if i in old:
                    keep[i] = old[i]
                elif isinstance(spec, TiedLayerSpec) and spec.key in tied_old:
                    keep[i] = tied_old[spec.key]
        self._build_local(keep)

    # -- what the native engine runs ---------------------------------------------------------------
    def _group_starts(self):
        """The layers that can receive an input autograd or a checkpoint still needs: each part's
        first layer and, under activation checkpointing, each group's first (counted from the
        part's start, as DeepSpeed counts from its stage's)."""
        starts = set()
        step = self.activation_checkpoint_interval
        for v in self.virtual_stages:
            begin, end = self.parts[v], self.parts[v + 1]
            starts.update(range(begin, end, step) if step > 0 else [begin])
        return starts

    def _guarded(self, index, layer):
        """``layer`` (a pipetrain._C.Layer made for layer ``index``), copying its input first where
        it may work in place on a tensor autograd or a checkpoint still needs (see _group_starts):
        DeepSpeed clones every received activation; this copies only there, only for Python
        layers and in-place ReLU / Dropout."""
        spec = self._layer_specs[index]
        module = self.local_layers.get(index)
        if isinstance(spec, TiedLayerSpec) or module is None or index not in self._group_starts():
            return layer
        may_work_in_place = getattr(module, 'inplace', False) if layer.native else not isinstance(module, Skippable)
        return _C.input_guarded_layer(layer) if may_work_in_place else layer

    def runtime_layers(self):
        """``layers[i]``: this rank's layer ``i`` as a pipetrain._C.Layer, None on other ranks. A
        tied module is one Layer wherever its key recurs on this rank."""
        layers = [None] * len(self._layer_specs)
        by_module = {}
        for i in sorted(self.local_layers):
            module = self.local_layers[i]
            if id(module) not in by_module:
                by_module[id(module)] = native_layer(module, layer_name(i, module))
            layers[i] = by_module[id(module)]
        return layers

    def _type_name(self, index):
        name = self._layer_type_name(self._layer_specs[index])
        return name or type(self._layer_specs[index]).__name__

    def _skips(self, index):
        spec = self._layer_specs[index]
        if isinstance(spec, Skippable):
            return ([spec.namespaced(n) for n in sorted(spec.stashable_names)],
                    [spec.namespaced(n) for n in sorted(spec.poppable_names)])
        if isinstance(spec, LayerSpec) and issubclass(spec.typename, Skippable):
            return ([('', n) for n in sorted(spec.typename.stashable_names)],
                    [('', n) for n in sorted(spec.typename.poppable_names)])
        return [], []

    def spec_tuples(self, layers):
        """The layer list as the native engine takes it: ``layers[i]`` is a pipetrain._C.Layer,
        a callable making one, or None (another rank's layer). Layers that may work in place on
        their input get the input guard where they need it."""
        out = []
        for i, spec in enumerate(self._layer_specs):
            key = spec.key if isinstance(spec, TiedLayerSpec) else ''
            forward = spec.forward_fn if isinstance(spec, TiedLayerSpec) else None
            stash, pop = self._skips(i)
            layer = layers[i]
            if isinstance(layer, _C.Layer):
                layer = self._guarded(i, layer)
            tied = self._tied_param_names.get(key) if key else None
            out.append((self._type_name(i), self._type_name(i), key, layer, forward, stash, pop, tied))
        return out

    # -- DeepSpeed's accessors -------------------------------------------------------------------
    def topology(self):
        return self._topo

    def num_pipeline_stages(self):
        return self.num_stages

    def partitions(self):
        return self.parts

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
