"""pipetrain.initialize's arguments as DeepSpeed's initialize takes them, in one process (one
stage): args and the config, a client optimizer (instance or callable, several groups),
model_parameters (groups, a subset, a generator), a client LR scheduler (instance or callable),
training_data with collate_fn, mpu, the config's unknown keys and tensorboard block. Each
trained result is compared with the same model and optimizer run without the engine."""
import argparse
import copy
import gc
import glob
import json
import warnings

import pytest
import torch
from torch import nn

import pipetrain
from pipetrain.pipe import LayerSpec, PipelineModule

MICRO = 2
ACCUMULATION = 3


def make_module():
    torch.manual_seed(3)
    return PipelineModule(layers=[LayerSpec(nn.Linear, 4, 8), LayerSpec(nn.Tanh), LayerSpec(nn.Linear, 8, 2)],
                          num_stages=1, loss_fn=nn.MSELoss())


def plain_copy(module):
    """The same layers, unpipelined (a deep copy taken before training)."""
    return nn.Sequential(*[copy.deepcopy(module.local_layers[i]) for i in sorted(module.local_layers)])


def base_config(**extra):
    cfg = {'train_micro_batch_size_per_gpu': MICRO, 'gradient_accumulation_steps': ACCUMULATION,
           'steps_per_print': 10**6}
    cfg.update(extra)
    return cfg


def batches(steps, seed=11):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(MICRO, 4, generator=g), torch.randn(MICRO, 2, generator=g))
            for _ in range(steps * ACCUMULATION)]


def plain_step(model, optimizer, micro_batches):
    """One step of the unpipelined oracle: the mean of the micro-batch losses."""
    optimizer.zero_grad()
    total = 0.0
    for x, y in micro_batches:
        loss = nn.functional.mse_loss(model(x), y) / len(micro_batches)
        loss.backward()
        total += loss.item()
    optimizer.step()
    return total


def assert_same_parameters(module, plain):
    for p, q in zip(module.parameters(), plain.parameters()):
        torch.testing.assert_close(p.detach(), q.detach(), rtol=1e-5, atol=1e-6)


@pytest.fixture(autouse=True)
def _one_engine_at_a_time():
    yield
    gc.collect()  # each test's engine is gone before the next one makes its own


def decay_groups(model):
    """Weight decay on the weights only, another learning rate for the biases."""
    weights = [p for n, p in model.named_parameters() if n.endswith('weight')]
    biases = [p for n, p in model.named_parameters() if n.endswith('bias')]
    return [{'params': weights, 'weight_decay': 0.1}, {'params': biases, 'weight_decay': 0.0, 'lr': 0.05}]


@pytest.mark.parametrize('how', ['instance', 'callable'])
def test_a_client_optimizer_with_two_groups_trains_as_the_plain_model(how):
    module = make_module()
    plain = plain_copy(module)
    if how == 'instance':
        optimizer = torch.optim.AdamW(decay_groups(module), lr=0.01)
        engine, returned, _, _ = pipetrain.initialize(model=module, optimizer=optimizer, config=base_config())
        assert returned is optimizer
    else:
        engine, returned, _, _ = pipetrain.initialize(model=module, model_parameters=decay_groups(module),
                                                      optimizer=lambda groups: torch.optim.AdamW(groups, lr=0.01),
                                                      config=base_config())
        assert isinstance(returned, torch.optim.AdamW) and len(returned.param_groups) == 2
    oracle = torch.optim.AdamW(decay_groups(plain), lr=0.01)
    data = batches(4)
    for step in range(4):
        loss = engine.train_batch(iter(data[step * ACCUMULATION:(step + 1) * ACCUMULATION]))
        expected = plain_step(plain, oracle, data[step * ACCUMULATION:(step + 1) * ACCUMULATION])
        assert loss.item() == pytest.approx(expected, rel=1e-5)
    assert_same_parameters(module, plain)
    assert engine.get_lr() == [0.01, 0.05]


@pytest.mark.parametrize('how', ['instance', 'callable'])
def test_a_client_lr_scheduler_steps_once_per_batch_and_reaches_the_parameters(how):
    module = make_module()
    plain = plain_copy(module)
    optimizer = torch.optim.SGD(module.parameters(), lr=0.2, momentum=0.5)
    lambda_lr = lambda step: 0.5 ** step  # noqa: E731
    scheduler = (torch.optim.lr_scheduler.LambdaLR(optimizer, lambda_lr) if how == 'instance'
                 else lambda opt: torch.optim.lr_scheduler.LambdaLR(opt, lambda_lr))
    engine, _, _, returned = pipetrain.initialize(model=module, optimizer=optimizer, lr_scheduler=scheduler,
                                                  config=base_config())
    assert isinstance(returned, torch.optim.lr_scheduler.LambdaLR)
    oracle = torch.optim.SGD(plain.parameters(), lr=0.2, momentum=0.5)
    oracle_scheduler = torch.optim.lr_scheduler.LambdaLR(oracle, lambda_lr)
    data = batches(4)
    lrs, expected_lrs = [], []
    for step in range(4):
        lrs.append(engine.get_lr()[0])
        expected_lrs.append(oracle_scheduler.get_last_lr()[0])
        engine.train_batch(iter(data[step * ACCUMULATION:(step + 1) * ACCUMULATION]))
        plain_step(plain, oracle, data[step * ACCUMULATION:(step + 1) * ACCUMULATION])
        oracle_scheduler.step()
    assert lrs == pytest.approx(expected_lrs) and lrs == pytest.approx([0.2, 0.1, 0.05, 0.025])
    assert_same_parameters(module, plain)


