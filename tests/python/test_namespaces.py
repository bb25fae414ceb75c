"""The names DeepSpeed scripts import resolve under `import pipetrain as deepspeed` and behave
as DeepSpeed documents them: add_config_arguments, utils (logger, log_dist, RepeatingLoader),
runtime.utils.set_random_seed, runtime.pipe.{module,topology,engine,schedule}, accelerator,
checkpointing, and the lazy top-level names."""
import argparse
import copy
import gc
import logging
import os
import random
import subprocess
import sys
import textwrap
import warnings

import numpy
import pytest
import torch
from torch import nn
import torch.nn.functional as F

import pipetrain as deepspeed
from pipetrain import checkpointing as ckpt
from pipetrain.accelerator import CPU_Accelerator, CUDA_Accelerator, get_accelerator
from pipetrain.errors import ConfigError, UsageError
from pipetrain.runtime.pipe import schedule as sched

LAUNCH_VARIABLES = ('RANK', 'WORLD_SIZE', 'LOCAL_RANK', 'LOCAL_WORLD_SIZE', 'MASTER_ADDR', 'MASTER_PORT',
                    'OMPI_COMM_WORLD_RANK', 'OMPI_COMM_WORLD_SIZE', 'OMPI_COMM_WORLD_LOCAL_RANK',
                    'OMPI_COMM_WORLD_LOCAL_SIZE', 'PMI_RANK', 'PMI_SIZE', 'SLURM_PROCID', 'SLURM_NTASKS', 'LOCAL_SIZE',
                    'DS_ACCELERATOR')


