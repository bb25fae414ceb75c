"""pipetrain.initialize in one process: the DeepSpeed config's batch sizes as DeepSpeed derives
them, and one engine per process at a time."""
import gc

import pytest
import torch
from torch import nn

import pipetrain
from pipetrain.pipe import LayerSpec, PipelineModule


def module():
    return PipelineModule(layers=[LayerSpec(nn.Linear, 4, 4), LayerSpec(nn.ReLU), LayerSpec(nn.Linear, 4, 2)],
                          num_stages=1, loss_fn=nn.MSELoss())


def make(cfg):
    cfg = dict(cfg, optimizer={'type': 'SGD', 'params': {'lr': 0.1}}, steps_per_print=10**6)
    engine, _, _, _ = pipetrain.initialize(model=module(), config=cfg)
    return engine


@pytest.mark.parametrize('cfg, micro, accumulation', [
    ({'train_batch_size': 8, 'train_micro_batch_size_per_gpu': 2}, 2, 4),
    ({'train_batch_size': 8, 'gradient_accumulation_steps': 2}, 4, 2),
    ({'train_micro_batch_size_per_gpu': 2, 'gradient_accumulation_steps': 3}, 2, 3),
    ({'train_batch_size': 8}, 8, 1),
])
def test_any_two_batch_sizes_give_the_third(cfg, micro, accumulation):
    engine = make(cfg)
    assert engine.train_micro_batch_size_per_gpu() == micro
    assert engine.gradient_accumulation_steps() == accumulation
    data = iter([(torch.rand(micro, 4), torch.rand(micro, 2)) for _ in range(accumulation)])
    assert torch.isfinite(engine.train_batch(data))
    del engine
    gc.collect()


def test_inconsistent_batch_sizes_name_the_numbers():
    with pytest.raises(pipetrain.ConfigError, match='train_batch_size 8 != train_micro_batch_size_per_gpu 2'):
        make({'train_batch_size': 8, 'train_micro_batch_size_per_gpu': 2, 'gradient_accumulation_steps': 3})
    gc.collect()


def test_a_second_live_engine_is_refused_and_allowed_once_the_first_is_gone():
    first = make({'train_batch_size': 2})
    with pytest.raises(pipetrain.UsageError, match='one engine per process at a time'):
        make({'train_batch_size': 2})
    del first
    gc.collect()
    second = make({'train_batch_size': 2})
    assert second.train_micro_batch_size_per_gpu() == 2