def test_parameter_groups_take_the_config_optimizer_and_its_warmup():
    module = make_module()
    plain = plain_copy(module)
    cfg = base_config(optimizer={'type': 'AdamW', 'params': {'lr': 0.01}},
                      scheduler={'type': 'WarmupLR', 'params': {'warmup_min_lr': 0.0, 'warmup_max_lr': 0.01,
                                                                'warmup_num_steps': 3, 'warmup_type': 'linear'}})
    engine, optimizer, _, scheduler = pipetrain.initialize(model=module, model_parameters=decay_groups(module),
                                                           config=cfg)
    assert isinstance(optimizer, torch.optim.AdamW) and scheduler is not None
    oracle = torch.optim.AdamW(decay_groups(plain), lr=0.01)
    data = batches(4)
    for step in range(4):
        lr = 0.01 * min(1.0, step / 3)  # DeepSpeed's linear warmup over 3 steps, from 0
        for g in oracle.param_groups:
            g['lr'] = lr
        engine.train_batch(iter(data[step * ACCUMULATION:(step + 1) * ACCUMULATION]))
        plain_step(plain, oracle, data[step * ACCUMULATION:(step + 1) * ACCUMULATION])
        assert engine.get_lr() == pytest.approx([lr, lr])
    assert_same_parameters(module, plain)


@pytest.mark.parametrize('as_generator', [False, True])
def test_a_subset_of_the_parameters_trains_and_the_rest_stays(as_generator):
    module = make_module()
    plain = plain_copy(module)
    first_layer = list(module.local_layers[0].parameters())
    chosen = (p for p in first_layer) if as_generator else first_layer
    engine, _, _, _ = pipetrain.initialize(model=module, model_parameters=chosen,
                                           config=base_config(optimizer={'type': 'SGD', 'params': {'lr': 0.1}}))
    oracle = torch.optim.SGD(plain[0].parameters(), lr=0.1)
    data = batches(3)
    for step in range(3):
        engine.train_batch(iter(data[step * ACCUMULATION:(step + 1) * ACCUMULATION]))
        plain_step(plain, oracle, data[step * ACCUMULATION:(step + 1) * ACCUMULATION])
    assert_same_parameters(module, plain)
    assert not torch.equal(module.local_layers[0].weight, make_module().local_layers[0].weight)


