"""The engine: ``pipetrain.initialize`` and the PipelineEngine it returns (DeepSpeed's
``deepspeed.initialize`` and ``PipelineEngine``), over pipetrain's native engine.

    engine, _, _, _ = pipetrain.initialize(model=pipeline_module, config=ds_config)
    for step in range(steps):
        loss = engine.train_batch(data_iter)

The native engine runs the schedule (1F1B by default; any of pipetrain's), the point-to-point
transfers, the gradient all-reduces, ZeRO-1, clipping, fp16/bf16 and the optimizer of the
config (a client optimizer steps in Python after it: engine_optim.py); the layers are the
PipelineModule's own modules (native where they are torch.nn types pipetrain runs itself,
Python otherwise). Data: engine_io.py; checkpoints: engine_checkpoint.py.
"""
import atexit
import json
import warnings
import weakref

import torch
import torch.nn.functional as F
from torch import nn

from .. import _C
from .._layers import layer_name, native_layer
from ..comm import init_distributed  # DeepSpeed's deepspeed.init_distributed, re-exported here
from ..errors import ConfigError, UsageError
from .engine_checkpoint import load, save
from .engine_config import PYTHON_KEYS, check_local_rank, check_mpu, read_config, tensorboard_dir, warn_config
from .engine_io import RepeatingLoader, as_iterator, training_loader, with_batch_fn
from .engine_optim import (ClientOptimizer, NativeLrScheduler, NativeOptimizer, client_parameters,
                           optimizer_from_config, parameter_selection)
from .module import PipelineModule

__all__ = ['initialize', 'PipelineEngine', 'RepeatingLoader', 'init_distributed']

# The engine of this process while it lives: its process groups carry fixed names, so a second
# one at the same time would collide with them deep inside the communicator.
_live_engine = None
# The connection to the peers outlives each engine (a later one reuses it) and ends at exit.
atexit.register(_C.release_communicator)


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



def initialize(args=None, model=None, optimizer=None, model_parameters=None, training_data=None, lr_scheduler=None,
               mpu=None, dist_init_required=None, collate_fn=None, config=None, config_params=None):
    """DeepSpeed's ``initialize`` for a PipelineModule: returns (engine, optimizer, training
    dataloader or None, lr scheduler or None). The config is a dict or a DeepSpeed JSON file.

    With the config's optimizer (and scheduler) alone, the native engine steps the parameters
    inside train_batch. A client ``optimizer`` (an instance, or a callable taking the
    parameters), parameter groups in ``model_parameters``, or a client ``lr_scheduler`` (an
    instance, or a callable taking the optimizer) make it a torch optimizer that Python steps
    after each train_batch, with the scheduler stepped once per applied step."""
    if not isinstance(model, PipelineModule):
        raise TypeError(f'model is a {type(model).__name__}; pipetrain.initialize takes a '
                        'pipetrain.pipe.PipelineModule (the pipeline engine is the one it provides)')
    check_mpu(mpu)
    # As DeepSpeed's: torch.distributed's default group exists after initialize (pipetrain.comm).
    init_distributed(dist_init_required=dist_init_required, verbose=False)
    cfg = read_config(args, config, config_params)
    check_local_rank(args)
    groups = parameter_selection(model_parameters)
    plain_subset = groups is not None and len(groups) == 1 and set(groups[0]) == {'params'}
    client = optimizer is not None or lr_scheduler is not None or (groups is not None and not plain_subset)
    if plain_subset and optimizer is None:
        # DeepSpeed's optimizer steps only these; the native one steps what requires a gradient.
        chosen = {id(p) for p in groups[0]['params']}
        client_parameters(model, groups)
        for p in model.parameters():
            if id(p) not in chosen:
                p.requires_grad_(False)
    engine = PipelineEngine(model, cfg, external_optimizer=client)
    if client:
        engine._set_client_optimizer(cfg, optimizer, groups, model_parameters, lr_scheduler)
    if training_data is not None:
        engine._build_data_iter(training_data, collate_fn)
    return engine, engine.optimizer, engine.training_dataloader, engine.lr_scheduler


