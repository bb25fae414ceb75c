"""The oracle for pipetrain.GPipe: a pipelined step gives the same outputs, loss and every
gradient as the same Python model run without a pipeline, for each checkpoint mode, chunk count
and partitioning, with native and with Python layers."""
import copy

import pytest
import torch
from torch import nn
import torch.nn.functional as F

from pipetrain import GPipe


class Residual(nn.Module):
    """A Python layer with parameters of its own and a nested child."""

    def __init__(self, width):
        super().__init__()
        self.inner = nn.Sequential(nn.Linear(width, width), nn.Tanh())
        self.scale = nn.Parameter(torch.tensor(0.5))

    def forward(self, x):
        return x + self.scale * self.inner(x)


class Noisy(nn.Module):
    """Draws from the default generator inside a Python layer: checkpointing must replay it."""

    def forward(self, x):
        return F.dropout(x, 0.3, self.training)


def model_of(kind, width=8):
    torch.manual_seed(1)
    if kind == 'linears':
        return nn.Sequential(*[m for _ in range(4) for m in (nn.Linear(width, width), nn.ReLU())])
    if kind == 'mixed':
        return nn.Sequential(nn.Linear(width, width), nn.GELU(), Residual(width), nn.LayerNorm(width),
                             nn.Linear(width, width), nn.Sigmoid(), Residual(width), nn.Linear(width, 3))
    raise ValueError(kind)


def grads(model):
    return {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize('kind', ['linears', 'mixed'])
@pytest.mark.parametrize('checkpoint', ['never', 'except_last', 'always'])
@pytest.mark.parametrize('chunks', [1, 3, 4])
@pytest.mark.parametrize('native', [True, False])
def test_gradients_equal_the_plain_model(kind, checkpoint, chunks, native):
    plain = model_of(kind)
    piped_model = copy.deepcopy(plain)
    n = len(plain)
    balance = [n // 2, n - n // 2] if chunks != 3 else [1, n - 3, 2]
    gpipe = GPipe(piped_model, balance, devices=['cpu'] * len(balance), chunks=chunks, checkpoint=checkpoint,
                  native_layers=native)
    x = torch.randn(12, 8)
    target = torch.randn(12, 8 if kind == 'linears' else 3)
    out_plain = plain(x)
    F.mse_loss(out_plain, target).backward()
    out_piped = gpipe(x)
    F.mse_loss(out_piped, target).backward()
    torch.testing.assert_close(out_piped, out_plain, rtol=1e-5, atol=1e-6)
    expected = {n: g for n, g in grads(plain).items()}
    got = {n.split('.', 2)[2]: g for n, g in grads(gpipe).items()}  # partitions.J.<name>
    assert got.keys() == expected.keys()
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], rtol=1e-5, atol=1e-6, msg=name)


def test_input_gradients_flow_to_the_caller():
    plain = model_of('mixed')
    gpipe = GPipe(copy.deepcopy(plain), [4, 4], devices=['cpu', 'cpu'], chunks=4)
    x1 = torch.randn(8, 8, requires_grad=True)
    x2 = x1.detach().clone().requires_grad_()
    plain(x1).sum().backward()
    gpipe(x2).sum().backward()
    torch.testing.assert_close(x2.grad, x1.grad, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize('checkpoint', ['always', 'except_last'])
def test_recomputation_replays_python_dropout_and_native_dropout(checkpoint):
    torch.manual_seed(3)
    model = nn.Sequential(nn.Linear(8, 8), Noisy(), nn.Linear(8, 8), nn.Dropout(0.4), nn.Linear(8, 1))
    twin = copy.deepcopy(model)
    checkpointed = GPipe(model, [2, 3], devices=['cpu', 'cpu'], chunks=4, checkpoint=checkpoint)
    never = GPipe(twin, [2, 3], devices=['cpu', 'cpu'], chunks=4, checkpoint='never')
    x = torch.randn(16, 8)
    torch.manual_seed(11)
    out = checkpointed(x)
    torch.manual_seed(11)
    reference = never(x)
    torch.manual_seed(12)
    other = never(x)
    torch.testing.assert_close(out, reference)  # the same masks in forward, whatever the timing
    assert not torch.allclose(other, reference)  # and the dropouts did drop
    out.sum().backward()
    reference.sum().backward()
    # Only masks drawn again identically in the recomputation give backward the same gradients.
    for (name, a), b in zip(twin.named_parameters(), model.parameters()):
        torch.testing.assert_close(b.grad, a.grad, rtol=1e-5, atol=1e-6, msg=name)


def test_training_steps_match_the_plain_model():
    plain = model_of('mixed')
    piped = copy.deepcopy(plain)
    gpipe = GPipe(piped, [3, 5], devices=['cpu', 'cpu'], chunks=4)
    opt_plain = torch.optim.SGD(plain.parameters(), lr=0.1, momentum=0.9)
    opt_piped = torch.optim.SGD(gpipe.parameters(), lr=0.1, momentum=0.9)
    torch.manual_seed(5)
    for _ in range(5):
        x, y = torch.randn(16, 8), torch.randn(16, 3)
        for model, opt in ((plain, opt_plain), (gpipe, opt_piped)):
            opt.zero_grad()
            F.mse_loss(model(x), y).backward()
            opt.step()
    for (name, a), b in zip(plain.named_parameters(), piped.parameters()):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6, msg=name)
