"""The DeepSpeed-style CIFAR example (examples/python/deepspeed_cifar.py), run unchanged as a
DeepSpeed user runs it, pipelined on 2 processes under `pipetrain launch` and mpirun, gives the
losses of the same model trained without a pipeline: data-parallel on 2 processes (plain torch,
all_reduce) and in one process.

Run as a script (`python3 test_deepspeed_cifar.py reference ...`) this file is the data-parallel
reference's worker."""
import argparse
import importlib.util
import json
import os
import pathlib
import pickle
import re
import shutil
import socket
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

import pipetrain
from conftest import launch

EXAMPLES = pathlib.Path(os.environ.get('PIPETRAIN_SOURCE_DIR', pathlib.Path(__file__).resolve().parents[2])) / \
    'examples' / 'python'
EXAMPLE = EXAMPLES / 'deepspeed_cifar.py'
STEPS = 4
SEED = 1138
SYNTHETIC = 256
CONFIG = {'train_batch_size': 16, 'train_micro_batch_size_per_gpu': 4,
          'optimizer': {'type': 'Adam', 'params': {'lr': 0.001, 'betas': [0.9, 0.999], 'eps': 1e-8,
                                                   'weight_decay': 0}},
          'steps_per_print': 100, 'wall_clock_breakdown': False}
LOSS = re.compile(r'step: +(\d+) / +\d+ loss: (\d+\.\d+)')


