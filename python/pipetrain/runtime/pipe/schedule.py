"""deepspeed.runtime.pipe.schedule: DeepSpeed's schedule classes and pipe instructions, as
descriptions.

Each schedule yields, step by step, the instructions one stage runs (DeepSpeed's TrainSchedule is
its 1F1B, InferenceSchedule forward only, DataParallelSchedule no pipeline). pipetrain's engine
does not run these objects: it runs its native schedules, chosen by the config's
``pipeline.schedule`` (``1f1b`` is the one TrainSchedule describes). The classes are here so that
scripts importing them keep working and can print or inspect a schedule; the engine takes no
schedule object (a custom PipeSchedule subclass cannot drive it: write a pipetrain schedule
generator, or pick one of its schedules in the config).
"""
from abc import ABC, abstractmethod

__all__ = ['PipeSchedule', 'TrainSchedule', 'InferenceSchedule', 'DataParallelSchedule', 'PipeInstruction',
           'OptimizerStep', 'ReduceGrads', 'ReduceTiedGrads', 'BufferOpInstruction', 'LoadMicroBatch',
           'ForwardPass', 'BackwardPass', 'SendActivation', 'RecvActivation', 'SendGrad', 'RecvGrad']


class PipeSchedule(ABC):
    """The instructions of one stage (``stage_id`` of ``stages``) for one batch of
    ``micro_batches``: iterate it, or call ``steps()``, for one list of instructions per step.
    Any two successive steps may be separated by a barrier without deadlock."""

    def __init__(self, micro_batches, stages, stage_id):
        super().__init__()
        self.micro_batches = micro_batches
        self.stages = stages
        self.stage_id = stage_id
        self.prev_stage = stage_id - 1
        self.next_stage = stage_id + 1

    @abstractmethod
    def steps(self):
        """Yields the list of PipeInstructions of each step."""

    def num_pipe_buffers(self):
        """How many micro-batch buffers the stage needs at once."""
        return self.micro_batches

    def _valid_micro_batch(self, micro_batch_id):
        return 0 <= micro_batch_id < self.micro_batches

    def _valid_stage(self, stage_id):
        return 0 <= stage_id < self.stages

    def _buffer_idx(self, micro_batch_id):
        # Buffers are reused round robin.
        if not self._valid_micro_batch(micro_batch_id):
            raise ValueError(f'micro-batch {micro_batch_id} is outside 0..{self.micro_batches - 1}')
        return micro_batch_id % self.num_pipe_buffers()

    @property
    def stage(self):
        return self.stage_id

    @property
    def num_stages(self):
        return self.stages

    @property
    def num_micro_batches(self):
        return self.micro_batches

    @property
    def is_first_stage(self):
        return self.stage_id == 0

    @property
    def is_last_stage(self):
        return self.stage_id == self.stages - 1

    def __iter__(self):
        self.it = None
        return self

    def __next__(self):
        if self.it is None:
            self.it = self.steps()
        return next(self.it)


class InferenceSchedule(PipeSchedule):
    """Forward passes only: micro-batch m runs on stage s at step m + s; two buffers alternate
    between receiving and sending, and even and odd stages order send and receive oppositely so
    that neighbours never wait on each other."""

    def steps(self):
        even_stage = self.stage_id % 2 == 0
        for step in range(self.micro_batches + self.stages - 1):
            mb = step - self.stage_id
            recv_buf, send_buf = (step % 2, (step + 1) % 2) if even_stage else ((step + 1) % 2, step % 2)
            cmds = []
            if (self.is_first_stage or self.is_last_stage) and self._valid_micro_batch(mb):
                cmds.append(LoadMicroBatch(recv_buf))
            send, recv = [], []
            if self._valid_stage(self.next_stage) and self._valid_micro_batch(mb - 1):
                send.append(SendActivation(send_buf))
            if self._valid_stage(self.prev_stage) and self._valid_micro_batch(mb):
                recv.append(RecvActivation(recv_buf))
            cmds += send + recv if even_stage else recv + send
            if self._valid_micro_batch(mb):
                cmds.append(ForwardPass(recv_buf))
            yield cmds

    def num_pipe_buffers(self):
        return 2


