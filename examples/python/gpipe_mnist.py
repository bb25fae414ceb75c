"""Fashion-MNIST with pipetrain.GPipe: a torchgpipe training script whose import was changed.

    python3 examples/python/gpipe_mnist.py --steps 300

The model is plain PyTorch, cut into two partitions that run as a pipeline on pipetrain's
native workers (one thread per partition), 4 micro-batches per step, activation checkpointing
on all but the last micro-batch. Prints progress, then the test accuracy.
"""
import argparse
import gzip
import pathlib
import time

import torch
from torch import nn
import torch.nn.functional as F

from pipetrain import GPipe  # was: from torchgpipe import GPipe
from pipetrain.balance import balance_by_time

DATA = pathlib.Path('/usr/share/datasets/fashion-mnist')


def read_idx(path):
    """An IDX file (gzipped) as a uint8 tensor of its dimensions."""
    raw = gzip.open(path, 'rb').read()
    dims = raw[3]
    shape = [int.from_bytes(raw[4 + 4 * i:8 + 4 * i], 'big') for i in range(dims)]
    return torch.frombuffer(bytearray(raw[4 + 4 * dims:]), dtype=torch.uint8).reshape(shape)


def load(split):
    prefix = 'train' if split == 'train' else 't10k'
    images = read_idx(DATA / f'{prefix}-images-idx3-ubyte.gz').float().div_(255).sub_(0.2860).div_(0.3530)
    labels = read_idx(DATA / f'{prefix}-labels-idx1-ubyte.gz').long()
    return images.unsqueeze(1), labels


def make_model():
    return nn.Sequential(
        nn.Conv2d(1, 16, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(32 * 7 * 7, 128), nn.ReLU(), nn.Dropout(0.1), nn.Linear(128, 10))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--steps', type=int, default=300)
    parser.add_argument('--batch-size', type=int, default=128)
    parser.add_argument('--chunks', type=int, default=4)
    parser.add_argument('--partitions', type=int, default=2)
    parser.add_argument('--lr', type=float, default=0.05)
    parser.add_argument('--auto-balance', action='store_true', help='balance by measured time, not [6, 5]')
    args = parser.parse_args()
    torch.manual_seed(0)
    train_x, train_y = load('train')
    test_x, test_y = load('test')
    model = make_model()
    if args.auto_balance:
        balance = balance_by_time(args.partitions, model, train_x[:args.batch_size // args.chunks])
    else:
        balance = [6, 5] if args.partitions == 2 else None
    model = GPipe(model, balance, chunks=args.chunks, checkpoint='except_last')
    print(f'GPipe: balance {model.balance} on {[str(d) for d in model.devices]}, chunks {model.chunks}')
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    start = time.monotonic()
    order = torch.randperm(len(train_x))
    running = None
    for step in range(1, args.steps + 1):
        idx = order[(step - 1) * args.batch_size % len(order):][:args.batch_size]
        x, y = train_x[idx], train_y[idx].to(model.devices[-1])
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        running = loss.item() if running is None else 0.9 * running + 0.1 * loss.item()
        if step % max(args.steps // 10, 1) == 0 or step == args.steps:
            rate = step * args.batch_size / (time.monotonic() - start)
            print(f'step {step}/{args.steps}  loss {running:.4f}  {rate:.0f} samples/s', flush=True)
    model.eval()
    correct = 0
    with torch.no_grad():
        for i in range(0, len(test_x), 1000):
            correct += (model(test_x[i:i + 1000]).argmax(1) == test_y[i:i + 1000]).sum().item()
    print(f'test accuracy {correct / len(test_x):.4f} after {args.steps} steps '
          f'({time.monotonic() - start:.1f} s)')


if __name__ == '__main__':
    main()
