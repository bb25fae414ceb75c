"""The engine: ``pipetrain.initialize`` and the PipelineEngine it returns (DeepSpeed's
``deepspeed.initialize`` and ``PipelineEngine``), over pipetrain's native engine.

    engine, _, _, _ = pipetrain.initialize(model=pipeline_module, config=ds_config)
    for step in range(steps):
        loss = engine.train_batch(data_iter)

The native engine runs the schedule (1F1B by default; any of pipetrain's), the point-to-point
transfers, the gradient all-reduces, ZeRO-1, clipping, fp16/bf16 and the optimizer of the
config; the layers are the PipelineModule's own modules (native where they are torch.nn
types pipetrain runs itself, Python otherwise).
"""
import atexit
import json
import os
import weakref

import torch
import torch.nn.functional as F
from torch import nn

from .. import _C
from .._layers import layer_name, native_layer
from ..errors import ConfigError, UsageError
from .module import PipelineModule

__all__ = ['initialize', 'PipelineEngine', 'RepeatingLoader', 'init_distributed']

# The engine of this process while it lives: its process groups carry fixed names, so a second
# one at the same time would collide with them deep inside the communicator.
_live_engine = None
# The connection to the peers outlives each engine (a later one reuses it) and ends at exit.
atexit.register(_C.release_communicator)


class RepeatingLoader:
    """An iterator over a data loader that starts it again when it ends (DeepSpeed's)."""

    def __init__(self, loader):
        self.loader = loader
        self.data_iter = iter(self.loader)

    def __iter__(self):
        return self

    def __next__(self):
        try:
            return next(self.data_iter)
        except StopIteration:
            self.data_iter = iter(self.loader)
            return next(self.data_iter)


def init_distributed(dist_backend=None, timeout=None, **_):
    """Accepted for DeepSpeed scripts: pipetrain's engine connects its ranks itself when it is
    made (from the launcher's environment), so there is nothing to do here."""
    del dist_backend, timeout


def _loss_kind(loss_fn):
    """The native loss that computes exactly ``loss_fn``, else 'python'."""
    if loss_fn is None:
        return 'output'
    if loss_fn is F.mse_loss or (type(loss_fn) is nn.MSELoss and loss_fn.reduction == 'mean'):
        return 'mse'
    if loss_fn is F.cross_entropy or (type(loss_fn) is nn.CrossEntropyLoss and loss_fn.reduction == 'mean'
                                      and loss_fn.weight is None and loss_fn.ignore_index == -100
                                      and getattr(loss_fn, 'label_smoothing', 0.0) == 0.0):
        return 'cross_entropy'
    return 'python'


def _read_config(config, args):
    if config is None and args is not None:
        config = getattr(args, 'deepspeed_config', None) or getattr(args, 'deepscale_config', None)
    if config is None:
        raise ConfigError('pipetrain.initialize needs a config: config=dict or the path of a DeepSpeed JSON file')
    if isinstance(config, (str, os.PathLike)):
        with open(config, encoding='utf-8') as f:
            return json.load(f)
    if not isinstance(config, dict):
        raise ConfigError(f'config is a {type(config).__name__}; give a dict or the path of a JSON file')
    return dict(config)


_OPTIMIZERS = {torch.optim.SGD: 'SGD', torch.optim.Adam: 'Adam', torch.optim.AdamW: 'AdamW',
               torch.optim.RMSprop: 'RMSprop', torch.optim.Adagrad: 'Adagrad'}


def _optimizer_config(optimizer):
    """A torch optimizer given to initialize, as the config's optimizer block (the native
    engine steps the parameters itself, with the same hyper-parameters)."""
    kind = _OPTIMIZERS.get(type(optimizer))
    if kind is None or len(optimizer.param_groups) != 1:
        raise ConfigError(f'optimizer: a {type(optimizer).__name__} with {len(optimizer.param_groups)} parameter '
                          'group(s); pipetrain runs SGD, Adam, AdamW, RMSprop or Adagrad with one group: give it in '
                          "the config's optimizer block instead")
    g = optimizer.param_groups[0]
    params = {'lr': g['lr'], 'weight_decay': g.get('weight_decay', 0.0)}
    if kind == 'SGD':
        params.update(momentum=g.get('momentum', 0.0), nesterov=g.get('nesterov', False))
    elif kind in ('Adam', 'AdamW'):
        params.update(betas=list(g['betas']), eps=g['eps'])
        if kind == 'Adam' and g.get('weight_decay', 0.0):
            params['adam_w_mode'] = False  # torch's Adam adds the decay to the gradient
    elif kind == 'RMSprop':
        params.update(alpha=g['alpha'], eps=g['eps'], momentum=g.get('momentum', 0.0))
    return {'type': kind, 'params': params}


