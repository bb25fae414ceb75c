"""In-place operations at partition boundaries and under checkpointing."""
import pytest
import torch
from torch import nn

from pipetrain import GPipe


def test_inplace_relu_between_partitions_gives_correct_gradients():
    torch.manual_seed(0)
    plain = nn.Sequential(nn.Linear(4, 4), nn.ReLU(inplace=True), nn.Linear(4, 4), nn.ReLU(inplace=True))
    twin = nn.Sequential(nn.Linear(4, 4), nn.ReLU(inplace=True), nn.Linear(4, 4), nn.ReLU(inplace=True))
    twin.load_state_dict(plain.state_dict())
    gpipe = GPipe(twin, [1, 3], devices=['cpu', 'cpu'], chunks=2, checkpoint='never')
    x = torch.randn(6, 4)
    plain(x).sum().backward()
    gpipe(x).sum().backward()
    for a, b in zip(plain.parameters(), twin.parameters()):
        torch.testing.assert_close(b.grad, a.grad)


def test_inplace_on_a_recomputed_partition_input_is_pytorchs_error_as_in_torchgpipe():
    # Recomputation starts the partition from a leaf that requires grad, and PyTorch refuses
    # an in-place op on one: the same RuntimeError torchgpipe gives, not wrong gradients.
    model = GPipe(nn.Sequential(nn.Linear(4, 4), nn.ReLU(inplace=True)), [1, 1], devices=['cpu', 'cpu'],
                  checkpoint='always')
    y = model(torch.randn(2, 4))
    with pytest.raises(RuntimeError, match='a leaf Variable that requires grad (is being|has been) used in an in-place'):
        y.sum().backward()


def test_inplace_on_an_input_that_requires_grad_is_an_error_as_in_pytorch():
    class AddOneInPlace(nn.Module):
        def forward(self, x):
            return x.add_(1)

    model = GPipe(nn.Sequential(AddOneInPlace()), [1], devices=['cpu'], checkpoint='always')
    x = torch.rand(1, requires_grad=True)
    with pytest.raises(RuntimeError):
        y = model(x)
        torch.autograd.backward(y)
