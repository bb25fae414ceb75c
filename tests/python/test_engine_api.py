"""The PipelineEngine's DeepSpeed attributes and methods: one process (one stage) for most,
two ranks under the launcher (engine_api_worker.py) for what needs several stages or replicas:
eval_batch's arguments, reset_activation_shape, training_data shards, a client optimizer."""
import pathlib

import pytest
import torch
from torch import nn

import pipetrain
from pipetrain.pipe import LayerSpec, PipelineModule

from conftest import launch
import engine_cases
from test_initialize import (ACCUMULATION, MICRO, assert_same_parameters, base_config, batches, make_module,
                             plain_copy, plain_step)
from test_initialize import _one_engine_at_a_time  # noqa: F401  pylint: disable=unused-import

HERE = pathlib.Path(__file__).resolve().parent


def make(**extra):
    module = make_module()
    plain = plain_copy(module)
    cfg = base_config(optimizer={'type': 'SGD', 'params': {'lr': 0.1}}, **extra)
    engine, _, _, _ = pipetrain.initialize(model=module, config=cfg)
    return engine, module, plain


def test_the_attributes_a_deepspeed_script_reads():
    engine, module, _ = make()
    assert engine.module is module and engine.device == torch.device('cpu')
    assert engine.local_rank == 0 and engine.global_rank == 0 and engine.world_size == 1
    assert engine.train_batch_size() == MICRO * ACCUMULATION
    assert engine.train_micro_batch_size_per_gpu() == MICRO and engine.gradient_accumulation_steps() == ACCUMULATION
    assert not engine.is_gradient_accumulation_boundary()  # only inside train_batch, as DeepSpeed's pipeline
    assert not engine.was_step_applied() and engine.global_steps == 0 and engine.global_samples == 0
    engine.train_batch(iter(batches(1)))
    assert engine.was_step_applied() and engine.global_steps == 1 and engine.global_samples == MICRO * ACCUMULATION
    assert engine.eval() is engine and not module.training
    assert engine.train() is engine and module.training


def test_a_skipped_step_was_not_applied():
    engine, _, _ = make(pipeline={'on_nonfinite_loss': 'skip'})
    data = batches(1)
    data[0] = (torch.full_like(data[0][0], float('nan')), data[0][1])
    engine.train_batch(iter(data))
    assert not engine.was_step_applied() and engine.global_steps == 1


def test_global_steps_set_by_a_resuming_script_moves_the_lr_schedule():
    schedule = {'type': 'WarmupLR', 'params': {'warmup_min_lr': 0.0, 'warmup_max_lr': 0.1, 'warmup_num_steps': 10,
                                               'warmup_type': 'linear'}}
    engine, _, _ = make(scheduler=schedule)
    engine.global_steps = 5
    assert engine.global_steps == 5
    engine.train_batch(iter(batches(1)))
    assert engine.get_lr() == pytest.approx([0.05]) and engine.global_steps == 6


def test_set_train_batch_size_changes_the_micro_batches_per_step():
    engine, module, plain = make()
    oracle = torch.optim.SGD(plain.parameters(), lr=0.1)
    engine.set_train_batch_size(2 * MICRO)
    assert engine.gradient_accumulation_steps() == 2 and engine.train_batch_size() == 2 * MICRO
    data = batches(2)
    items = iter(data)
    for step in range(3):
        engine.train_batch(items)  # 2 micro-batches a step now: 6 in all
        plain_step(plain, oracle, data[2 * step:2 * step + 2])
    assert_same_parameters(module, plain)
    with pytest.raises(ValueError, match='divisible'):
        engine.set_train_batch_size(3)


def test_set_batch_fn_turns_each_item_into_the_pair():
    engine, module, plain = make()
    oracle = torch.optim.SGD(plain.parameters(), lr=0.1)
    data = batches(1)
    engine.set_batch_fn(lambda item: (item['x'], item['y']))
    engine.train_batch(iter([{'x': x, 'y': y} for x, y in data]))
    plain_step(plain, oracle, data)
    assert_same_parameters(module, plain)


@pytest.mark.parametrize('kind', ['list', 'dataloader'])
def test_set_dataiterator_takes_a_list_or_a_data_loader(kind):
    engine, module, plain = make()
    oracle = torch.optim.SGD(plain.parameters(), lr=0.1)
    data = batches(2)
    if kind == 'list':
        source = data
    else:
        xs = torch.cat([x for x, _ in data])
        ys = torch.cat([y for _, y in data])
        source = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(xs, ys), batch_size=MICRO)
    engine.set_dataiterator(source)
    for step in range(2):
        engine.train_batch()  # the second step continues where the first stopped
        plain_step(plain, oracle, data[step * ACCUMULATION:(step + 1) * ACCUMULATION])
    assert_same_parameters(module, plain)


def test_the_native_side_refuses_a_non_iterator_instead_of_calling_next_on_it():
    engine, _, _ = make()
    with pytest.raises(TypeError, match='not an iterator'):
        engine._native.train_batch(batches(1))  # a list straight to the native engine