def run_fresh(code):
    """Runs ``code`` in a new interpreter (nothing of pipetrain imported yet); returns stdout."""
    env = {k: v for k, v in os.environ.items() if k not in LAUNCH_VARIABLES}
    result = subprocess.run([sys.executable, '-c', textwrap.dedent(code)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stdout[-4000:]
    return result.stdout


@pytest.fixture
def alone(monkeypatch):
    """A process that no launcher started."""
    for name in LAUNCH_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


# -- the top-level names, in fresh interpreters --------------------------------------------------
def test_initialize_resolves_before_and_after_pipe_is_imported():
    # Before the fix, the first form ended in a RecursionError inside pipetrain.__getattr__.
    out = run_fresh("""
        import sys
        import pipetrain as deepspeed
        assert 'pipetrain.pipe' not in sys.modules, 'import pipetrain pulled in the DeepSpeed front end'
        initialize = deepspeed.initialize
        import pipetrain.pipe
        assert initialize is pipetrain.pipe.initialize
        assert deepspeed.pipe is pipetrain.pipe and deepspeed.PipelineModule is pipetrain.pipe.PipelineModule
        print('ok first')
    """)
    assert 'ok first' in out
    out = run_fresh("""
        import pipetrain.pipe
        import pipetrain as deepspeed
        assert deepspeed.initialize is pipetrain.pipe.initialize
        print('ok second')
    """)
    assert 'ok second' in out


def test_deepspeed_import_forms_resolve_to_pipetrains_objects():
    out = run_fresh("""
        import pipetrain as deepspeed
        import pipetrain.pipe as pipe
        deepspeed.runtime.utils.set_random_seed(3)
        from pipetrain.runtime.pipe.topology import (PipeDataParallelTopology, PipeModelDataParallelTopology,
                                                     ProcessTopology)
        from pipetrain.runtime.pipe.module import LayerSpec, PipelineModule, TiedLayerSpec
        from pipetrain.runtime.pipe.engine import PipelineEngine
        from pipetrain.runtime.pipe import schedule
        from pipetrain.runtime.activation_checkpointing.checkpointing import checkpoint
        from pipetrain.utils import RepeatingLoader, log_dist, logger
        from pipetrain.accelerator import get_accelerator
        assert (PipelineModule, LayerSpec, TiedLayerSpec) == (pipe.PipelineModule, pipe.LayerSpec, pipe.TiedLayerSpec)
        assert PipelineEngine is pipe.PipelineEngine is deepspeed.PipelineEngine
        assert deepspeed.PipelineModule is PipelineModule is deepspeed.runtime.pipe.PipelineModule
        assert ProcessTopology is pipe.ProcessTopology and PipeDataParallelTopology is pipe.PipeDataParallelTopology
        assert issubclass(PipeModelDataParallelTopology, ProcessTopology)
        from pipetrain.runtime.pipe.topology import PipelineParallelGrid
        import pipetrain.comm
        assert PipelineParallelGrid is pipetrain.comm.PipelineParallelGrid
        assert schedule.TrainSchedule.__name__ == 'TrainSchedule' and deepspeed.runtime.pipe.schedule is schedule
        assert deepspeed.checkpointing is deepspeed.runtime.activation_checkpointing.checkpointing
        assert checkpoint is deepspeed.checkpointing.checkpoint
        assert RepeatingLoader is pipe.RepeatingLoader is deepspeed.utils.RepeatingLoader
        assert log_dist is deepspeed.log_dist and logger is deepspeed.logger
        assert get_accelerator is deepspeed.get_accelerator is deepspeed.accelerator.get_accelerator
        assert callable(deepspeed.add_config_arguments)
        assert deepspeed.init_distributed is pipetrain.comm.init_distributed
        assert deepspeed.comm is pipetrain.comm
        from pipetrain import comm as dist
        assert dist is pipetrain.comm
        assert not hasattr(deepspeed, 'no_such_name')
        major, minor, patch = deepspeed.__version__.split('.')[:3]   # how scripts parse DeepSpeed's
        assert major.isdigit() and minor.isdigit() and patch[:1].isdigit(), deepspeed.__version__
        assert {'initialize', 'runtime', 'checkpointing', 'get_accelerator'} <= set(dir(deepspeed))
        print('ok forms')
    """)
    assert 'ok forms' in out


def test_pipeline_module_and_engine_pass_isinstance_under_deepspeed_names(alone):
    from pipetrain.runtime.pipe.engine import PipelineEngine
    from pipetrain.runtime.pipe.module import PipelineModule
    model = deepspeed.pipe.PipelineModule(layers=[nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2)], num_stages=1,
                                          loss_fn=nn.MSELoss())
    assert isinstance(model, deepspeed.PipelineModule) and isinstance(model, PipelineModule)
    engine, _, _, _ = deepspeed.initialize(model=model, config={
        'train_batch_size': 2, 'train_micro_batch_size_per_gpu': 1,
        'optimizer': {'type': 'SGD', 'params': {'lr': 0.1}}})
    try:
        assert isinstance(engine, deepspeed.PipelineEngine) and isinstance(engine, PipelineEngine)
    finally:
        del engine
        gc.collect()


# -- add_config_arguments -------------------------------------------------------------------------
def test_add_config_arguments_adds_deepspeeds_four_flags_in_their_group():
    parser = argparse.ArgumentParser()
    assert deepspeed.add_config_arguments(parser) is parser
    defaults = parser.parse_args([])
    assert (defaults.deepspeed, defaults.deepspeed_config, defaults.deepscale, defaults.deepscale_config) == \
        (False, None, False, None)
    args = parser.parse_args(['--deepspeed', '--deepspeed_config', 'ds.json', '--deepscale',
                              '--deepscale_config', 'old.json'])
    assert (args.deepspeed, args.deepspeed_config, args.deepscale, args.deepscale_config) == \
        (True, 'ds.json', True, 'old.json')
    group = next(g for g in parser._action_groups if g.title == 'DeepSpeed')  # pylint: disable=protected-access
    assert group.description == 'DeepSpeed configurations'
    assert sorted(a.dest for a in group._group_actions) == \
        ['deepscale', 'deepscale_config', 'deepspeed', 'deepspeed_config']  # pylint: disable=protected-access
    with pytest.raises(SystemExit):  # --deepspeed takes no value
        parser.parse_args(['--deepspeed', 'yes'])


# -- utils: logger and log_dist ----------------------------------------------------------------------
class _Records(logging.Handler):
    def __init__(self):
        super().__init__()
        self.messages = []

    def emit(self, record):
        self.messages.append((record.levelno, record.getMessage()))


@pytest.fixture
def undistributed(alone):
    """No launcher and no torch.distributed group (another test's engine may have made one)."""
    alone.setattr(torch.distributed, 'is_initialized', lambda: False)
    return alone


@pytest.fixture
def records():
    handler = _Records()
    deepspeed.logger.addHandler(handler)
    yield handler.messages
    deepspeed.logger.removeHandler(handler)


def test_logger_is_deepspeeds():
    logger = deepspeed.utils.logger
    assert isinstance(logger, logging.Logger) and logger.name == 'DeepSpeed'
    assert logger.level == logging.INFO and logger.propagate is False
    assert any(isinstance(h, logging.StreamHandler) for h in logger.handlers)


def test_log_dist_logs_everywhere_in_a_process_running_alone(undistributed, records):
    deepspeed.log_dist('hello', ranks=[0])
    deepspeed.log_dist('none given')
    assert records == [(logging.INFO, '[Rank -1] hello'), (logging.INFO, '[Rank -1] none given')]


@pytest.mark.parametrize('launcher', ['torchrun', 'mpirun'])
def test_log_dist_filters_by_the_launchers_rank(undistributed, records, launcher):
    alone = undistributed
    if launcher == 'torchrun':
        env = {'RANK': '1', 'WORLD_SIZE': '2', 'LOCAL_RANK': '1', 'LOCAL_WORLD_SIZE': '2',
               'MASTER_ADDR': '127.0.0.1', 'MASTER_PORT': '29511'}
    else:
        env = {'OMPI_COMM_WORLD_RANK': '1', 'OMPI_COMM_WORLD_SIZE': '2', 'OMPI_COMM_WORLD_LOCAL_RANK': '1',
               'OMPI_COMM_WORLD_LOCAL_SIZE': '2', 'MASTER_ADDR': '127.0.0.1', 'MASTER_PORT': '29511'}
    for k, v in env.items():
        alone.setenv(k, v)
    deepspeed.log_dist('to rank 0', ranks=[0])
    deepspeed.log_dist('to nobody')
    deepspeed.log_dist('to rank 1', ranks=[0, 1])
    deepspeed.log_dist('to all', ranks=[-1], level=logging.WARNING)
    deepspeed.log_dist('below the level', ranks=[1], level=logging.DEBUG)
    assert records == [(logging.INFO, '[Rank 1] to rank 1'), (logging.WARNING, '[Rank 1] to all')]


def test_log_dist_filters_by_torch_distributeds_rank_once_initialised(undistributed, records):
    undistributed.setattr(torch.distributed, 'is_initialized', lambda: True)
    undistributed.setattr(torch.distributed, 'get_rank', lambda group=None: 2)
    deepspeed.log_dist('to 0', ranks=[0])
    deepspeed.log_dist('to 2', ranks=[2])
    assert records == [(logging.INFO, '[Rank 2] to 2')]


def test_log_dist_names_the_rank_when_the_environment_is_incomplete(undistributed, records):
    alone = undistributed
    alone.setenv('RANK', '3')  # no WORLD_SIZE or MASTER_ADDR: the engine would refuse it, the log need not
    deepspeed.log_dist('three', ranks=[3])
    deepspeed.log_dist('zero', ranks=[0])
    assert records == [(logging.INFO, '[Rank 3] three')]


def test_repeating_loader_starts_the_loader_again():
    loader = deepspeed.utils.RepeatingLoader([1, 2, 3])
    assert [next(loader) for _ in range(7)] == [1, 2, 3, 1, 2, 3, 1]


# -- runtime.utils.set_random_seed ----------------------------------------------------------------
def test_set_random_seed_seeds_python_numpy_and_torch():
    def draw():
        return random.random(), numpy.random.rand(), torch.rand(3).tolist()

    deepspeed.runtime.utils.set_random_seed(1138)
    first = draw()
    random.seed(5)
    numpy.random.seed(5)
    torch.manual_seed(5)
    deepspeed.runtime.utils.set_random_seed(1138)
    assert draw() == first
    deepspeed.runtime.utils.set_random_seed(1139)
    other = draw()
    assert all(a != b for a, b in zip(other, first))


# -- runtime.pipe.schedule ------------------------------------------------------------------------------
def _stage_streams(schedule_class, micro_batches, stages):
    return [list(schedule_class(micro_batches=micro_batches, stages=stages, stage_id=s)) for s in range(stages)]


def test_train_schedule_instruction_stream_for_two_stages():
    # DeepSpeed's TrainSchedule for 2 stages and 2 micro-batches, worked out by hand from its rules.
    s0, s1 = _stage_streams(sched.TrainSchedule, 2, 2)
    L, F, B = sched.LoadMicroBatch, sched.ForwardPass, sched.BackwardPass
    SA, RA, SG, RG = sched.SendActivation, sched.RecvActivation, sched.SendGrad, sched.RecvGrad
    end = [sched.ReduceTiedGrads(), sched.ReduceGrads(), sched.OptimizerStep()]
    assert s0 == [[L(0), F(0)], [SA(0)], [L(1), F(1)], [SA(1), RG(0), B(0)], [], [RG(1), B(1), *end]]
    assert s1 == [[], [RA(0), L(0), F(0)], [B(0)], [RA(1), SG(0), L(1), F(1)], [B(1)], [SG(1), *end]]
    assert repr(s0[0]) == '[LoadMicroBatch(buffer_id=0), ForwardPass(buffer_id=0)]'
    assert s0[0][0].buffer_id == 0 and s0[0][0].name == 'LoadMicroBatch'


@pytest.mark.parametrize('stages,micro_batches', [(1, 1), (1, 3), (2, 5), (3, 2), (4, 4), (4, 9), (5, 3)])
def test_train_schedule_is_a_consistent_1f1b(stages, micro_batches):
    streams = _stage_streams(sched.TrainSchedule, micro_batches, stages)
    total = 2 * (micro_batches + stages - 1)
    assert all(len(st) == total for st in streams)
    holder = [dict() for _ in range(stages)]      # buffer -> micro-batch it holds
    fwd = [0] * stages
    bwd = [0] * stages
    for step in range(total):
        sent_act, recv_act, sent_grad, recv_grad = {}, {}, {}, {}
        for s in range(stages):
            loads = 0
            for cmd in streams[s][step]:
                if isinstance(cmd, sched.ForwardPass):
                    live = holder[s].get(cmd.buffer_id)
                    assert live is None or live < bwd[s], f'stage {s} overwrote live micro-batch {live}'
                    holder[s][cmd.buffer_id] = fwd[s]
                    fwd[s] += 1
                    # 1F1B: no stage holds more than the stages from it to the last.
                    assert fwd[s] - bwd[s] <= stages - s
                elif isinstance(cmd, sched.BackwardPass):
                    assert holder[s][cmd.buffer_id] == bwd[s] < fwd[s]
                    bwd[s] += 1
                elif isinstance(cmd, sched.SendActivation):
                    sent_act[s] = holder[s][cmd.buffer_id]
                elif isinstance(cmd, sched.RecvActivation):
                    recv_act[s] = fwd[s]
                elif isinstance(cmd, sched.SendGrad):
                    sent_grad[s] = holder[s][cmd.buffer_id]
                elif isinstance(cmd, sched.RecvGrad):
                    recv_grad[s] = bwd[s]
                elif isinstance(cmd, sched.LoadMicroBatch):
                    assert s in (0, stages - 1)
                    loads += 1
            if s in (0, stages - 1):
                assert loads == any(isinstance(c, sched.ForwardPass) for c in streams[s][step])
        # Every send meets its receive on the neighbour in the same step, for the same micro-batch.
        assert {s + 1: mb for s, mb in sent_act.items()} == recv_act
        assert {s - 1: mb for s, mb in sent_grad.items()} == recv_grad
    assert fwd == bwd == [micro_batches] * stages
    for st in streams:
        assert st[-1][-3:] == [sched.ReduceTiedGrads(), sched.ReduceGrads(), sched.OptimizerStep()]
        assert sum(isinstance(c, sched.OptimizerStep) for step in st for c in step) == 1


@pytest.mark.parametrize('stages,micro_batches', [(1, 2), (2, 3), (3, 4), (4, 2)])
def test_inference_schedule_forwards_every_micro_batch_once_in_order(stages, micro_batches):
    streams = _stage_streams(sched.InferenceSchedule, micro_batches, stages)
    done = [0] * stages
    for step in range(micro_batches + stages - 1):
        sent, received = {}, {}
        for s in range(stages):
            for cmd in streams[s][step]:
                assert not isinstance(cmd, (sched.BackwardPass, sched.OptimizerStep))
                assert cmd.buffer_id in (0, 1)
                if isinstance(cmd, sched.ForwardPass):
                    assert step == done[s] + s   # micro-batch m on stage s at step m + s
                    done[s] += 1
                elif isinstance(cmd, sched.SendActivation):
                    sent[s] = done[s] - 1
                elif isinstance(cmd, sched.RecvActivation):
                    received[s] = done[s]
        assert {s + 1: mb for s, mb in sent.items()} == received
    assert done == [micro_batches] * stages


def test_data_parallel_schedule_steps_once_at_the_end():
    steps = list(sched.DataParallelSchedule(micro_batches=3, stages=1, stage_id=0))
    assert steps[0] == [sched.LoadMicroBatch(0), sched.ForwardPass(0), sched.BackwardPass(0)]
    assert steps[-1][-2:] == [sched.ReduceGrads(), sched.OptimizerStep()] and len(steps) == 3
    assert sched.DataParallelSchedule(3, 1, 0).num_pipe_buffers() == 1


def test_schedule_properties_and_buffers():
    s = sched.TrainSchedule(micro_batches=8, stages=4, stage_id=1)
    assert (s.stage, s.num_stages, s.num_micro_batches, s.is_first_stage, s.is_last_stage) == (1, 4, 8, False, False)
    assert [sched.TrainSchedule(8, 4, i).num_pipe_buffers() for i in range(4)] == [5, 4, 3, 2]
    assert sched.TrainSchedule(2, 4, 0).num_pipe_buffers() == 2
    assert sched.InferenceSchedule(8, 4, 1).num_pipe_buffers() == 2
    with pytest.raises(ValueError, match='micro-batch 8'):
        s._buffer_idx(8)  # pylint: disable=protected-access


# -- accelerator -----------------------------------------------------------------------------------
def test_get_accelerator_is_the_hosts_cpu_here_with_deepspeeds_fields(alone):
    acc = get_accelerator()
    assert acc is get_accelerator()
    if torch.cuda.is_available():
        assert isinstance(acc, CUDA_Accelerator)
        return
    assert isinstance(acc, CPU_Accelerator)
    assert (acc.device_name(), acc.device_name(3), acc.current_device_name()) == ('cpu', 'cpu', 'cpu')
    assert acc.current_device() == 0
    alone.setenv('LOCAL_RANK', '1')
    assert acc.current_device() == 1
    alone.setenv('LOCAL_SIZE', '3')
    assert acc.device_count() == 3
    alone.delenv('LOCAL_SIZE')
    assert acc.device_count() >= 1
    assert acc.is_available() and acc.is_synchronized_device()
    assert acc.communication_backend_name() == 'gloo'
    assert acc.is_bf16_supported() and not acc.is_fp16_supported()
    assert acc.supported_dtypes() == [torch.float, torch.bfloat16]
    assert acc.device() is None and acc.set_device(0) is None and acc.synchronize() is None
    assert acc.Stream is None and acc.Event is None and acc.current_stream() is None
    with acc.stream(None):
        pass
    acc.manual_seed(11)
    a = torch.rand(4)
    acc.manual_seed_all(11)
    assert torch.equal(a, torch.rand(4))
    state = acc.get_rng_state()
    b = torch.rand(2)
    acc.set_rng_state(state)
    assert torch.equal(b, torch.rand(2))
    acc.empty_cache()
    held = torch.ones(16, 1 << 20)  # 64 MiB, touched: resident
    assert acc.memory_allocated() >= held.numel() * 4
    assert acc.max_memory_allocated() >= acc.memory_allocated() > 0
    assert acc.memory_stats()['allocated_bytes.all.peak'] >= acc.memory_stats()['allocated_bytes.all.current']
    assert acc.total_memory() > acc.available_memory() > 0
    assert acc.on_accelerator(held) and acc.pin_memory(held) is held
    assert acc.FloatTensor is torch.FloatTensor and acc.LongTensor is torch.LongTensor
    assert acc.lazy_call(lambda: 7) == 7
    with pytest.raises(UsageError, match="'FusedAdamBuilder'"):
        acc.get_op_builder('FusedAdamBuilder')


def test_accelerator_choice_follows_ds_accelerator(alone):
    from pipetrain.accelerator import _choose  # pylint: disable=import-outside-toplevel
    alone.setenv('DS_ACCELERATOR', 'cpu')
    assert isinstance(_choose(), CPU_Accelerator)
    alone.setenv('DS_ACCELERATOR', 'xpu')
    with pytest.raises(ConfigError, match="DS_ACCELERATOR='xpu'"):
        _choose()
    if not torch.cuda.is_available():
        alone.setenv('DS_ACCELERATOR', 'cuda')
        with pytest.raises(ConfigError, match='no CUDA device'):
            _choose()


def test_cuda_accelerator_names_devices_as_deepspeeds():
    acc = CUDA_Accelerator()
    assert (acc.device_name(), acc.device_name(1), acc.communication_backend_name()) == ('cuda', 'cuda:1', 'nccl')
    assert not acc.is_synchronized_device()


# -- checkpointing ----------------------------------------------------------------------------------------
class _Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(8, 16)
        self.drop = nn.Dropout(0.5)
        self.b = nn.Linear(16, 8)

    def forward(self, x):
        return self.b(self.drop(torch.tanh(self.a(x))))


def _grads(use_checkpoint, x_requires_grad):
    torch.manual_seed(0)
    block = _Block()
    x = torch.randn(6, 8, requires_grad=x_requires_grad)
    torch.manual_seed(42)  # the dropout masks
    y = deepspeed.checkpointing.checkpoint(block, x) if use_checkpoint else block(x)
    loss = (y ** 2).sum()
    loss.backward()
    grads = [p.grad.clone() for p in block.parameters()]
    return loss.detach(), grads, (x.grad.clone() if x_requires_grad else None)


@pytest.mark.parametrize('x_requires_grad', [True, False])
def test_checkpoint_gives_the_gradients_of_no_checkpoint_with_dropout(x_requires_grad):
    loss, grads, x_grad = _grads(False, x_requires_grad)
    ck_loss, ck_grads, ck_x_grad = _grads(True, x_requires_grad)
    assert torch.equal(loss, ck_loss)
    for g, h in zip(grads, ck_grads):
        torch.testing.assert_close(h, g, rtol=0, atol=0)
    if x_requires_grad:
        torch.testing.assert_close(ck_x_grad, x_grad, rtol=0, atol=0)


def test_checkpoint_recomputes_in_backward():
    calls = []

    def block(x):
        calls.append(1)
        return torch.sin(x) * 2

    x = torch.randn(4, requires_grad=True)
    y = deepspeed.checkpointing.checkpoint(block, x)
    assert len(calls) == 1
    y.sum().backward()
    assert len(calls) == 2
    torch.testing.assert_close(x.grad, 2 * torch.cos(x.detach()))


@pytest.fixture
def fresh_checkpointing(monkeypatch):
    monkeypatch.setattr(ckpt, '_configured', False)
    monkeypatch.setattr(ckpt, 'settings', dict(ckpt.settings))
    return ckpt


def test_configure_accepts_deepspeeds_arguments_and_names_what_it_ignores(fresh_checkpointing):
    assert not ckpt.is_configured()
    with warnings.catch_warnings():
        warnings.simplefilter('error')
        ckpt.configure(None, partition_activations=False, checkpoint_in_cpu=False)  # nothing on: no warning
    assert ckpt.is_configured()
    with pytest.warns(UserWarning) as caught:
        ckpt.configure(None, partition_activations=True, checkpoint_in_cpu=True, synchronize=True)
    assert len(caught) == 1
    text = str(caught[0].message)
    assert 'partition_activations=True' in text and 'checkpoint_in_cpu=True' in text and 'synchronize=True' in text
    assert 'profile' not in text
    with pytest.raises(ConfigError, match='num_checkpoints'):
        ckpt.configure(None, contiguous_checkpointing=True)


def test_configure_reads_the_config_block_and_arguments_override_it(fresh_checkpointing, tmp_path):
    config = {'train_batch_size': 4, 'activation_checkpointing': {
        'partition_activations': True, 'contiguous_memory_optimization': True, 'number_checkpoints': 4,
        'cpu_checkpointing': False, 'synchronize_checkpoint_boundary': False, 'profile': True}}
    path = tmp_path / 'ds.json'
    path.write_text(__import__('json').dumps(config))
    with pytest.warns(UserWarning) as caught:
        ckpt.configure(None, deepspeed_config=str(path), profile=False)
    text = str(caught[0].message)
    assert 'partition_activations=True' in text and 'contiguous_checkpointing=True' in text
    assert 'num_checkpoints=4' in text and 'profile' not in text
    assert ckpt.settings['profile'] is False and ckpt.settings['num_checkpoints'] == 4
    with pytest.raises(ConfigError, match="'cpu_offload'"):
        ckpt.configure(None, deepspeed_config={'activation_checkpointing': {'cpu_offload': True}})


def test_model_parallel_cuda_manual_seed_seeds_the_accelerator():
    ckpt.model_parallel_cuda_manual_seed(123)
    a = torch.rand(3) if not torch.cuda.is_available() else torch.rand(3, device='cuda')
    get_accelerator().manual_seed(123)
    b = torch.rand(3) if not torch.cuda.is_available() else torch.rand(3, device='cuda')
    assert torch.equal(a, b)
    ckpt.reset()


class _CheckpointedBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.b = nn.Linear(8, 8)

    def forward(self, x):
        return deepspeed.checkpointing.checkpoint(lambda t: self.b(torch.tanh(self.a(t))), x)


def test_checkpoint_inside_a_pipeline_layer_gives_the_plain_step(alone):
    # The recomputation runs in the engine's backward, on its worker, outside the forward's call.
    layers = [nn.Linear(4, 8), _CheckpointedBlock(), nn.Linear(8, 2)]
    plain = nn.Sequential(*(copy.deepcopy(layer) for layer in layers))
    model = deepspeed.PipelineModule(layers=layers, num_stages=1, loss_fn=nn.MSELoss())
    engine, _, _, _ = deepspeed.initialize(model=model, config={
        'train_batch_size': 4, 'train_micro_batch_size_per_gpu': 2,
        'optimizer': {'type': 'SGD', 'params': {'lr': 0.1}}})
    try:
        data = [(torch.randn(2, 4), torch.randn(2, 2)) for _ in range(2)]
        loss = engine.train_batch(iter(data))
        opt = torch.optim.SGD(plain.parameters(), lr=0.1)
        expected = sum(F.mse_loss(plain(x), y) for x, y in data) / 2
        expected.backward()
        opt.step()
        torch.testing.assert_close(loss, expected.detach())
        for p, q in zip(model.parameters(), plain.parameters()):
            torch.testing.assert_close(p, q)
    finally:
        del engine
        gc.collect()
