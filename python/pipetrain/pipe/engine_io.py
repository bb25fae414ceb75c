"""The engine's data: DeepSpeed's RepeatingLoader, its training loader (deepspeed_io) and the
iterators train_batch and eval_batch pull micro-batches from."""
import torch

from ..errors import ConfigError

__all__ = ['RepeatingLoader', 'training_loader', 'as_iterator', 'with_batch_fn']


class RepeatingLoader:
    """An iterator over a data loader that starts it again when it ends (DeepSpeed's). Each new
    pass tells the loader's DistributedSampler its epoch, so a shuffling sampler reorders."""

    def __init__(self, loader):
        self.loader = loader
        self.epoch = 0
        self.data_iter = iter(self.loader)

    def __iter__(self):
        return self

    def __next__(self):
        try:
            return next(self.data_iter)
        except StopIteration:
            self.epoch += 1
            sampler = getattr(self.loader, 'sampler', None)
            if hasattr(sampler, 'set_epoch'):
                sampler.set_epoch(self.epoch)
            self.data_iter = iter(self.loader)
            return next(self.data_iter)


def training_loader(dataset, micro_batch_size, replicas, replica, collate_fn=None, drop_last=False):
    """DeepSpeed's pipeline training loader (PipelineEngine._build_data_iter over deepspeed_io):
    this replica's shard of ``dataset`` by a DistributedSampler over the data-parallel group,
    in order (no shuffle), in micro-batches, ``drop_last`` as the config's dataloader_drop_last."""
    if not isinstance(dataset, (torch.utils.data.Dataset, torch.utils.data.IterableDataset)):
        raise ConfigError(f'training_data is a {type(dataset).__name__}; give a torch.utils.data.Dataset '
                          '(DeepSpeed takes nothing else), or pass an iterator to train_batch()')
    sampler = torch.utils.data.DistributedSampler(dataset, num_replicas=replicas, rank=replica, shuffle=False)
    return torch.utils.data.DataLoader(dataset, batch_size=micro_batch_size, sampler=sampler, collate_fn=collate_fn,
                                       drop_last=drop_last)


def as_iterator(data):
    """An iterator over ``data``: itself when it is one, else iter(data) (a list, a DataLoader),
    so that the native side only ever calls next on an iterator."""
    if hasattr(data, '__next__'):
        return data
    try:
        return iter(data)
    except TypeError:
        raise TypeError(f'the data is a {type(data).__name__}, which is neither an iterator nor iterable; pass an '
                        'iterator of (inputs, labels) micro-batches, a list of them or a DataLoader') from None


def with_batch_fn(iterator, batch_fn):
    """``iterator`` with ``batch_fn`` applied to each item as it is pulled (DeepSpeed's
    set_batch_fn); pulls nothing ahead."""
    if batch_fn is None:
        return iterator
    return (batch_fn(item) for item in iterator)