class _LrScheduler:
    """What initialize returns as the scheduler: the native engine moves the learning rate."""

    def __init__(self, engine):
        self._engine = engine

    def get_last_lr(self):
        return self._engine.get_lr()

    get_lr = get_last_lr

    def step(self, *_):
        raise UsageError('the learning rate moves inside train_batch(); do not step the scheduler yourself')


class _Optimizer:
    """What initialize returns as the optimizer: the native engine steps it inside train_batch."""

    def __init__(self, engine):
        self._engine = engine

    @property
    def param_groups(self):
        return [{'params': list(self._engine.module.parameters()), 'lr': self._engine.get_lr()[0]}]

    def step(self, *_):
        raise UsageError('the optimizer steps inside train_batch(); do not call step() yourself')

    def zero_grad(self, *_args, **_kwargs):
        pass


def initialize(args=None, model=None, optimizer=None, model_parameters=None, training_data=None, lr_scheduler=None,
               mpu=None, dist_init_required=None, collate_fn=None, config=None, config_params=None):
    """DeepSpeed's ``initialize`` for a PipelineModule: returns (engine, optimizer, training
    dataloader or None, lr scheduler). ``config`` is a dict or a DeepSpeed JSON file."""
    del model_parameters, dist_init_required
    if not isinstance(model, PipelineModule):
        raise TypeError(f'model is a {type(model).__name__}; pipetrain.initialize takes a '
                        'pipetrain.pipe.PipelineModule (the pipeline engine is the one it provides)')
    if mpu is not None:
        raise ConfigError('mpu: pipetrain builds its own process groups (pipe x data), a model-parallel unit '
                          'is not supported')
    if lr_scheduler is not None:
        raise ConfigError("lr_scheduler: give the schedule in the config's scheduler block (WarmupLR, "
                          'WarmupDecayLR), which the native engine runs')
    cfg = _read_config(config if config is not None else config_params, args)
    if optimizer is not None:
        if callable(optimizer) and not isinstance(optimizer, torch.optim.Optimizer):
            raise ConfigError("optimizer: a callable is not supported; give the config's optimizer block")
        cfg['optimizer'] = _optimizer_config(optimizer)
    engine = PipelineEngine(model, cfg)
    loader = None
    if training_data is not None:
        loader = engine.deepspeed_io(training_data, collate_fn=collate_fn)
        engine.set_dataloader(loader)
    return engine, _Optimizer(engine), loader, _LrScheduler(engine)


