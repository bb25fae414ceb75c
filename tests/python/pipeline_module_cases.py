"""Models of the PipelineModule tests (test_pipeline_module.py), shared by the ranks
(pipeline_module_worker.py) and the one-process oracle: layer lists with in-place layers at
stage and checkpoint-group starts, a top-level Linear without bias, functions in the list."""
import torch
from torch import nn

BASE_SEED = 11


class MulInPlace(nn.Module):
    """A Python layer that works in place on its input (as a DeepSpeed user's layer may)."""

    def forward(self, x):
        return x.mul_(2)


def layers(model):
    """The layer list of a test model, each layer made under its own seed (the same on every
    rank and in the oracle)."""
    makers = {
        # Uniform over 2 stages: [3, 2], so stage 1 starts with an in-place ReLU.
        'inplace': [lambda: nn.Linear(8, 16), lambda: nn.Tanh(), lambda: nn.Linear(16, 16),
                    lambda: nn.ReLU(inplace=True), lambda: nn.Linear(16, 4)],
        # Checkpointed one layer a group: every layer starts a group; in-place layers of both kinds.
        'inplace-groups': [lambda: nn.Linear(8, 16), lambda: MulInPlace(), lambda: nn.ReLU(inplace=True),
                           lambda: nn.Linear(16, 16), lambda: MulInPlace(), lambda: nn.ReLU(inplace=True),
                           lambda: nn.Linear(16, 4)],
        'no-bias': [lambda: nn.Linear(8, 16, bias=False), lambda: nn.ReLU(), lambda: nn.Linear(16, 16, bias=False),
                    lambda: nn.Linear(16, 4)],
        'functions': [lambda: nn.Linear(8, 16), lambda: (lambda x: x * 2), lambda: nn.Tanh(),
                      lambda: (lambda x: x - 1), lambda: nn.Linear(16, 4)],
    }[model]
    out = []
    for i, make in enumerate(makers):
        torch.manual_seed(BASE_SEED + i)
        out.append(make())
    return out


def load_and_freeze(layers_by_index):
    """What a script may do between PipelineModule(...) and initialize: load weights into its
    layers and freeze one (layer 0's weight)."""
    for index, layer in layers_by_index.items():
        if not isinstance(layer, nn.Module):
            continue
        g = torch.Generator().manual_seed(900 + index)
        with torch.no_grad():
            for p in layer.parameters():
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)
        if index == 0:
            layer.weight.requires_grad_(False)


def micro_batch(index, rows=2):
    g = torch.Generator().manual_seed(500 + index)
    return torch.randn(rows, 8, generator=g), torch.randn(rows, 4, generator=g)


def config(case):
    cfg = {'train_micro_batch_size_per_gpu': 2, 'gradient_accumulation_steps': 4, 'steps_per_print': 10**6,
           'optimizer': {'type': 'SGD', 'params': {'lr': 0.1}},
           'pipeline': {'schedule': case.get('schedule', '1f1b'), 'comm_timeout_s': 20}}
    if case.get('chunks'):
        cfg['pipeline']['chunks'] = case['chunks']
    return cfg


def oracle(case, steps):
    """Losses per step and the final state of each layer, trained in one process."""
    built = layers(case['model'])
    if case.get('load_and_freeze'):
        load_and_freeze(dict(enumerate(built)))
    params = [p for m in built if isinstance(m, nn.Module) for p in m.parameters() if p.requires_grad]
    opt = torch.optim.SGD(params, lr=0.1)
    losses = []
    for s in range(steps):
        opt.zero_grad()
        total = 0.0
        for i in range(4):
            x, y = micro_batch(s * 4 + i)
            for layer in built:
                x = layer(x)
            loss = nn.functional.mse_loss(x, y) / 4
            loss.backward()
            total += loss.item()
        opt.step()
        losses.append(total)
    state = {i: ({k: v.detach().clone() for k, v in m.state_dict().items()} if isinstance(m, nn.Module) else {})
             for i, m in enumerate(built)}
    return losses, state