def test_training_data_is_loaded_in_micro_batches_and_repeats_with_a_new_epoch():
    module = make_module()
    plain = plain_copy(module)
    g = torch.Generator().manual_seed(5)
    xs, ys = torch.randn(8, 4, generator=g), torch.randn(8, 2, generator=g)
    dataset = torch.utils.data.TensorDataset(xs, ys)
    seen_sizes = []

    def collate(items):
        seen_sizes.append(len(items))
        return torch.stack([x for x, _ in items]), torch.stack([y for _, y in items])

    cfg = base_config(optimizer={'type': 'SGD', 'params': {'lr': 0.1}}, dataloader_drop_last=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        engine, _, loader, _ = pipetrain.initialize(model=module, training_data=dataset, collate_fn=collate,
                                                    config=cfg)
    assert isinstance(loader, pipetrain.pipe.RepeatingLoader)
    sampler = loader.loader.sampler
    assert isinstance(sampler, torch.utils.data.DistributedSampler) and not sampler.shuffle
    assert loader.loader.batch_size == MICRO and loader.loader.drop_last
    assert not caught, [str(w.message) for w in caught]  # dataloader_drop_last is honoured, not ignored
    oracle = torch.optim.SGD(plain.parameters(), lr=0.1)
    # 8 samples = 4 micro-batches a pass; 3 steps of 3 pull 9: the third pass has begun.
    order = [(xs[i:i + 2], ys[i:i + 2]) for i in range(0, 8, 2)] * 3
    for step in range(3):
        engine.train_batch()
        plain_step(plain, oracle, order[step * ACCUMULATION:(step + 1) * ACCUMULATION])
    assert_same_parameters(module, plain)
    assert set(seen_sizes) == {MICRO} and sampler.epoch == 2


def test_the_config_comes_from_args_once():
    module = make_module()
    args = argparse.Namespace(deepspeed_config=None, deepscale_config=None, local_rank=0)
    with pytest.raises(pipetrain.ConfigError, match='needs a config'):
        pipetrain.initialize(args=args, model=module)
    args.deepspeed_config = {'train_batch_size': 2}
    with pytest.raises(pipetrain.ConfigError, match='given twice'):
        pipetrain.initialize(args=args, model=module, config={'train_batch_size': 2})
    args.deepscale_config = 'old.json'
    with pytest.raises(pipetrain.ConfigError, match='deepscale_config'):
        pipetrain.initialize(args=args, model=module)
    args.local_rank = 3
    args.deepscale_config = None
    with pytest.raises(pipetrain.ConfigError, match='args.local_rank is 3'):
        pipetrain.initialize(args=args, model=module)


def test_args_deepspeed_config_is_read_and_local_rank_set(tmp_path):
    path = tmp_path / 'ds.json'
    path.write_text(json.dumps(base_config(train_micro_batch_size_per_gpu=3)))
    args = argparse.Namespace(deepspeed_config=str(path), local_rank=-1)
    engine, _, _, _ = pipetrain.initialize(args=args, model=make_module())
    assert engine.train_micro_batch_size_per_gpu() == 3 and args.local_rank == engine.local_rank == 0
    del engine
    gc.collect()
    engine, _, _, _ = pipetrain.initialize(model=make_module(), config_params=base_config(gradient_accumulation_steps=5))
    assert engine.gradient_accumulation_steps() == 5


def test_a_foreign_mpu_is_refused():
    with pytest.raises(pipetrain.ConfigError, match='mpu: a object'):
        pipetrain.initialize(model=make_module(), config=base_config(), mpu=object())


def test_unknown_top_level_keys_warn_as_deepspeed_ignores_them_and_zero3_is_refused():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        engine, _, _, _ = pipetrain.initialize(model=make_module(), config=base_config(my_own_key=1))
    messages = [str(w.message) for w in caught]
    assert any('"my_own_key"' in m and 'ignored' in m for m in messages), messages
    assert torch.isfinite(engine.train_batch(iter(batches(1))))
    del engine
    gc.collect()
    with pytest.raises(pipetrain.ConfigError, match='unknown key "zero_optimization.stage_typo"'):
        pipetrain.initialize(model=make_module(), config=base_config(zero_optimization={'stage_typo': 1}))
    with pytest.raises(pipetrain.ConfigError, match='ZeRO stage 2/3'):
        pipetrain.initialize(model=make_module(), config=base_config(zero_optimization={'stage': 3}))


def test_the_tensorboard_block_writes_the_training_loss(tmp_path):
    cfg = base_config(tensorboard={'enabled': True, 'output_path': str(tmp_path), 'job_name': 'job'})
    engine, _, _, _ = pipetrain.initialize(model=make_module(), config=cfg)
    losses = [engine.train_batch(iter(batches(1, seed=s))).item() for s in range(2)]
    files = glob.glob(str(tmp_path / 'job' / 'events.out.tfevents.*'))
    assert len(files) == 1
    data = open(files[0], 'rb').read()
    assert data.count(b'Train/Samples/train_loss') == 2 and data.count(b'Train/Samples/lr') == 2
    assert all(torch.isfinite(torch.tensor(losses)))


def test_a_deleted_engine_frees_the_process_for_another_while_its_optimizer_lives():
    engine, optimizer, _, scheduler = pipetrain.initialize(
        model=make_module(), config=base_config(scheduler={'type': 'WarmupLR', 'params': {'warmup_num_steps': 2}}))
    del engine
    gc.collect()
    again, _, _, _ = pipetrain.initialize(model=make_module(), config=base_config())
    assert again.train_micro_batch_size_per_gpu() == MICRO
    with pytest.raises(pipetrain.UsageError, match='is gone'):
        optimizer.param_groups  # pylint: disable=pointless-statement
    with pytest.raises(pipetrain.UsageError, match='is gone'):
        scheduler.get_last_lr()


def test_the_native_optimizer_stands_in_with_its_learning_rate():
    engine, optimizer, loader, scheduler = pipetrain.initialize(
        model=make_module(), config=base_config(optimizer={'type': 'SGD', 'params': {'lr': 0.3}}))
    assert loader is None and scheduler is None  # DeepSpeed: no scheduler block, no scheduler
    assert optimizer.param_groups[0]['lr'] == 0.3
    with pytest.raises(pipetrain.UsageError, match='inside train_batch'):
        optimizer.step()
    del engine


@pytest.mark.parametrize('extra', [{'gradient_clipping': 0.05}, {'bf16': {'enabled': True}}],
                         ids=['clipped', 'bf16'])
def test_a_client_optimizer_steps_after_the_engine_clips_and_unscales_as_its_own_optimizer_would(extra):
    data = batches(3)
    results = []
    for client in (False, True):
        module = make_module()
        cfg = base_config(optimizer={'type': 'SGD', 'params': {'lr': 0.1, 'momentum': 0.9}}, **extra)
        optimizer = torch.optim.SGD(module.parameters(), lr=0.1, momentum=0.9) if client else None
        engine, _, _, _ = pipetrain.initialize(model=module, optimizer=optimizer, config=cfg)
        for step in range(3):
            engine.train_batch(iter(data[step * ACCUMULATION:(step + 1) * ACCUMULATION]))
        results.append([p.detach().clone() for p in module.parameters()])
        del engine
        gc.collect()
    for native, python in zip(*results):
        torch.testing.assert_close(python, native, rtol=1e-5, atol=1e-6)
