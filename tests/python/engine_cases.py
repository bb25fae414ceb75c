"""Models, data and configs of the multi-process engine tests, shared by the ranks
(engine_worker.py) and by the one-process oracle the tests compare them with."""
import torch
from torch import nn
import torch.nn.functional as F

from pipetrain.pipe import LayerSpec, TiedLayerSpec

BASE_SEED = 7
VOCAB = 10


class Residual(nn.Module):
    """A Python layer: parameters of its own, a nested child, Python arithmetic."""

    def __init__(self, width):
        super().__init__()
        self.inner = nn.Sequential(nn.Linear(width, width), nn.Tanh())
        self.gate = nn.Parameter(torch.tensor(0.5))

    def forward(self, x):
        return x + self.gate * self.inner(x)


class FailOnSecondStep(nn.Module):
    """Raises in its forward from the given call on (a Python layer's bug, mid-training)."""

    def __init__(self, calls_before_failing):
        super().__init__()
        self.calls = 0
        self.calls_before_failing = calls_before_failing

    def forward(self, x):
        self.calls += 1
        if self.calls > self.calls_before_failing:
            raise ValueError(f'injected failure in call {self.calls}')
        return x


def python_loss(out, labels):
    return ((out - labels) ** 2).mean()


def token_loss(out, labels):
    return F.cross_entropy(out.reshape(-1, VOCAB), labels.reshape(-1))


def project(embedding, x):
    return x @ embedding.weight.t()


def specs(model):
    """(layer list, loss function) of a test model."""
    if model == 'mlp':
        return [LayerSpec(nn.Linear, 8, 16), LayerSpec(nn.ReLU), LayerSpec(nn.Linear, 16, 16), LayerSpec(nn.Tanh),
                LayerSpec(nn.Linear, 16, 16), LayerSpec(nn.ReLU), LayerSpec(nn.Linear, 16, 4)], nn.MSELoss()
    if model == 'python':
        return [LayerSpec(nn.Linear, 8, 16), LayerSpec(Residual, 16), LayerSpec(nn.LayerNorm, 16),
                lambda x: x * 2, LayerSpec(Residual, 16), LayerSpec(nn.Linear, 16, 4)], python_loss
    if model == 'tied':
        return [TiedLayerSpec('embed', nn.Embedding, VOCAB, 8), LayerSpec(nn.Linear, 8, 8), LayerSpec(nn.ReLU),
                LayerSpec(nn.Linear, 8, 8),
                TiedLayerSpec('embed', nn.Embedding, VOCAB, 8, forward_fn=project)], token_loss
    if model == 'failing':
        return [LayerSpec(nn.Linear, 8, 16), LayerSpec(nn.ReLU), LayerSpec(FailOnSecondStep, 4),
                LayerSpec(nn.Linear, 16, 4)], nn.MSELoss()
    raise ValueError(model)


def micro_batch(model, index, rows=2):
    """Global micro-batch `index` of a test model's data (the same on every rank)."""
    g = torch.Generator().manual_seed(1000 + index)
    if model == 'tied':
        ids = torch.randint(0, VOCAB, (rows, 5), generator=g)
        return ids, torch.roll(ids, 1, dims=1)
    return torch.randn(rows, 8, generator=g), torch.randn(rows, 4, generator=g)


def data(model, replica, replicas, micro_batches, steps, start=0):
    """Replica `replica`'s micro-batches: step s takes global micro-batches
    (s * replicas + replica) * micro_batches + i, as the engine splits a batch between replicas."""
    for s in range(start, start + steps):
        for i in range(micro_batches):
            yield micro_batch(model, (s * replicas + replica) * micro_batches + i)


def config(case, replicas):
    m = case.get('micro_batches', 4)
    cfg = {
        'train_micro_batch_size_per_gpu': 2,
        'gradient_accumulation_steps': m,
        'train_batch_size': 2 * m * replicas,
        'steps_per_print': 10**6,
        'optimizer': {'type': case.get('optimizer', 'SGD'), 'params': {'lr': 0.1, **case.get('optimizer_params', {})}},
        'pipeline': {'schedule': case.get('schedule', '1f1b'), 'comm_timeout_s': case.get('comm_timeout_s', 20)},
    }
    if case.get('chunks', 1) > 1:
        cfg['pipeline']['chunks'] = case['chunks']
    if case.get('zero'):
        cfg['zero_optimization'] = {'stage': 1}
    if case.get('clip'):
        cfg['gradient_clipping'] = case['clip']
    return cfg


def build_plain(model):
    """The whole model in one process, each layer seeded as PipelineModule(seed_layers=True)
    seeds it: a list of (module, forward)."""
    layers, _ = specs(model)
    built, tied = [], {}
    for i, spec in enumerate(layers):
        if isinstance(spec, TiedLayerSpec) and spec.key in tied:
            module = tied[spec.key]
        else:
            torch.manual_seed(BASE_SEED + i)
            module = spec.build() if isinstance(spec, LayerSpec) else None
            if isinstance(spec, TiedLayerSpec):
                tied[spec.key] = module
        if module is None:
            built.append((None, spec))
        elif isinstance(spec, TiedLayerSpec) and spec.forward_fn is not None:
            built.append((module, lambda x, m=module, f=spec.forward_fn: f(m, x)))
        else:
            built.append((module, module))
    return built


def oracle(case, replicas, steps):
    """Losses per step and the final parameters by global layer index, trained in one process
    over every replica's micro-batches."""
    model = case['model']
    built = build_plain(model)
    _, loss_fn = specs(model)
    params, seen = [], set()
    for module, _ in built:
        if module is not None and id(module) not in seen:
            seen.add(id(module))
            params.extend(module.parameters())
    opt_type = case.get('optimizer', 'SGD')
    extra = case.get('optimizer_params', {})
    if opt_type == 'SGD':
        opt = torch.optim.SGD(params, lr=0.1, momentum=extra.get('momentum', 0.0))
    elif opt_type == 'AdamW':
        opt = torch.optim.AdamW(params, lr=0.1, weight_decay=extra.get('weight_decay', 0.0))
    else:
        raise ValueError(opt_type)
    m = case.get('micro_batches', 4)
    losses = []
    for s in range(steps):
        opt.zero_grad()
        total = 0.0
        for r in range(replicas):
            for i in range(m):
                x, y = micro_batch(model, (s * replicas + r) * m + i)
                for _, forward in built:
                    x = forward(x)
                loss = loss_fn(x, y) / (m * replicas)
                loss.backward()
                total += loss.item()
        if case.get('clip'):
            torch.nn.utils.clip_grad_norm_(params, case['clip'])
        opt.step()
        losses.append(total)
    state = {}
    for i, (module, _) in enumerate(built):
        # A function layer has no state, but lives on a stage all the same.
        state[i] = {} if module is None else {k: v.detach().clone() for k, v in module.state_dict().items()}
    return losses, state
