"""Layer specs: a model described as constructors, so each stage builds only its own layers
(DeepSpeed's LayerSpec and TiedLayerSpec)."""
from torch import nn

__all__ = ['LayerSpec', 'TiedLayerSpec']


def _call_to_str(name, args, kwargs):
    parts = [repr(a) for a in args] + [f'{k}={v!r}' for k, v in kwargs.items()]
    return f'{name}({", ".join(parts)})'


class LayerSpec:
    """``LayerSpec(nn.Linear, 1024, 1024)`` builds ``nn.Linear(1024, 1024)`` on the stage that
    owns the layer, and nowhere else."""

    def __init__(self, typename, *module_args, **module_kwargs):
        if not isinstance(typename, type) or not issubclass(typename, nn.Module):
            raise RuntimeError('LayerSpec only supports torch.nn.Module types.')
        self.typename = typename
        self.module_args = module_args
        self.module_kwargs = module_kwargs

    def __repr__(self):
        return _call_to_str(self.typename.__name__, self.module_args, self.module_kwargs)

    def build(self, log=False):
        if log:
            print(f'building {self!r}')
        return self.typename(*self.module_args, **self.module_kwargs)


class TiedLayerSpec(LayerSpec):
    """Layers with one ``key`` share one module: built once per stage that holds any of them,
    ``forward_fn(module, input)`` replaces the module's forward at this use (an output
    projection through the embedding's weight, say). As in DeepSpeed, only the parameters
    ``tied_weight_attr`` names (a str or a list) are tied across stages: equal on every stage
    at the start, their gradients summed over the stages holding the key each step; the
    module's other parameters stay each stage's own."""

    def __init__(self, key, typename, *module_args, forward_fn=None, tied_weight_attr='weight', **module_kwargs):
        super().__init__(typename, *module_args, **module_kwargs)
        self.key = key
        self.forward_fn = forward_fn
        self.tied_weight_attr = tied_weight_attr