class PipelineEngine:
    """One rank of a pipeline: ``train_batch()``, ``eval_batch()``, checkpoints (DeepSpeed's
    PipelineEngine). Every rank makes the same calls in the same order."""

    def __init__(self, module, config):
        global _live_engine  # pylint: disable=global-statement
        if _live_engine is not None and _live_engine() is not None:
            raise UsageError('this process has a PipelineEngine already: one engine per process at a time. Drop '
                             'the first (del engine; gc.collect()) before pipetrain.initialize makes another')
        self.module = module
        self._config_dict = config
        config_json = json.dumps(config)
        _C.check_config(config_json)
        tp = config.get('tensor_parallel', {})
        if isinstance(tp, dict) and int(tp.get('autotp_size', tp.get('tp_size', 1)) or 1) > 1:
            raise ConfigError('tensor_parallel: a Python model has no tensor-parallel layers; pipetrain splits '
                              "only its own C++ layers (runtime/parallel_layers.h). Remove the block")
        layout = _C.train_layout(config_json, module.num_stages, module.dp_world_size)
        parts = sum(len(v) for v in layout)
        module.place_for_schedule(parts, layout[module.stage_id])
        layers = [None] * len(module)
        for i, m in module.local_layers.items():
            layers[i] = native_layer(m, layer_name(i, m))
        # A tied module is one layer wherever its key recurs on this stage.
        by_module = {}
        for i in sorted(module.local_layers):
            layers[i] = by_module.setdefault(id(module.local_layers[i]), layers[i])
        loss_fn = module.loss_fn
        self._native = _C.Engine(module.spec_tuples(layers), _loss_kind(loss_fn), loss_fn, config_json,
                                 module.balance, module.num_stages, module.activation_checkpoint_interval)
        self.data_iterator = None
        self.training_dataloader = None
        _live_engine = weakref.ref(self)

    # -- training ------------------------------------------------------------------------------
    def train_batch(self, data_iter=None):
        """One optimizer step over gradient_accumulation_steps micro-batches pulled from
        ``data_iter`` (pairs of inputs and labels); returns the batch's mean loss on every rank."""
        self.module.train()
        it = self._iterator(data_iter)
        return torch.tensor(self._native.train_batch(it))

    def eval_batch(self, data_iter, return_logits=False, compute_loss=True, reduce_output='avg',
                   bcast_loss=True, num_micro_batches=None):
        """Forward only over the micro-batches of one batch (or ``num_micro_batches``). Returns
        the mean loss on every rank; with ``return_logits`` also the last stage's outputs of
        every micro-batch, concatenated (None on other stages)."""
        if reduce_output not in ('avg', None):
            raise ConfigError(f"reduce_output {reduce_output!r}: 'avg' or None")
        del compute_loss, bcast_loss
        self.module.eval()
        try:
            loss, outputs = self._native.eval_batch(self._iterator(data_iter), bool(return_logits),
                                                    int(num_micro_batches or 0))
        finally:
            self.module.train()
        loss = torch.tensor(loss)
        if not return_logits:
            return loss
        logits = None
        if outputs:
            first = outputs[0]
            logits = (tuple(torch.cat(parts) for parts in zip(*outputs)) if isinstance(first, tuple)
                      else torch.cat(outputs))
        return loss, logits

    def _iterator(self, data_iter):
        if data_iter is not None:
            return iter(data_iter)
        if self.data_iterator is None:
            raise ValueError(f'RANK={self.global_rank} no data iterator provided: pass train_batch(data_iter) or '
                             'initialize(training_data=...)')
        return self.data_iterator

    def set_dataloader(self, loader):
        self.training_dataloader = loader
        self.data_iterator = iter(RepeatingLoader(loader))

    def set_dataiterator(self, iterator):
        self.training_dataloader = None
        self.data_iterator = iterator

    def deepspeed_io(self, dataset, batch_size=None, collate_fn=None, shuffle=True):
        """A loader of this replica's shard of ``dataset`` in micro-batches."""
        sampler = torch.utils.data.DistributedSampler(dataset, num_replicas=self.module.dp_world_size,
                                                      rank=self.global_rank % self.module.dp_world_size,
                                                      shuffle=shuffle)
        return torch.utils.data.DataLoader(dataset, batch_size=batch_size or self.train_micro_batch_size_per_gpu(),
                                           sampler=sampler, collate_fn=collate_fn, drop_last=True)

    def forward(self, *args, **kwargs):
        raise UsageError('Only train_batch() is accessible in pipeline mode.')

    def backward(self, *args, **kwargs):
        raise UsageError('Only train_batch() is accessible in pipeline mode.')

    def step(self, *args, **kwargs):
        raise UsageError('Only train_batch() is accessible in pipeline mode.')

    # -- checkpoints -----------------------------------------------------------------------------
    def save_checkpoint(self, save_dir, tag=None, client_state=None, save_latest=True, exclude_frozen_parameters=False):
        """Per-layer checkpoint into ``save_dir/<tag>`` (default ``global_step<N>``), then
        ``save_dir/latest`` names it. Collective. ``client_state`` must be JSON-serializable."""
        del save_latest, exclude_frozen_parameters
        extra = json.dumps(client_state) if client_state else ''
        return self._native.save(os.fspath(save_dir), '' if tag is None else str(tag), extra)

    def load_checkpoint(self, load_dir, tag=None, load_module_strict=True, load_optimizer_states=True,
                        load_lr_scheduler_states=True, load_module_only=False):
        """Loads ``load_dir/<tag>`` (default: the tag ``latest`` names), written by any layout of
        the same model. Returns (path, client_state), or (None, None) when there is nothing."""
        del load_module_strict, load_optimizer_states, load_lr_scheduler_states, load_module_only
        load_dir = os.fspath(load_dir)
        tag = _C.latest_tag(load_dir) if tag is None else str(tag)
        if not tag:
            return None, None
        self._native.load(load_dir, tag)
        path = os.path.join(load_dir, tag)
        with open(os.path.join(path, 'manifest.json'), encoding='utf-8') as f:
            client_state = json.load(f).get('extra', {})
        return path, client_state

    # -- DeepSpeed's accessors -------------------------------------------------------------------
    def is_first_stage(self):
        return self.stage_id == 0

    def is_last_stage(self):
        return self.stage_id == self.num_stages - 1

    @property
    def stage_id(self):
        return self._native.stage

    @property
    def num_stages(self):
        return self._native.num_stages

    @property
    def global_rank(self):
        return self._native.rank

    @property
    def world_size(self):
        return self._native.world_size

    @property
    def dp_world_size(self):
        return self._native.num_replicas

    @property
    def micro_batches(self):
        return self._native.micro_batches

    @property
    def global_steps(self):
        return self._native.global_steps

    @property
    def global_samples(self):
        return self.global_steps * self.train_batch_size()

    def train_batch_size(self):
        return self._native.train_batch_size

    def train_micro_batch_size_per_gpu(self):
        return self._native.train_micro_batch_size

    def gradient_accumulation_steps(self):
        return self._native.micro_batches

    def get_lr(self):
        return [self._native.last_step()['lr']]

    def get_global_grad_norm(self):
        return self._native.last_step()['grad_norm']

    def last_step(self):
        """The last step's figures (loss, grad_norm, lr, seconds, samples_per_s, skipped, ...)."""
        return self._native.last_step()

    @property
    def config(self):
        return json.loads(self._native.config)