def example_module():
    spec = importlib.util.spec_from_file_location('deepspeed_cifar', EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def reference_losses(config, steps, seed, data_dir, synthetic_size, rank=0, world=1):
    """The example's model and data trained without a pipeline: each of ``world`` replicas takes
    its DistributedSampler shard in order (DeepSpeed's pipeline loader, PipelineEngine._build_data_iter:
    no shuffle), accumulates its micro-batches, and the
    gradients and losses are averaged across replicas."""
    from pipetrain.runtime.utils import set_random_seed  # pylint: disable=import-outside-toplevel
    from pipetrain.utils import RepeatingLoader  # pylint: disable=import-outside-toplevel
    example = example_module()
    torch.manual_seed(seed)
    set_random_seed(seed)
    net = example.AlexNet(num_classes=10, dropout=0.0)
    layers = example.join_layers(net)
    trainset = example.load_cifar(data_dir, synthetic_size)
    micro = config['train_micro_batch_size_per_gpu']
    gas = config['train_batch_size'] // (micro * world)
    sampler = torch.utils.data.DistributedSampler(trainset, num_replicas=world, rank=rank, shuffle=False)
    batches = iter(RepeatingLoader(torch.utils.data.DataLoader(trainset, batch_size=micro, sampler=sampler,
                                                               drop_last=True)))
    params = config['optimizer']['params']
    opt = torch.optim.Adam(net.parameters(), lr=params['lr'], betas=params['betas'], eps=params['eps'],
                           weight_decay=params['weight_decay'])
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        total = torch.zeros(())
        for _ in range(gas):
            x, y = next(batches)
            for layer in layers:
                x = layer(x)
            loss = F.cross_entropy(x, y)
            (loss / gas).backward()
            total += loss.detach() / gas
        if world > 1:
            for p in net.parameters():
                torch.distributed.all_reduce(p.grad)
                p.grad /= world
            torch.distributed.all_reduce(total)
            total /= world
        opt.step()
        losses.append(total.item())
    return losses


def free_port():
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def losses_of(output):
    found = [(int(step), float(loss)) for step, loss in LOSS.findall(output)]
    assert [s for s, _ in found] == list(range(1, STEPS + 1)), output[-4000:]
    return [loss for _, loss in found]


def assert_same_losses(got, expected, output):
    assert len(got) == len(expected), output[-4000:]
    for step, (g, e) in enumerate(zip(got, expected), 1):
        # Printed to 7 decimals; the same arithmetic in another order differs by about 1e-7.
        assert abs(g - e) <= 5e-5, f'step {step}: {got} vs {expected}\n{output[-4000:]}'


def example_args(tmp_path, pipeline_size):
    config = tmp_path / 'ds_config.json'
    config.write_text(json.dumps(CONFIG))
    return ['--deepspeed', '--deepspeed_config', str(config), '-p', str(pipeline_size), '--steps', str(STEPS),
            '--seed', str(SEED), '--dropout', '0', '--data-dir', str(tmp_path / 'no-cifar-here'),
            '--synthetic-size', str(SYNTHETIC)]


def test_shipped_config_is_the_examples():
    config = json.loads((EXAMPLES / 'ds_config.json').read_text())
    assert config['train_batch_size'] % config['train_micro_batch_size_per_gpu'] == 0
    assert config['optimizer']['type'] == 'Adam'


def test_one_process_reference_learns(tmp_path):
    # The oracle itself: on the synthetic set the loss falls from ln(10).
    losses = reference_losses(CONFIG, 40, SEED, tmp_path, SYNTHETIC)
    assert abs(losses[0] - 2.303) < 0.2 and sum(losses[-5:]) / 5 < losses[0] - 0.5, losses


def test_real_cifar_batches_are_read_when_present(tmp_path):
    folder = tmp_path / 'cifar-10-batches-py'
    folder.mkdir()
    data = torch.randint(0, 256, (5, 3072), dtype=torch.uint8).numpy()
    with open(folder / 'data_batch_1', 'wb') as f:
        pickle.dump({b'data': data, b'labels': [3, 1, 4, 1, 5]}, f)
    trainset = example_module().load_cifar(tmp_path, SYNTHETIC)
    assert len(trainset) == 5
    image, label = trainset[2]
    assert image.shape == (3, 32, 32) and int(label) == 4
    expected = (torch.as_tensor(data[2, :1024]).float().view(32, 32) / 255 - 0.4914) / 0.2470
    torch.testing.assert_close(image[0], expected)


def test_pipelined_on_two_processes_matches_data_parallel_and_one_process(tmp_path):
    one_process = reference_losses(CONFIG, STEPS, SEED, tmp_path / 'no-cifar-here', SYNTHETIC)

    pipelined = launch(2, EXAMPLE, *example_args(tmp_path, 2), time_limit=240)
    assert_same_losses(losses_of(pipelined.stdout), one_process, pipelined.stdout)

    config = tmp_path / 'ds_config.json'
    data_parallel = launch(2, pathlib.Path(__file__), 'reference', '--config', str(config), '--steps', str(STEPS),
                           '--seed', str(SEED), '--data-dir', str(tmp_path / 'no-cifar-here'),
                           '--synthetic-size', str(SYNTHETIC), time_limit=240)
    assert_same_losses(losses_of(data_parallel.stdout), one_process, data_parallel.stdout)


def test_one_stage_with_two_replicas_matches_one_process(tmp_path):
    # -p 1 on 2 processes: the engine's data-parallel replicas of a single stage.
    one_process = reference_losses(CONFIG, STEPS, SEED, tmp_path / 'no-cifar-here', SYNTHETIC)
    replicas = launch(2, EXAMPLE, *example_args(tmp_path, 1), time_limit=240)
    assert_same_losses(losses_of(replicas.stdout), one_process, replicas.stdout)


def test_pipelined_under_mpirun_matches_one_process(tmp_path):
    mpirun = shutil.which('mpirun')
    if mpirun is None:
        pytest.skip('mpirun (openmpi-bin) is not installed')
    one_process = reference_losses(CONFIG, STEPS, SEED, tmp_path / 'no-cifar-here', SYNTHETIC)
    # As a DeepSpeed user runs it: mpirun sets only OMPI_COMM_WORLD_*, init_distributed finds the rest
    # (the port is given only because the derived one might be taken by a test running beside this).
    env = {k: v for k, v in os.environ.items() if k not in ('RANK', 'WORLD_SIZE', 'LOCAL_RANK', 'LOCAL_WORLD_SIZE',
                                                              'MASTER_ADDR', 'MASTER_PORT')}
    env.update(OMP_NUM_THREADS='1', MASTER_PORT=str(free_port()))
    # mpirun passes on only the variables named with -x; PYTHONPATH must exist to be named.
    env.setdefault('PYTHONPATH', str(pathlib.Path(pipetrain.__file__).resolve().parents[1]))
    cmd = [mpirun, '-np', '2', '--allow-run-as-root', '--oversubscribe',
           '-x', 'PYTHONPATH', '-x', 'OMP_NUM_THREADS', '-x', 'MASTER_PORT',
           sys.executable, str(EXAMPLE), *example_args(tmp_path, 2)]
    result = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300,
                            check=False)
    assert result.returncode == 0, result.stdout[-6000:]
    assert_same_losses(losses_of(result.stdout), one_process, result.stdout)


def _reference_worker():
    parser = argparse.ArgumentParser()
    parser.add_argument('mode', choices=['reference'])
    parser.add_argument('--config', required=True)
    parser.add_argument('--steps', type=int, required=True)
    parser.add_argument('--seed', type=int, required=True)
    parser.add_argument('--data-dir', required=True)
    parser.add_argument('--synthetic-size', type=int, required=True)
    args = parser.parse_args()
    # Debian's torch 2.x has no libuv, which env:// asks for unless USE_LIBUV=0.
    os.environ.setdefault('USE_LIBUV', '0')
    torch.distributed.init_process_group('gloo', init_method='env://')
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    with open(args.config, encoding='utf-8') as f:
        config = json.load(f)
    losses = reference_losses(config, args.steps, args.seed, args.data_dir, args.synthetic_size, rank, world)
    if rank == 0:
        for step, loss in enumerate(losses, 1):
            print(f'step: {step:3d} / {args.steps:3d} loss: {loss:.7f}', flush=True)
    torch.distributed.destroy_process_group()


if __name__ == '__main__':
    _reference_worker()