class PipelineEngine:
    """One rank of a pipeline: ``train_batch()``, ``eval_batch()``, checkpoints (DeepSpeed's
    PipelineEngine). Every rank makes the same calls in the same order."""

    def __init__(self, module, config, external_optimizer=False):
        global _live_engine  # pylint: disable=global-statement
        if _live_engine is not None and _live_engine() is not None:
            raise UsageError('this process has a PipelineEngine already: one engine per process at a time. Drop '
                             'the first (del engine; gc.collect()) before pipetrain.initialize makes another')
        self.module = module
        self._config_dict = config
        # Keys the Python side honours itself; the native reader would call them ignored.
        native_config = {k: v for k, v in config.items() if k not in PYTHON_KEYS}
        warn_config(native_config)
        config_json = json.dumps(native_config)
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
                                 module.balance, module.num_stages, module.activation_checkpoint_interval,
                                 bool(external_optimizer))
        self._client = None
        self.optimizer = NativeOptimizer(self)
        self.lr_scheduler = NativeLrScheduler(self) if config.get('scheduler') else None
        self.data_iterator = None
        self.training_dataloader = None
        self.batch_fn = None
        self._global_samples = 0
        self._steps_taken = False
        tb_dir = tensorboard_dir(config)
        self._tensorboard = _C.TensorBoardWriter(tb_dir) if tb_dir and self.global_rank == 0 else None
        _live_engine = weakref.ref(self)

    def _set_client_optimizer(self, cfg, optimizer, groups, model_parameters, lr_scheduler):
        if optimizer is None:
            if groups is None:
                groups = [{'params': [p for p in self.module.parameters() if p.requires_grad]}]
            client_parameters(self.module, groups)
            optimizer = optimizer_from_config(cfg.get('optimizer'), groups)
        elif isinstance(optimizer, torch.optim.Optimizer):
            client_parameters(self.module, optimizer.param_groups)
        elif callable(optimizer):
            made = optimizer(groups if groups is not None else self.module.parameters())
            if not isinstance(made, torch.optim.Optimizer):
                raise ConfigError(f'optimizer: the callable returned a {type(made).__name__}; it must return a '
                                  'torch.optim.Optimizer over the parameters it is given')
            optimizer = made
            client_parameters(self.module, optimizer.param_groups)
        else:
            raise ConfigError(f'optimizer is a {type(optimizer).__name__}; give a torch.optim.Optimizer, a callable '
                              "making one from the parameters, or the config's optimizer block")
        del model_parameters
        scheduler = lr_scheduler
        if scheduler is not None and callable(scheduler) and not hasattr(scheduler, 'step'):
            scheduler = scheduler(optimizer)
        if scheduler is not None and not hasattr(scheduler, 'step'):
            raise ConfigError(f'lr_scheduler is a {type(scheduler).__name__}; give a torch LR scheduler or a '
                              'callable making one from the optimizer')
        follow_native = scheduler is None and bool(cfg.get('scheduler'))
        self._client = ClientOptimizer(optimizer, scheduler, follow_native)
        self.optimizer = optimizer
        self.lr_scheduler = scheduler if scheduler is not None else (NativeLrScheduler(self) if follow_native
                                                                     else None)

    # -- data ------------------------------------------------------------------------------------
    def _loads_data(self):
        """Whether this rank holds the first or the last layer (only those pull micro-batches)."""
        local = self.module.local_layers
        return 0 in local or len(self.module) - 1 in local

    def _build_data_iter(self, dataset, collate_fn):
        if not self._loads_data():
            return  # DeepSpeed gives the middle stages no loader either
        drop_last = bool(self._config_dict.get('dataloader_drop_last', False))
        loader = training_loader(dataset, self.train_micro_batch_size_per_gpu(), self.dp_world_size,
                                 self._native.replica, collate_fn=collate_fn, drop_last=drop_last)
        self.set_dataloader(RepeatingLoader(loader))

    def set_dataloader(self, loader):
        """Train from ``loader`` (DeepSpeed's; a RepeatingLoader keeps it going)."""
        self.training_dataloader = loader
        self.data_iterator = as_iterator(loader)

    def set_dataiterator(self, iterator):
        """Train from ``iterator`` from now on: an iterator, or anything iterable (a list, a
        DataLoader), which is iterated once from its start."""
        self.training_dataloader = None
        self.data_iterator = as_iterator(iterator)

    def set_batch_fn(self, fn):
        """``fn`` turns each item pulled from the data iterator into the (inputs, labels) pair."""
        self.batch_fn = fn

    def reset_activation_shape(self):
        """DeepSpeed's: forget the activation shapes sent so far. pipetrain sends each transfer's
        shape with it, so a batch of another shape needs nothing: nothing to reset."""

    def deepspeed_io(self, dataset, batch_size=None, route='train', pin_memory=True, data_sampler=None,
                     collate_fn=None, num_local_io_workers=None):
        """DeepSpeed's loader of this replica's shard of ``dataset`` (DistributedSampler over the
        data-parallel group, shuffled for training; micro-batches; dataloader_drop_last)."""
        del route
        if data_sampler is None:
            data_sampler = torch.utils.data.DistributedSampler(dataset, num_replicas=self.dp_world_size,
                                                               rank=self._native.replica)
        return torch.utils.data.DataLoader(dataset, batch_size=batch_size or self.train_micro_batch_size_per_gpu(),
                                           sampler=data_sampler, collate_fn=collate_fn, pin_memory=pin_memory,
                                           num_workers=num_local_io_workers or 0,
                                           drop_last=bool(self._config_dict.get('dataloader_drop_last', False)))

    def _iterator(self):
        if self.data_iterator is None:
            if self._loads_data():
                raise ValueError(f'RANK={self.global_rank} no data iterator provided: pass train_batch(data_iter), '
                                 'set_dataiterator() or initialize(training_data=...)')
            return iter(())  # a middle stage pulls nothing
        return with_batch_fn(self.data_iterator, self.batch_fn)

    # -- training ------------------------------------------------------------------------------
    def train_batch(self, data_iter=None):
        """One optimizer step over gradient_accumulation_steps micro-batches pulled from
        ``data_iter`` (which then stays the engine's iterator, as in DeepSpeed), or from the
        iterator set before; returns the batch's mean loss on every rank."""
        if not torch.is_grad_enabled():
            raise RuntimeError('train_batch() requires gradients enabled. Use eval_batch() instead.')
        if data_iter is not None:
            self.set_dataiterator(data_iter)
        self.module.train()
        loss = self._native.train_batch(self._iterator())
        stats = self._native.last_step()
        if self._client is not None and not stats['skipped']:
            self._client.step(stats['lr'])
            self._native.parameters_changed()
        self._global_samples += self.train_batch_size()
        self._steps_taken = True
        if self._tensorboard is not None:
            self._tensorboard.add_scalar('Train/Samples/train_loss', loss, self.global_samples)
            self._tensorboard.add_scalar('Train/Samples/lr', self.get_lr()[0], self.global_samples)
            if self._native.precision == 'fp16':
                self._tensorboard.add_scalar('Train/Samples/loss_scale', stats['loss_scale'], self.global_samples)
            self._tensorboard.flush()
        return torch.tensor(loss)

    def eval_batch(self, data_iter, return_logits=False, compute_loss=True, reduce_output='avg',
                   bcast_loss=True, num_micro_batches=None):
        """Forward only over the micro-batches of one batch (or ``num_micro_batches``), as
        DeepSpeed's: the mean loss ('avg') or the list of per-micro-batch losses (None), on every
        stage with ``bcast_loss`` and only on the last one without (None elsewhere). With
        ``compute_loss=False`` the last stage's outputs instead of losses. With
        ``return_logits`` also the last stage's outputs of every micro-batch, concatenated
        (None on other stages)."""
        if reduce_output not in ('avg', None):
            raise ConfigError(f"reduce_output {reduce_output!r}: 'avg' or None (DeepSpeed's two)")
        if not compute_loss and reduce_output == 'avg' and self.dp_world_size > 1:
            raise UsageError("eval_batch(compute_loss=False, reduce_output='avg') averages outputs over data-parallel "
                             'replicas, which pipetrain does not do: pass reduce_output=None and average them yourself')
        self.module.eval()
        train_iterator = self.data_iterator
        try:
            self.data_iterator = as_iterator(data_iter)
            per_micro = reduce_output is None or not compute_loss
            loss, outputs, labels = self._native.eval_batch(self._iterator(), bool(return_logits or per_micro),
                                                            int(num_micro_batches or 0))
        finally:
            self.data_iterator = train_iterator
            self.module.train()
        last = self.is_last_stage()
        if not compute_loss:
            result = (outputs if reduce_output is None else _mean(outputs)) if last else None
        elif reduce_output is None:
            loss_fn = self.module.loss_fn
            result = None
            if last:
                with torch.no_grad():
                    result = [loss_fn(o, y) if loss_fn is not None else o for o, y in zip(outputs, labels)]
        else:
            result = torch.tensor(loss) if (bcast_loss or last) else None
        if self._tensorboard is not None and compute_loss and reduce_output == 'avg':
            self._tensorboard.add_scalar('Train/Samples/eval_loss', loss, self.global_samples)
            self._tensorboard.flush()
        if not return_logits:
            return result
        logits = None
        if outputs:
            first = outputs[0]
            logits = (tuple(torch.cat(parts) for parts in zip(*outputs)) if isinstance(first, tuple)
                      else torch.cat(outputs))
        return result, logits

    def forward(self, *args, **kwargs):
        raise UsageError('Only train_batch() is accessible in pipeline mode.')

    def backward(self, *args, **kwargs):
        raise UsageError('Only train_batch() is accessible in pipeline mode.')

    def step(self, *args, **kwargs):
        raise UsageError('Only train_batch() is accessible in pipeline mode.')

    def train(self, mode=True):
        """Puts this stage's layers in training mode (train_batch does it itself)."""
        self.module.train(mode)
        return self

    def eval(self):
        """Puts this stage's layers in evaluation mode (eval_batch does it itself)."""
        self.module.eval()
        return self

    def set_train_batch_size(self, train_batch_size):
        """DeepSpeed's: later steps take train_batch_size / (micro-batch size x replicas)
        micro-batches. Every rank calls it with the same size."""
        per_micro = self.train_micro_batch_size_per_gpu() * self.dp_world_size
        if train_batch_size % per_micro != 0:
            raise ValueError(f'train_batch_size {train_batch_size} must be divisible by micro-batch size x '
                             f'data-parallel size ({per_micro})')
        self._native.set_gradient_accumulation_steps(train_batch_size // per_micro)

    # -- checkpoints -----------------------------------------------------------------------------
    def save_checkpoint(self, save_dir, tag=None, client_state=None, save_latest=True, exclude_frozen_parameters=False):
        """Per-layer checkpoint into ``save_dir/<tag>`` (default ``global_step<N>``); with
        ``save_latest``, ``save_dir/latest`` then names it. Collective. ``client_state``: any
        picklable value, returned by load_checkpoint."""
        if exclude_frozen_parameters:
            warnings.warn('exclude_frozen_parameters=True: pipetrain saves frozen parameters too (a checkpoint '
                          'holds whole layers)', stacklevel=2)
        save(self, save_dir, tag, client_state, save_latest)
        return True

    def load_checkpoint(self, load_dir, tag=None, load_module_strict=True, load_optimizer_states=True,
                        load_lr_scheduler_states=True, load_module_only=False):
        """Loads ``load_dir/<tag>`` (default: the tag ``latest`` names), written by any layout of
        the same model, or by DeepSpeed (its layer files). Returns (path, client_state), or
        (None, None) when there is no ``latest``."""
        path, client_state = load(self, load_dir, tag, load_module_strict, load_optimizer_states,
                                  load_lr_scheduler_states, load_module_only)
        if path is not None and not load_module_only:
            self._global_samples = self.global_steps * self.train_batch_size()
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
    def local_rank(self):
        return self._native.local_rank

    @property
    def device(self):
        return torch.device(self._native.device)

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

    @global_steps.setter
    def global_steps(self, value):
        # A resuming script sets it; the LR schedule continues from there.
        self._native.set_global_steps(int(value))

    @property
    def global_samples(self):
        return self._global_samples

    @global_samples.setter
    def global_samples(self, value):
        self._global_samples = int(value)

    def train_batch_size(self):
        return self._native.train_batch_size

    def train_micro_batch_size_per_gpu(self):
        return self._native.train_micro_batch_size

    def gradient_accumulation_steps(self):
        return self._native.micro_batches

    def is_gradient_accumulation_boundary(self):
        """DeepSpeed's pipeline engine: True only while it reduces gradients and steps, which is
        inside train_batch; so False whenever a script can ask."""
        return False

    def was_step_applied(self):
        """Whether the last train_batch stepped the optimizer (False after an fp16 overflow or a
        skipped non-finite step, and before the first step)."""
        return self._steps_taken and not self._native.last_step()['skipped']

    def get_lr(self):
        if self._client is not None:
            return self._client.lrs()
        return [self._native.last_step()['lr'] if self._steps_taken else self._native.next_lr]

    def get_global_grad_norm(self):
        return self._native.last_step()['grad_norm']

    def last_step(self):
        """The last step's figures (loss, grad_norm, lr, seconds, samples_per_s, skipped, ...)."""
        return self._native.last_step()

    @property
    def config(self):
        return json.loads(self._native.config)


def _mean(outputs):
    """The average over micro-batches of their outputs (tensors or tuples of them)."""
    if not outputs:
        return None
    if isinstance(outputs[0], tuple):
        return tuple(sum(parts) / len(outputs) for parts in zip(*outputs))
    return sum(outputs) / len(outputs)
