#!/usr/bin/env python3
"""An AlexNet-style CIFAR-10 classifier trained with DeepSpeed's pipeline engine on pipetrain.

    pipetrain launch -n 2 -- python3 examples/python/deepspeed_cifar.py \\
        --deepspeed_config examples/python/ds_config.json -p 2 --steps 50
    mpirun -np 2 python3 examples/python/deepspeed_cifar.py --deepspeed_config ... -p 2

Written as DeepSpeedExamples' training/pipeline_parallelism/train.py is: only the import lines
differ (`import pipetrain as deepspeed` where it has `import deepspeed`). The model is a list of
layers (join_layers) in a PipelineModule partitioned by parameter counts; initialize() gets the
training set and train_batch() pulls from its loader. `-p 1` on 2 processes trains 2 data-parallel
replicas of one stage instead.

The data: CIFAR-10's python batches (cifar-10-batches-py/data_batch_*) under --data-dir when they
are there; otherwise a synthetic CIFAR-shaped set (3x32x32 images, 10 classes), the same on every
run: each class a smooth colour pattern, each image its class's pattern plus noise, so the loss
falls within a few dozen steps.
"""
import argparse
import os
import pathlib
import pickle

import torch
import torch.distributed as dist
from torch import nn
import torch.nn.functional as F

import pipetrain as deepspeed  # was: import deepspeed
from pipetrain.accelerator import get_accelerator  # was: from deepspeed.accelerator import get_accelerator
from pipetrain.pipe import PipelineModule  # was: from deepspeed.pipe import PipelineModule

CIFAR_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR_STD = (0.2470, 0.2435, 0.2616)


class CifarBatches(torch.utils.data.Dataset):
    """CIFAR-10's training batches as the python pickles of its download hold them."""

    def __init__(self, folder):
        images, labels = [], []
        for path in sorted(pathlib.Path(folder).glob('data_batch_*')):
            with open(path, 'rb') as f:
                batch = pickle.load(f, encoding='bytes')
            images.append(torch.as_tensor(batch[b'data'], dtype=torch.uint8).view(-1, 3, 32, 32))
            labels.extend(batch[b'labels'])
        mean = torch.tensor(CIFAR_MEAN).view(3, 1, 1)
        std = torch.tensor(CIFAR_STD).view(3, 1, 1)
        self.images = (torch.cat(images).float() / 255 - mean) / std
        self.labels = torch.tensor(labels, dtype=torch.long)

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return self.images[i], self.labels[i]


class SyntheticCifar(torch.utils.data.Dataset):
    """A CIFAR-shaped set made from a fixed seed: the same images and labels on every rank and run."""

    def __init__(self, size=2048, noise=0.8, seed=0):
        g = torch.Generator().manual_seed(seed)
        patterns = F.interpolate(torch.randn(10, 3, 4, 4, generator=g), size=(32, 32), mode='bilinear',
                                 align_corners=False)
        self.labels = torch.randint(0, 10, (size,), generator=g)
        self.images = patterns[self.labels] + noise * torch.randn(size, 3, 32, 32, generator=g)

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return self.images[i], self.labels[i]


def load_cifar(dl_path, synthetic_size):
    batches = pathlib.Path(dl_path) / 'cifar-10-batches-py'
    if any(batches.glob('data_batch_*')):
        return CifarBatches(batches)
    return SyntheticCifar(synthetic_size)


def cifar_trainset(local_rank, dl_path='/tmp/cifar10-data', synthetic_size=2048):
    # Only local rank 0 prepares the data; the others wait for it, then read it.
    dist.barrier()
    if local_rank != 0:
        dist.barrier()
    trainset = load_cifar(dl_path, synthetic_size)
    if local_rank == 0:
        dist.barrier()
    return trainset


class AlexNet(nn.Module):
    """AlexNet's shape (five convolutions, three fully connected layers) sized for 32x32 images."""

    def __init__(self, num_classes=10, dropout=0.5):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 32, kernel_size=3, stride=2, padding=1),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(kernel_size=2),
            nn.Conv2d(32, 64, kernel_size=3, padding=1),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(kernel_size=2),
            nn.Conv2d(64, 96, kernel_size=3, padding=1),
            nn.ReLU(inplace=True),
            nn.Conv2d(96, 64, kernel_size=3, padding=1),
            nn.ReLU(inplace=True),
            nn.Conv2d(64, 64, kernel_size=3, padding=1),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(kernel_size=2),
        )
        self.avgpool = nn.AdaptiveAvgPool2d((2, 2))
        self.classifier = nn.Sequential(
            nn.Dropout(p=dropout),
            nn.Linear(64 * 2 * 2, 256),
            nn.ReLU(inplace=True),
            nn.Dropout(p=dropout),
            nn.Linear(256, 256),
            nn.ReLU(inplace=True),
            nn.Linear(256, num_classes),
        )

    def forward(self, x):
        x = self.avgpool(self.features(x))
        return self.classifier(torch.flatten(x, 1))


def join_layers(vision_model):
    layers = [
        *vision_model.features,
        vision_model.avgpool,
        lambda x: torch.flatten(x, 1),
        *vision_model.classifier,
    ]
    return layers


def get_args():
    parser = argparse.ArgumentParser(description='CIFAR')
    parser.add_argument('--local_rank', type=int, default=-1, help='local rank passed from distributed launcher')
    parser.add_argument('-s', '--steps', type=int, default=100, help='quit after this many steps')
    parser.add_argument('-p', '--pipeline-parallel-size', type=int, default=2, help='pipeline parallelism')
    parser.add_argument('--backend', type=str, default=get_accelerator().communication_backend_name(),
                        help='distributed backend')
    parser.add_argument('--seed', type=int, default=1138, help='PRNG seed')
    parser.add_argument('--dropout', type=float, default=0.5, help="dropout probability of the classifier")
    parser.add_argument('--data-dir', type=str, default='/tmp/cifar10-data',
                        help='where cifar-10-batches-py is; without it a synthetic set is used')
    parser.add_argument('--synthetic-size', type=int, default=2048, help='images in the synthetic set')
    parser = deepspeed.add_config_arguments(parser)
    args = parser.parse_args()
    return args


def train_pipe(args, part='parameters'):
    torch.manual_seed(args.seed)
    deepspeed.runtime.utils.set_random_seed(args.seed)

    #
    # Build the model
    #
    net = AlexNet(num_classes=10, dropout=args.dropout)
    net = PipelineModule(layers=join_layers(net),
                         loss_fn=torch.nn.CrossEntropyLoss(),
                         num_stages=args.pipeline_parallel_size,
                         partition_method=part,
                         activation_checkpoint_interval=0)

    trainset = cifar_trainset(args.local_rank, args.data_dir, args.synthetic_size)

    engine, _, _, _ = deepspeed.initialize(
        args=args,
        model=net,
        model_parameters=[p for p in net.parameters() if p.requires_grad],
        training_data=trainset)

    for step in range(args.steps):
        loss = engine.train_batch()
        if engine.global_rank == 0:
            print(f'step: {step + 1:3d} / {args.steps:3d} loss: {loss.item():.7f}', flush=True)


if __name__ == '__main__':
    args = get_args()

    deepspeed.init_distributed(dist_backend=args.backend)
    args.local_rank = int(os.environ['LOCAL_RANK'])
    get_accelerator().set_device(args.local_rank)

    train_pipe(args)
