"""Deferred batch normalization: running statistics per mini-batch, not per micro-batch.

A BatchNorm in a pipeline sees one micro-batch at a time, so its running mean and variance
would move once per micro-batch, from micro-batch statistics. DeferredBatchNorm normalizes each
micro-batch by its own statistics, as BatchNorm does in training, but accumulates the sums of
every micro-batch of the mini-batch and updates the running statistics once, from the whole
mini-batch: the same running statistics as a BatchNorm given the mini-batch at once.
Recomputation under checkpointing does not count twice (``pipetrain.is_recomputing()``).
"""
import torch
import torch.nn.functional as F
from torch.nn.modules.batchnorm import _BatchNorm

from ._C import is_recomputing

__all__ = ['DeferredBatchNorm']


class DeferredBatchNorm(_BatchNorm):
    """A BatchNorm whose running statistics move once per mini-batch of ``chunks`` micro-batches."""

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True, chunks=1):
        super().__init__(num_features, eps, momentum, affine, track_running_stats=True)
        self.register_buffer('sum', torch.zeros_like(self.running_mean))
        self.register_buffer('sum_squares', torch.zeros_like(self.running_var))
        self.counter = 0
        self.tracked = 0
        self.chunks = chunks

    def _check_input_dim(self, input):  # pylint: disable=redefined-builtin
        if input.dim() <= 2:
            raise ValueError(f'expected at least 3D input (got {input.dim()}D input)')

    def _track(self, input):  # pylint: disable=redefined-builtin
        dims = [0, *range(2, input.dim())]
        with torch.no_grad():
            self.sum += input.sum(dims)
            self.sum_squares += (input ** 2).sum(dims)
        self.counter += input.numel() // input.size(1)
        self.tracked += 1

    def commit(self):
        """Moves the running statistics by what the tracked micro-batches saw, then forgets them.
        GPipe calls it after each training forward (so a mini-batch of fewer rows than chunks
        still counts); it also runs by itself once ``chunks`` micro-batches were tracked."""
        if self.tracked == 0:
            return
        with torch.no_grad():
            self.num_batches_tracked += 1
            factor = 1.0 / float(self.num_batches_tracked) if self.momentum is None else self.momentum
            mean = self.sum / self.counter
            variance = self.sum_squares / self.counter - mean ** 2
            if self.counter > 1:
                variance = variance * (self.counter / (self.counter - 1))  # unbiased, as BatchNorm keeps it
            self.running_mean.mul_(1 - factor).add_(mean * factor)
            self.running_var.mul_(1 - factor).add_(variance * factor)
        self.discard()

    def discard(self):
        """Forgets what was tracked (a forward that failed half-way)."""
        self.sum.zero_()
        self.sum_squares.zero_()
        self.counter = 0
        self.tracked = 0

    def forward(self, input):  # pylint: disable=redefined-builtin
        self._check_input_dim(input)
        if not self.training:
            return F.batch_norm(input, self.running_mean, self.running_var, self.weight, self.bias,
                                training=False, momentum=0.0, eps=self.eps)
        if not is_recomputing():
            self._track(input)
            if self.tracked == self.chunks:
                self.commit()
        return F.batch_norm(input, None, None, self.weight, self.bias, training=True, momentum=0.0, eps=self.eps)

    @classmethod
    def convert_deferred_batch_norm(cls, module, chunks=1):
        """The module with every BatchNorm (at any depth) replaced by a DeferredBatchNorm that
        shares its parameters and running statistics."""
        if isinstance(module, DeferredBatchNorm) and module.chunks == chunks:
            return module
        converted = module
        if isinstance(module, _BatchNorm) and module.track_running_stats:
            converted = DeferredBatchNorm(module.num_features, module.eps, module.momentum, module.affine, chunks)
            if module.affine:
                converted.register_parameter('weight', module.weight)
                converted.register_parameter('bias', module.bias)
            converted.register_buffer('running_mean', module.running_mean)
            converted.register_buffer('running_var', module.running_var)
            converted.register_buffer('num_batches_tracked', module.num_batches_tracked)
            converted.train(module.training)
        for name, child in module.named_children():
            converted.add_module(name, cls.convert_deferred_batch_norm(child, chunks))
        return converted
