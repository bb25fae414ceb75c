"""pipetrain.balance: balances from measured time, from size, and the min-max split itself."""
import time

import pytest
import torch
from torch import nn

from pipetrain.balance import balance_by_size, balance_by_time, balance_cost


class Sleep(nn.Module):
    def __init__(self, seconds):
        super().__init__()
        self.seconds = seconds
        self.weight = nn.Parameter(torch.ones(1))

    def forward(self, x):
        time.sleep(self.seconds)
        return x * self.weight


def test_balance_cost_is_the_min_max_split():
    assert balance_cost([1, 1, 1, 1, 4], 2) == [4, 1]
    assert balance_cost([4, 1, 1, 1, 1], 2) == [1, 4]
    # The most expensive part is at best 9 ([4, 5]); among such splits the most even one.
    assert balance_cost([1, 2, 3, 4, 5, 6], 3) == [3, 2, 1]
    with pytest.raises(ValueError):
        balance_cost([1, 2], 3)


def test_balance_by_time_follows_the_slow_layers():
    # [3, 1] wins while twice a fast layer's time stays under the slow one's: with 1 ms against
    # 250 ms, a busy machine's wake-up delays (each layer pays one) would have to pass 240 ms.
    model = nn.Sequential(Sleep(0.001), Sleep(0.001), Sleep(0.001), Sleep(0.25))
    assert balance_by_time(2, model, torch.rand(1), timeout=0.5) == [3, 1]
    model = nn.Sequential(Sleep(0.25), Sleep(0.001), Sleep(0.001), Sleep(0.001))
    assert balance_by_time(2, model, torch.rand(1), timeout=0.5) == [1, 3]


def test_balance_by_time_leaves_the_model_untouched():
    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.Linear(4, 4))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    model.eval()
    balance_by_time(2, model, torch.rand(8, 4), timeout=0.2)
    assert not model.training and all(p.grad is None for p in model.parameters())
    for k, v in model.state_dict().items():
        torch.testing.assert_close(v, before[k], msg=k)


def test_balance_by_size_weighs_parameters_and_activations():
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 1024), nn.Linear(1024, 1024))
    assert balance_by_size(2, model, torch.rand(2, 4)) == [4, 1]
    # More chunks, smaller activations: parameters weigh more, but the last layer still dominates.
    assert balance_by_size(2, model, torch.rand(64, 4), chunks=8, param_scale=4.0)[-1] == 1


def test_balance_needs_a_sequential():
    with pytest.raises(TypeError, match='nn.Sequential'):
        balance_by_time(1, nn.Linear(1, 1), torch.rand(1))
