"""Models of test_tied_weight_attr.py, shared by the ranks (tied_weight_attr_worker.py) and the
one-process oracle: tied modules whose tied_weight_attr names some of their parameters only."""
import torch
from torch import nn
from torch.nn import functional as F

from pipetrain.pipe import LayerSpec, TiedLayerSpec


class EmbedProj(nn.Module):
    """A token embedding whose weight is also the output projection, which has a bias of its own."""

    def __init__(self, vocab=10, dim=8):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(vocab, dim))
        self.bias = nn.Parameter(torch.randn(vocab))

    def forward(self, tokens):
        return F.embedding(tokens, self.weight)


def project(module, h):
    return F.linear(h, module.weight, module.bias)


class ScaledLinear(nn.Module):
    """x @ weight.T * scale + bias: weight and scale tied as a list, bias used (and trained) on both stages."""

    def __init__(self, dim=8):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(dim, dim) / dim ** 0.5)
        self.scale = nn.Parameter(torch.rand(dim) + 0.5)
        self.bias = nn.Parameter(torch.randn(dim))

    def forward(self, x):
        return F.linear(x, self.weight) * self.scale + self.bias


def specs(model):
    """The layer list; uniform over 2 stages, the tied key's two uses fall on stages 0 and 1."""
    if model == 'embed':
        return [TiedLayerSpec('embed', EmbedProj, 10, 8), LayerSpec(nn.Linear, 8, 8), LayerSpec(nn.Tanh),
                TiedLayerSpec('embed', EmbedProj, 10, 8, forward_fn=project)]
    attrs = ['weight', 'scale']
    return [TiedLayerSpec('sl', ScaledLinear, 8, tied_weight_attr=attrs), LayerSpec(nn.Tanh),
            LayerSpec(nn.Linear, 8, 8), TiedLayerSpec('sl', ScaledLinear, 8, tied_weight_attr=attrs)]


def tied_attrs(model):
    return ['weight'] if model == 'embed' else ['weight', 'scale']


def start_values(module, stage):
    """Known starting values, different per stage for the untied parameters (so a tie of the
    whole module would show)."""
    g = torch.Generator().manual_seed(77)
    with torch.no_grad():
        for name, p in module.named_parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.5)
            if name not in ('weight', 'scale'):
                p.add_(stage)


def micro_batch(model, index, rows=2):
    g = torch.Generator().manual_seed(500 + index)
    if model == 'embed':
        return torch.randint(0, 10, (rows, 3), generator=g), torch.randn(rows, 3, 10, generator=g)
    return torch.randn(rows, 8, generator=g), torch.randn(rows, 8, generator=g)


def set_start(layers_by_index, stage_of):
    """Every local module gets its start values: plain layers by index, tied ones by their stage."""
    for index, layer in layers_by_index.items():
        if not isinstance(layer, nn.Module):
            continue
        if isinstance(layer, (EmbedProj, ScaledLinear)):
            start_values(layer, stage_of(index))
        else:
            g = torch.Generator().manual_seed(300 + index)
            with torch.no_grad():
                for p in layer.parameters():
                    p.copy_(torch.randn(p.shape, generator=g) * 0.5)


def oracle(model, steps):
    """One process, DeepSpeed's semantics: one tied module per stage, the named attributes one
    Parameter shared by both, the rest each its own. Returns losses and each use's state."""
    built = {}
    for i, spec in enumerate(specs(model)):
        built[i] = spec.build()
    stage_of = {0: 0, 1: 0, 2: 1, 3: 1}
    set_start(built, stage_of.__getitem__)
    for name in tied_attrs(model):
        setattr(built[3], name, getattr(built[0], name))
    fns = [None, None, None, project if model == 'embed' else None]
    params = list({id(p): p for m in built.values() for p in m.parameters()}.values())
    opt = torch.optim.SGD(params, lr=0.1)
    losses = []
    for s in range(steps):
        opt.zero_grad()
        total = 0.0
        for i in range(4):
            x, y = micro_batch(model, s * 4 + i)
            for index in range(4):
                x = fns[index](built[index], x) if fns[index] else built[index](x)
            loss = F.mse_loss(x, y) / 4
            loss.backward()
            total += loss.item()
        opt.step()
        losses.append(total)
    return losses, {i: {k: v.detach().clone() for k, v in m.state_dict().items()} for i, m in built.items()}
