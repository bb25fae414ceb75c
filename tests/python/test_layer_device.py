"""Python layers on the stage's device: the stage's move reaches the Python module itself
(module.to, as DeepSpeed places its layers), so non-persistent buffers (a causal mask, a rotary
table) follow the parameters; init_distributed makes LOCAL_RANK's GPU the current CUDA device.
The CUDA test (a non-persistent buffer training on cuda:0) skips without CUDA."""
import pytest
import torch
import torch.distributed as dist
from torch import nn

import pipetrain
from pipetrain import GPipe
from pipetrain.comm import distributed as pt_dist
from pipetrain.errors import ConfigError


class Masked(nn.Module):
    """A layer whose mask is a non-persistent buffer: kept out of checkpoints, but needed on the
    device of the input."""

    def __init__(self, width):
        super().__init__()
        self.linear = nn.Linear(width, width)
        self.register_buffer('mask', torch.tril(torch.ones(width, width)), persistent=False)

    def forward(self, x):
        return self.linear(x) @ self.mask


def recording_moves(module):
    """Wraps module.to to record its arguments (the moves that reach the Python module)."""
    moves, to = [], module.to

    def recorder(*args, **kwargs):
        moves.append(args + tuple(kwargs.values()))
        return to(*args, **kwargs)
    module.to = recorder
    return moves


def test_the_stage_device_move_reaches_the_python_module():
    torch.manual_seed(0)
    layer = Masked(4)
    moves = recording_moves(layer)
    gpipe = GPipe(nn.Sequential(layer, nn.Linear(4, 2)), balance=[1, 1], devices=['cpu', 'cpu'], chunks=2)
    x = torch.randn(4, 4)
    gpipe(x).sum().backward()
    assert (torch.device('cpu'),) in moves, moves
    assert layer.mask.device.type == 'cpu'


def test_cuda_device_for_local_rank():
    assert pt_dist.cuda_device_for(3, 8) == 3
    assert pt_dist.cuda_device_for(0, 8) == 0
    assert pt_dist.cuda_device_for(5, 1) == 0  # each process shown its own GPU
    with pytest.raises(ConfigError, match='LOCAL_RANK 4 but this process sees 2 CUDA devices'):
        pt_dist.cuda_device_for(4, 2)


def test_init_distributed_makes_local_ranks_gpu_current(monkeypatch):
    chosen = []
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: True)
    monkeypatch.setattr(torch.cuda, 'device_count', lambda: 4)
    monkeypatch.setattr(torch.cuda, 'set_device', chosen.append)
    monkeypatch.setattr(pt_dist._C, 'launch_env', lambda: _env_with_local_rank(2))
    made_here = not dist.is_initialized()  # else an earlier test's group: adopted, the device set all the same
    try:
        pt_dist.init_distributed(dist_backend='gloo', verbose=False)
    finally:
        if made_here and dist.is_initialized():
            dist.destroy_process_group()
    assert chosen == [2]


_REAL_LAUNCH_ENV = pt_dist._C.launch_env


def _env_with_local_rank(local_rank):
    env = dict(_REAL_LAUNCH_ENV())
    env['local_rank'] = local_rank
    return env


@pytest.mark.skipif(not torch.cuda.is_available(), reason='no CUDA device here')
def test_a_non_persistent_buffer_trains_on_cuda():
    torch.manual_seed(0)
    model = nn.Sequential(Masked(8), nn.ReLU(), nn.Linear(8, 3))
    plain = nn.Sequential(Masked(8), nn.ReLU(), nn.Linear(8, 3))
    plain.load_state_dict(model.state_dict())
    x, y = torch.randn(16, 8), torch.randn(16, 3)
    nn.functional.mse_loss(plain(x), y).backward()
    gpipe = GPipe(model, balance=[2, 1], devices=['cuda:0', 'cuda:0'], chunks=4)
    assert model[0].mask.is_cuda
    out = gpipe(x.cuda())
    nn.functional.mse_loss(out, y.to(out.device)).backward()
    for (name, p), q in zip(model.named_parameters(), plain.parameters()):
        assert p.is_cuda, name
        torch.testing.assert_close(p.grad.cpu(), q.grad, rtol=1e-4, atol=1e-5, msg=name)


@pytest.mark.skipif(not torch.cuda.is_available(), reason='no CUDA device here')
def test_the_engine_moves_a_python_layers_non_persistent_buffer_to_cuda():
    from pipetrain.pipe import PipelineModule  # pylint: disable=import-outside-toplevel
    torch.manual_seed(0)
    layer = Masked(4)
    module = PipelineModule(layers=[layer, nn.ReLU(), nn.Linear(4, 2)], num_stages=1, loss_fn=nn.MSELoss())
    cfg = {'train_micro_batch_size_per_gpu': 2, 'gradient_accumulation_steps': 2, 'steps_per_print': 10**6,
           'optimizer': {'type': 'SGD', 'params': {'lr': 0.1}}}
    engine, _, _, _ = pipetrain.initialize(model=module, config=cfg)
    assert engine.device.type == 'cuda'
    assert layer.mask.is_cuda and layer.linear.weight.is_cuda  # before: the mask stayed on the CPU
    g = torch.Generator().manual_seed(1)
    data = [(torch.randn(2, 4, generator=g), torch.randn(2, 2, generator=g)) for _ in range(2)]
    loss = engine.train_batch(iter(data))
    assert torch.isfinite(loss).all()
