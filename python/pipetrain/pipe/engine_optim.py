"""The engine's optimizer and LR scheduler as initialize returns them: the native engine's own
(the config's optimizer and scheduler blocks, behind small stand-ins), or the client's (a
torch optimizer, parameter groups, an LR scheduler), which Python steps after each
train_batch over the gradients the native engine reduced, unscaled and clipped."""
import inspect
import weakref

import torch

from ..errors import ConfigError, UsageError

__all__ = ['NativeOptimizer', 'NativeLrScheduler', 'ClientOptimizer', 'optimizer_from_config', 'parameter_selection',
           'client_parameters']


def _engine(ref):
    engine = ref()
    if engine is None:
        raise UsageError('the PipelineEngine this belongs to is gone (deleted); make a new one with pipetrain.initialize')
    return engine


class NativeOptimizer:
    """What initialize returns as the optimizer when the config's optimizer block runs natively:
    its param_groups (with the current lr) for logging; the engine steps it inside train_batch.
    Holds the engine weakly, so that deleting the engine frees it."""

    def __init__(self, engine):
        self._engine = weakref.ref(engine)

    @property
    def param_groups(self):
        engine = _engine(self._engine)
        return [{'params': [p for p in engine.module.parameters() if p.requires_grad], 'lr': engine.get_lr()[0]}]

    def state_dict(self):
        raise UsageError('the native optimizer keeps its state in the engine: save it with engine.save_checkpoint()')

    def step(self, *_args, **_kwargs):
        raise UsageError('the optimizer steps inside train_batch(); do not call step() yourself')

    def zero_grad(self, *_args, **_kwargs):
        pass  # train_batch starts from cleared gradients


class NativeLrScheduler:
    """What initialize returns as the LR scheduler when the config's scheduler block runs
    natively (the learning rate moves inside train_batch). Holds the engine weakly."""

    def __init__(self, engine):
        self._engine = weakref.ref(engine)

    def get_last_lr(self):
        return _engine(self._engine).get_lr()

    get_lr = get_last_lr

    def step(self, *_args, **_kwargs):
        raise UsageError('the learning rate moves inside train_batch(); do not step the scheduler yourself')


def parameter_selection(model_parameters):
    """``model_parameters`` as initialize takes it (tensors, a generator of them, or parameter
    group dicts): (list of groups, each a dict with a 'params' list), or None."""
    if model_parameters is None:
        return None
    items = list(model_parameters)  # a generator is consumed once, here
    if not items:
        raise ConfigError('model_parameters is empty; give the parameters to train, or leave it out')
    if all(isinstance(p, dict) for p in items):
        groups = []
        for g in items:
            if 'params' not in g:
                raise ConfigError(f"model_parameters: a group without 'params' ({sorted(g)})")
            params = g['params']
            params = [params] if isinstance(params, torch.Tensor) else list(params)
            groups.append(dict(g, params=params))
        return groups
    if all(isinstance(p, torch.Tensor) for p in items):
        return [{'params': items}]
    kinds = sorted({type(p).__name__ for p in items})
    raise ConfigError(f'model_parameters holds {", ".join(kinds)}; give tensors (module.parameters()) or '
                      "parameter-group dicts ({'params': [...], 'weight_decay': ...})")


def optimizer_from_config(block, groups):
    """A torch optimizer over ``groups`` made as the config's optimizer block describes it, with
    the native engine's reading of it (DeepSpeed's Adam decouples weight decay, as AdamW,
    unless adam_w_mode is false)."""
    if not isinstance(block, dict) or 'type' not in block:
        raise ConfigError('model_parameters or lr_scheduler without an optimizer: give the config an optimizer block '
                          '({"type": "AdamW", "params": {...}}) or initialize(optimizer=...)')
    kind = block['type']
    params = dict(block.get('params', {}))
    params = {k: v for k, v in params.items() if v != 'auto'}
    adam_w_mode = params.pop('adam_w_mode', True)
    if 'betas' in params:
        params['betas'] = tuple(params['betas'])
    classes = {'sgd': torch.optim.SGD, 'adam': torch.optim.AdamW if adam_w_mode else torch.optim.Adam,
               'adamw': torch.optim.AdamW, 'rmsprop': torch.optim.RMSprop, 'adagrad': torch.optim.Adagrad}
    cls = classes.get(str(kind).lower())
    if cls is None:
        raise ConfigError(f'optimizer type {kind!r}: pipetrain makes SGD, Adam, AdamW, RMSprop or Adagrad; pass '
                          'another one as initialize(optimizer=...)')
    # The native engine's defaults (torch's SGD has no lr in 1.13; its Adagrad's eps is 1e-10).
    params.setdefault('lr', 0.01)
    if cls is torch.optim.Adagrad:
        params.setdefault('eps', 1e-8)
    # DeepSpeed's own switches (torch_adam, bias_correction, ...) are in the config warning already.
    accepted = inspect.signature(cls.__init__).parameters
    return cls(groups, **{k: v for k, v in params.items() if k in accepted})


class ClientOptimizer:
    """The client's torch optimizer and LR scheduler, stepped after each applied train_batch:
    the scheduler steps only when the optimizer did (DeepSpeed skips both on an overflow)."""

    def __init__(self, optimizer, lr_scheduler, follow_native_lr):
        self.optimizer = optimizer
        self.lr_scheduler = lr_scheduler
        # The config's scheduler block moves the learning rate of every group (DeepSpeed's
        # WarmupLR sets one rate for all groups) when no client scheduler does.
        self.follow_native_lr = follow_native_lr

    def step(self, native_lr):
        if self.follow_native_lr:
            for group in self.optimizer.param_groups:
                group['lr'] = native_lr
        self.optimizer.step()
        if self.lr_scheduler is not None:
            self.lr_scheduler.step()

    def lrs(self):
        return [g['lr'] for g in self.optimizer.param_groups]


def client_parameters(module, groups):
    """The parameters a client optimizer may hold: this stage's trainable ones. ConfigError
    naming the first that is not (another stage's, or not the model's)."""
    own = {id(p) for p in module.parameters()}
    for g in groups:
        for p in g['params']:
            if id(p) not in own:
                raise ConfigError(f'the optimizer holds a parameter of shape {tuple(p.shape)} that is not one of this '
                                  "stage's (PipelineModule.parameters()): build the optimizer over "
                                  'module.parameters() after making the PipelineModule')
