"""save_checkpoint and load_checkpoint as DeepSpeed's, in one process: any picklable
client_state, save_latest, each load flag, a load that falls back to <tag>.old, a client
optimizer's state, and a checkpoint DeepSpeed wrote."""
import os
import pathlib
import shutil

import pytest
import torch
from torch import nn

import pipetrain
from pipetrain.pipe import LayerSpec, PipelineModule

from test_initialize import (ACCUMULATION, assert_same_parameters, base_config, batches, make_module, plain_copy,
                             plain_step)
from test_initialize import _one_engine_at_a_time  # noqa: F401  pylint: disable=unused-import

FIXTURES = pathlib.Path(__file__).resolve().parents[1] / 'fixtures' / 'deepspeed'
MOMENTUM_SGD = {'type': 'SGD', 'params': {'lr': 0.1, 'momentum': 0.9}}


def make(optimizer=MOMENTUM_SGD, module=None, **extra):
    module = module or make_module()
    engine, _, _, _ = pipetrain.initialize(model=module, config=base_config(optimizer=optimizer, **extra))
    return engine, module


def train(engine, steps, seed=11):
    data = batches(steps, seed=seed)
    for step in range(steps):
        engine.train_batch(iter(data[step * ACCUMULATION:(step + 1) * ACCUMULATION]))


def weights(module):
    return [p.detach().clone() for p in module.parameters()]


def test_any_picklable_client_state_comes_back(tmp_path):
    engine, _ = make()
    train(engine, 1)
    state = {'epoch': 3, 'seen': {1, 2}, 'best': torch.tensor([0.5]), 'history': (1.0, None)}
    assert engine.save_checkpoint(tmp_path, client_state=state)
    path, loaded = engine.load_checkpoint(tmp_path)
    assert path == str(tmp_path / 'global_step1')
    assert loaded['epoch'] == 3 and loaded['seen'] == {1, 2} and loaded['history'] == (1.0, None)
    assert torch.equal(loaded['best'], state['best'])


def test_save_latest_false_leaves_the_pointer(tmp_path):
    engine, _ = make()
    engine.save_checkpoint(tmp_path, tag='first')
    train(engine, 1)
    engine.save_checkpoint(tmp_path, tag='second', save_latest=False)
    assert (tmp_path / 'latest').read_text().strip() == 'first' and (tmp_path / 'second' / 'manifest.json').exists()


def test_a_load_that_falls_back_to_the_old_directory_returns_it(tmp_path):
    engine, _ = make()
    train(engine, 1)
    engine.save_checkpoint(tmp_path, tag='t', client_state={'k': 1})
    # What a save that died between its two renames leaves: the complete checkpoint in t.old.
    os.rename(tmp_path / 't', tmp_path / 't.old')
    path, client_state = engine.load_checkpoint(tmp_path, tag='t')
    assert path == str(tmp_path / 't.old') and client_state == {'k': 1}


def test_nothing_to_load_is_none_none(tmp_path):
    engine, _ = make()
    with pytest.warns(UserWarning, match='no latest file'):
        assert engine.load_checkpoint(tmp_path) == (None, None)


def resume(tmp_path, **flags):
    """Trains 2 steps and saves, trains 2 more (the reference), then loads with `flags` into
    a fresh engine. Returns (the fresh engine and module, the reference weights)."""
    engine, module = make(scheduler={'type': 'WarmupLR', 'params': {'warmup_min_lr': 0.0, 'warmup_max_lr': 0.1,
                                                                    'warmup_num_steps': 4,
                                                                    'warmup_type': 'linear'}})
    train(engine, 2)
    engine.save_checkpoint(tmp_path)
    resume.saved = weights(module)
    train(engine, 2, seed=12)
    reference = weights(module)
    del engine
    import gc  # pylint: disable=import-outside-toplevel
    gc.collect()
    fresh, fresh_module = make(scheduler={'type': 'WarmupLR', 'params': {'warmup_min_lr': 0.0, 'warmup_max_lr': 0.1,
                                                                         'warmup_num_steps': 4,
                                                                         'warmup_type': 'linear'}},
                               module=PipelineModule(layers=[LayerSpec(nn.Linear, 4, 8), LayerSpec(nn.Tanh),
                                                             LayerSpec(nn.Linear, 8, 2)], num_stages=1,
                                                     loss_fn=nn.MSELoss()))
    fresh.load_checkpoint(tmp_path, **flags)
    return fresh, fresh_module, reference


def test_a_full_load_resumes_exactly(tmp_path):
    fresh, module, reference = resume(tmp_path)
    assert fresh.global_steps == 2
    train(fresh, 2, seed=12)
    for p, q in zip(module.parameters(), reference):
        torch.testing.assert_close(p.detach(), q, rtol=1e-6, atol=1e-7)