class TrainSchedule(PipeSchedule):
    """1F1B: after a warm-up of forward passes, each stage alternates one forward and one
    backward pass. Steps alternate between forward and backward slots, offset by the stage's
    parity; a stage sends what the previous step produced while it receives for this one."""

    def steps(self):
        total = 2 * (self.micro_batches + self.stages - 1)
        prev_mb = -1
        for step in range(total):
            mb, forward = self._step_to_micro_batch(step)
            cmds = []
            if forward:
                if self._valid_micro_batch(mb) and self._valid_stage(self.prev_stage):
                    cmds.append(RecvActivation(self._buffer_idx(mb)))
                if self._valid_micro_batch(prev_mb) and self._valid_stage(self.prev_stage):
                    cmds.append(SendGrad(self._buffer_idx(prev_mb)))
            else:
                if self._valid_micro_batch(prev_mb) and self._valid_stage(self.next_stage):
                    cmds.append(SendActivation(self._buffer_idx(prev_mb)))
                if self._valid_micro_batch(mb) and self._valid_stage(self.next_stage):
                    cmds.append(RecvGrad(self._buffer_idx(mb)))
            if forward and (self.is_first_stage or self.is_last_stage) and self._valid_micro_batch(mb):
                cmds.append(LoadMicroBatch(self._buffer_idx(mb)))
            if self._valid_micro_batch(mb):
                cmds.append((ForwardPass if forward else BackwardPass)(self._buffer_idx(mb)))
            if step == total - 1:
                cmds += [ReduceTiedGrads(), ReduceGrads(), OptimizerStep()]
            prev_mb = mb
            yield cmds

    def num_pipe_buffers(self):
        # In flight at once: at most the stages from here to the last, and at least two.
        return max(2, min(self.stages - self.stage_id + 1, self.micro_batches))

    def _step_to_micro_batch(self, step_id):
        """(micro-batch, is_forward) of a step: forward slots are the steps whose parity is the
        stage's; stage s forwards micro-batch m at step 2m + s and runs its backward at step
        2(m + stages) - s - 1 (the last stage right after its forward)."""
        if (step_id + self.stage_id) % 2 == 0:
            return (step_id - self.stage_id) // 2, True
        return (step_id + self.stage_id + 1) // 2 - self.stages, False


class DataParallelSchedule(PipeSchedule):
    """No pipeline: each step loads, forwards and backwards one micro-batch; the last step reduces
    the gradients and steps the optimizer."""

    def steps(self):
        for step in range(self.micro_batches):
            cmds = [LoadMicroBatch(buffer_id=0), ForwardPass(buffer_id=0), BackwardPass(buffer_id=0)]
            if step == self.micro_batches - 1:
                cmds += [ReduceGrads(), OptimizerStep()]
            yield cmds

    def num_pipe_buffers(self):
        return 1


class PipeInstruction:
    """One instruction of a schedule; its keyword arguments are attributes (``buffer_id``)."""

    def __init__(self, **kwargs):
        self.name = type(self).__name__
        self.kwargs = kwargs
        for key, value in kwargs.items():
            setattr(self, key, value)

    def __repr__(self):
        args = ', '.join(f'{k}={v!r}' for k, v in self.kwargs.items())
        return f'{self.name}({args})'

    def __eq__(self, other):
        return type(self) is type(other) and self.kwargs == other.kwargs

    def __hash__(self):
        return hash((self.name, tuple(sorted(self.kwargs.items()))))


class OptimizerStep(PipeInstruction):
    """Step the optimizer and zero the gradients (after the reductions)."""


class ReduceGrads(PipeInstruction):
    """All-reduce the gradients across the stage's data-parallel replicas."""


class ReduceTiedGrads(PipeInstruction):
    """All-reduce the gradients of tied modules across the stages that hold them."""


class BufferOpInstruction(PipeInstruction):
    """An instruction on one micro-batch buffer, ``buffer_id``."""

    def __init__(self, buffer_id, **kwargs):
        super().__init__(buffer_id=buffer_id, **kwargs)


class LoadMicroBatch(BufferOpInstruction):
    """Pull the next micro-batch from the data iterator into the buffer (first and last stage)."""


class ForwardPass(BufferOpInstruction):
    """Run the stage's layers on the buffer's input."""


class BackwardPass(BufferOpInstruction):
    """Back-propagate the buffer's output gradient, accumulating parameter gradients."""


class SendActivation(BufferOpInstruction):
    """Send the buffer's output to the next stage (pairs with its RecvActivation)."""


class RecvActivation(BufferOpInstruction):
    """Receive the buffer's input from the previous stage (pairs with its SendActivation)."""


class SendGrad(BufferOpInstruction):
    """Send the gradient of the buffer's input to the previous stage (pairs with its RecvGrad)."""


class RecvGrad(BufferOpInstruction):
    """Receive the gradient of the buffer's output from the next stage (pairs with its SendGrad)."""