def test_integer_labels_are_tensors():
    torch.manual_seed(4)
    module = PipelineModule(layers=[LayerSpec(nn.Linear, 4, 3)], num_stages=1, loss_fn=nn.CrossEntropyLoss())
    plain = plain_copy(module)
    engine, _, _, _ = pipetrain.initialize(model=module, config=base_config(
        train_micro_batch_size_per_gpu=2, gradient_accumulation_steps=2, optimizer={'type': 'SGD', 'params': {'lr': 0.1}}))
    g = torch.Generator().manual_seed(2)
    xs = [torch.randn(2, 4, generator=g) for _ in range(2)]
    labels = [[0, 2], [1, 1]]  # Python ints, as a hand-made list of samples gives them
    loss = engine.train_batch(iter(zip(xs, labels)))
    expected = sum(nn.functional.cross_entropy(plain(x), torch.tensor(y)).item() for x, y in zip(xs, labels)) / 2
    assert loss.item() == pytest.approx(expected, rel=1e-5)


def test_eval_batch_arguments_in_one_stage():
    engine, module, plain = make()
    data = batches(1)
    with torch.no_grad():
        outs = [plain(x) for x, _ in data]
        losses = [nn.functional.mse_loss(o, y) for o, (_, y) in zip(outs, data)]
    mean = engine.eval_batch(iter(data))
    assert mean.item() == pytest.approx(sum(l.item() for l in losses) / 3, rel=1e-5)
    per_micro = engine.eval_batch(iter(data), reduce_output=None)
    assert [l.item() for l in per_micro] == pytest.approx([l.item() for l in losses], rel=1e-5)
    outputs = engine.eval_batch(iter(data), compute_loss=False)
    torch.testing.assert_close(outputs, sum(outs) / 3, rtol=1e-5, atol=1e-6)
    loss, logits = engine.eval_batch(iter(data), return_logits=True, num_micro_batches=2)
    torch.testing.assert_close(logits, torch.cat(outs[:2]), rtol=1e-5, atol=1e-6)
    assert loss.item() == pytest.approx((losses[0].item() + losses[1].item()) / 2, rel=1e-5)
    assert module.training  # eval_batch puts the layers back in training mode


# -- two ranks ---------------------------------------------------------------------------------------

@pytest.fixture(scope='module')
def two_rank_results(tmp_path_factory):
    out = tmp_path_factory.mktemp('engine_api')
    launch(2, HERE / 'engine_api_worker.py', out)
    return out


def load(out, name, rank):
    return torch.load(out / f'{name}-rank{rank}.pt')


def test_eval_batch_across_two_stages_as_deepspeeds(two_rank_results):
    first, last = load(two_rank_results, 'eval', 0), load(two_rank_results, 'eval', 1)
    built = engine_cases.build_plain('mlp')
    _, loss_fn = engine_cases.specs('mlp')
    data = [engine_cases.micro_batch('mlp', i) for i in range(4)]
    outs = []
    with torch.no_grad():
        for x, _ in data:
            for _, forward in built:
                x = forward(x)
            outs.append(x)
    losses = [loss_fn(o, y).item() for o, (_, y) in zip(outs, data)]
    for r in (first, last):
        assert r['avg'] == pytest.approx(sum(losses) / 4, rel=1e-5)  # bcast_loss: on every stage
    assert first['no_bcast'] is None and last['no_bcast'] == pytest.approx(sum(losses) / 4, rel=1e-5)
    assert first['per_micro'] is None and last['per_micro'] == pytest.approx(losses, rel=1e-5)
    assert first['outputs'] is None
    torch.testing.assert_close(last['outputs'], sum(outs) / 4, rtol=1e-5, atol=1e-6)
    # Three rows a micro-batch after training on two: reset_activation_shape, then any shape.
    assert last['three_rows_logits'].shape == (3 * 4, 4) and first['three_rows_logits'] is None


def test_a_client_optimizer_across_two_stages_trains_as_one_process(two_rank_results):
    case = {'model': 'mlp', 'optimizer': 'AdamW', 'optimizer_params': {'weight_decay': 0.01}}
    expected_losses, expected_state = engine_cases.oracle(case, 1, 3)
    for rank in (0, 1):
        r = load(two_rank_results, 'client', rank)
        assert r['losses'] == pytest.approx(expected_losses, rel=1e-5)
        for index, state in r['state'].items():
            for key, value in state.items():
                torch.testing.assert_close(value, expected_state[index][key], rtol=2e-5, atol=1e-6)


def test_training_data_is_sharded_between_replicas_as_deepspeeds(two_rank_results):
    r0, r1 = load(two_rank_results, 'replicas', 0), load(two_rank_results, 'replicas', 1)
    # DistributedSampler without shuffling: replica r takes samples r, r + 2, r + 4, ...
    assert r0['first_inputs'] == [0.0, 2.0] and r1['first_inputs'] == [1.0, 3.0]
    assert r0['losses'] == r1['losses']
    assert 'zero_optimization.stage 1' in r0['zero_with_client']