def test_load_optimizer_states_false_starts_the_momentum_afresh(tmp_path):
    fresh, module, _ = resume(tmp_path, load_optimizer_states=False)
    assert fresh.global_steps == 2
    for p, q in zip(module.parameters(), resume.saved):
        torch.testing.assert_close(p.detach(), q, rtol=0, atol=0)
    # The oracle: the saved weights, a new momentum buffer, the warmup's third and fourth rates.
    plain = plain_copy(module)
    oracle = torch.optim.SGD(plain.parameters(), lr=0.1, momentum=0.9)
    data = batches(2, seed=12)
    for step, lr in enumerate((0.05, 0.075)):
        oracle.param_groups[0]['lr'] = lr
        plain_step(plain, oracle, data[step * ACCUMULATION:(step + 1) * ACCUMULATION])
    train(fresh, 2, seed=12)
    assert_same_parameters(module, plain)


def test_load_lr_scheduler_states_false_starts_the_warmup_again(tmp_path):
    fresh, _, _ = resume(tmp_path, load_lr_scheduler_states=False)
    assert fresh.global_steps == 2
    train(fresh, 2, seed=12)
    assert fresh.get_lr() == pytest.approx([0.1 * 1 / 4])  # the schedule's second step, not its fourth


def test_load_module_only_loads_the_layers_and_keeps_the_step_and_the_schedule(tmp_path):
    fresh, module, _ = resume(tmp_path, load_module_only=True)
    assert fresh.global_steps == 0
    assert fresh.get_lr() == pytest.approx([0.0])  # the warmup's first step: nothing came with the layers
    for p, q in zip(module.parameters(), resume.saved):
        torch.testing.assert_close(p.detach(), q, rtol=0, atol=0)


class WithCounter(nn.Linear):
    """A Linear with one more buffer than the one a checkpoint saved."""

    def __init__(self, *args):
        super().__init__(*args)
        self.register_buffer('counter', torch.zeros(()))


def test_load_module_strict_false_skips_keys_one_side_lacks(tmp_path):
    engine, module = make()
    train(engine, 1)
    engine.save_checkpoint(tmp_path)
    saved = weights(module)
    del engine
    import gc  # pylint: disable=import-outside-toplevel
    gc.collect()
    other = PipelineModule(layers=[LayerSpec(WithCounter, 4, 8), LayerSpec(nn.Tanh), LayerSpec(nn.Linear, 8, 2)],
                           num_stages=1, loss_fn=nn.MSELoss())
    engine, _ = make(module=other)
    with pytest.raises(pipetrain.CheckpointError, match='layer 0'):
        engine.load_checkpoint(tmp_path)
    engine.load_checkpoint(tmp_path, load_module_strict=False)
    for p, q in zip(other.parameters(), saved):
        torch.testing.assert_close(p.detach(), q, rtol=0, atol=0)


def test_a_client_optimizer_and_scheduler_resume_from_their_saved_state(tmp_path):
    def build():
        module = make_module()
        optimizer = torch.optim.AdamW(module.parameters(), lr=0.05)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
        engine, _, _, _ = pipetrain.initialize(model=module, optimizer=optimizer, lr_scheduler=scheduler,
                                               config=base_config())
        return engine, module
    engine, module = build()
    train(engine, 2)
    engine.save_checkpoint(tmp_path)
    train(engine, 2, seed=12)
    reference = weights(module)
    del engine
    import gc  # pylint: disable=import-outside-toplevel
    gc.collect()
    engine, module = build()
    engine.load_checkpoint(tmp_path)
    assert engine.get_lr() == pytest.approx([0.05 / 4])
    train(engine, 2, seed=12)
    for p, q in zip(module.parameters(), reference):
        torch.testing.assert_close(p.detach(), q, rtol=1e-6, atol=1e-7)


def test_a_checkpoint_deepspeed_wrote_loads_with_its_step_and_client_state(tmp_path):
    shutil.copytree(FIXTURES / 'mlp', tmp_path / 'mlp')
    tag_dir = tmp_path / 'mlp' / 'global_step100'
    # DeepSpeed's engine file beside the layers: its own keys and the script's client_state.
    torch.save({'module': None, 'optimizer': None, 'global_steps': 100, 'skipped_steps': 0, 'epoch': 4,
                'note': 'from deepspeed'}, tag_dir / 'mp_rank_00_model_states.pt')
    module = PipelineModule(layers=[LayerSpec(nn.Linear, 5, 8), LayerSpec(nn.ReLU), LayerSpec(nn.Linear, 8, 8),
                                    LayerSpec(nn.Linear, 8, 3)], num_stages=1, loss_fn=nn.MSELoss())
    engine, _ = make(module=module)
    path, client_state = engine.load_checkpoint(tmp_path / 'mlp')
    assert path == str(tag_dir) and client_state == {'epoch': 4, 'note': 'from deepspeed'}
    assert engine.global_steps == 100
    for index in (0, 2, 3):
        stored = torch.load(tag_dir / f'layer_{index:02d}-model_states.pt')
        for key, value in stored.items():
            torch.testing.assert_close(getattr(module.local_layers[index], key).detach(), value, rtol=0, atol=0)
