"""DeepSpeed's process groups next to pipetrain's engine: init_distributed and pipetrain.comm
(deepspeed.comm) before and after initialize under pipetrain launch, mpirun and torchrun's
environment contract; the grid's groups; a second engine of another layout in one job; and
Ctrl-C (SIGINT) during train_batch and GPipe.forward reaching the user as KeyboardInterrupt."""
import json
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest
import torch
import torch.distributed as tdist

from conftest import cli_path, launch

HERE = pathlib.Path(__file__).resolve().parent
WORKER = HERE / 'dist_worker.py'
HANG_GUARD_S = 60  # only a guard against a hang: the runs end in a few seconds


def results(out, mode, nproc):
    return [json.loads((out / f'{mode}-rank{r}.json').read_text()) for r in range(nproc)]


def check_collectives(ranks):
    world = len(ranks)
    for r, res in enumerate(ranks):
        assert (res['rank'], res['world']) == (r, world)
        assert res['sum'] == sum(range(1, world + 1))
        assert res['avg'] == pytest.approx(sum(range(1, world + 1)) / world)
        assert res['max'] == world
        assert res['bcast'] == 7.0
        assert res['gather'] == [10.0 * i for i in range(world)]
        assert res['pair_sum'] == 2.0
        assert res['global_of_group_rank_1'] == world - 1
    assert len({res['losses_a'][0] for res in ranks}) == 1  # every rank returns the batch's loss


def test_deepspeed_order_and_second_layout_under_launch(tmp_path):
    """init_distributed, comm calls, initialize, comm calls; then engine B (1 stage x 2 replicas)
    after engine A (2 stages) in the same processes: B's groups used to time out."""
    launch(2, WORKER, 'ds-order', tmp_path, time_limit=120)
    ranks = results(tmp_path, 'ds-order', 2)
    check_collectives(ranks)
    for r, res in enumerate(ranks):
        assert res['initialized_before'] is True
        assert res['env']['RANK'] == str(r) and res['env']['WORLD_SIZE'] == '2'
        assert res['local_rank'] == r
        assert res['layout_b'] == [1, 2]
        assert torch.isfinite(torch.tensor(res['losses_b'])).all()


def test_torch_group_made_first_is_adopted(tmp_path):
    """torch.distributed.init_process_group('gloo') by the script, then initialize: one store on
    MASTER_PORT serves both (it used to be 'address already in use' on rank 0)."""
    # USE_LIBUV=0: what a script that makes its own group needs on a torch 2.4+ without libuv.
    launch(2, WORKER, 'torch-first', tmp_path, time_limit=120, env={'USE_LIBUV': '0'})
    check_collectives(results(tmp_path, 'torch-first', 2))


def test_initialize_makes_the_torch_group(tmp_path):
    """Without init_distributed, initialize makes torch.distributed's group, usable after it."""
    launch(2, WORKER, 'implicit', tmp_path, time_limit=120)
    ranks = results(tmp_path, 'implicit', 2)
    check_collectives(ranks)
    assert all(not res['initialized_before'] and res['initialized_after'] for res in ranks)


@pytest.mark.skipif(shutil.which('mpirun') is None, reason='OpenMPI (mpirun) is not installed')
def test_deepspeed_order_under_mpirun(tmp_path):
    """mpirun sets only OMPI_COMM_WORLD_*: init_distributed exports RANK, WORLD_SIZE, LOCAL_RANK,
    MASTER_ADDR and MASTER_PORT (as DeepSpeed's MPI discovery), and the engine agrees."""
    env = {k: v for k, v in os.environ.items() if k not in ('RANK', 'WORLD_SIZE', 'MASTER_ADDR', 'MASTER_PORT',
                                                              'LOCAL_RANK', 'LOCAL_WORLD_SIZE')}
    env.setdefault('OMP_NUM_THREADS', '1')
    env['MASTER_PORT'] = str(free_port())  # the derived port might be taken by a parallel test
    cmd = ['mpirun', '--allow-run-as-root', '--oversubscribe', '-np', '2', '-x', 'MASTER_PORT', '-x', 'PYTHONPATH',
           '-x', 'OMP_NUM_THREADS', sys.executable, str(WORKER), 'ds-order', str(tmp_path)]
    run = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         timeout=HANG_GUARD_S * 2, check=False)
    assert run.returncode == 0, run.stdout[-6000:]
    ranks = results(tmp_path, 'ds-order', 2)
    check_collectives(ranks)
    for r, res in enumerate(ranks):
        assert res['env'] == {'RANK': str(r), 'WORLD_SIZE': '2', 'LOCAL_RANK': str(r), 'MASTER_ADDR': '127.0.0.1',
                              'MASTER_PORT': env['MASTER_PORT']}
        assert res['layout_b'] == [1, 2]


def free_port():
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def test_torchrun_agent_store_contract(tmp_path):
    """torchrun's contract (its Debian build crashes before starting workers on Python 3.11): the
    agent holds the TCPStore on MASTER_PORT and the workers get TORCHELASTIC_USE_AGENT_STORE=True;
    every rank must join that store, pipetrain's engine included, instead of serving one."""
    port = free_port()
    try:  # the "agent"; torch 2.4+ would ask for a libuv server, which a Debian torch lacks
        agent_store = tdist.TCPStore('127.0.0.1', port, 3, True, wait_for_workers=False, use_libuv=False)
    except TypeError:  # torch before 2.4: no such argument, always the plain server
        agent_store = tdist.TCPStore('127.0.0.1', port, 3, True, wait_for_workers=False)
    procs = []
    for rank in range(2):
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), GROUP_RANK='0', ROLE_RANK=str(rank),
                   ROLE_NAME='default', WORLD_SIZE='2', LOCAL_WORLD_SIZE='2', ROLE_WORLD_SIZE='2',
                   GROUP_WORLD_SIZE='1', MASTER_ADDR='127.0.0.1', MASTER_PORT=str(port),
                   TORCHELASTIC_USE_AGENT_STORE='True', TORCHELASTIC_RESTART_COUNT='0',
                   TORCHELASTIC_MAX_RESTARTS='0', TORCHELASTIC_RUN_ID='test-run', OMP_NUM_THREADS='1')
        procs.append(subprocess.Popen([sys.executable, str(WORKER), 'ds-order', str(tmp_path)], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outputs = []
    try:
        for p in procs:
            outputs.append(p.communicate(timeout=HANG_GUARD_S * 2)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for p, text in zip(procs, outputs):
        assert p.returncode == 0, text[-6000:]
    check_collectives(results(tmp_path, 'ds-order', 2))
    # The ranks' keys live in the agent's store: torch's under /worker/attempt_0, pipetrain's under
    # its own prefix of the attempt.
    assert agent_store.num_keys() > 2
    del agent_store


@pytest.mark.parametrize('nproc', [2, 4])
def test_grid_groups(tmp_path, nproc):
    """PipelineParallelGrid over pipe x data: each accessor and each group's members."""
    launch(nproc, WORKER, 'grid', tmp_path, time_limit=120)
    dp = nproc // 2
    for r, res in enumerate(results(tmp_path, 'grid', nproc)):
        stage, replica = divmod(r, dp)  # pipe outermost, data innermost (DeepSpeed's order)
        assert res['stage'] == stage
        assert res['pipe'] == [stage, 2]
        assert res['data'] == [replica, dp]
        assert res['model'] == [stage, 2]  # DeepSpeed's model-parallel group: the replica's pipeline
        assert res['slice'] == [0, 1]
        assert res['stage_to_global'] == [replica, dp + replica]
        assert res['first_last'] == [stage == 0, stage == 1]
        assert res['topology_is'] is True
        assert res['dp_members'] == [stage * dp + d for d in range(dp)]
        assert res['pp_members'] == [replica, dp + replica]
        assert res['mp_members'] == [replica, dp + replica]
        assert res['slice_members'] == [r]


def wait_for(paths, proc, what):
    deadline = time.monotonic() + HANG_GUARD_S
    while not all(p.exists() for p in paths):
        assert proc.poll() is None, f'{what} ended early:\n{proc.communicate()[0][-6000:]}'
        assert time.monotonic() < deadline, f'{what} never got there'
        time.sleep(0.05)


def finish(proc):
    try:
        return proc.communicate(timeout=HANG_GUARD_S)[0]
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out = proc.communicate()[0]
        pytest.fail(f'still running {HANG_GUARD_S} s after SIGINT:\n{out[-6000:]}')


def test_ctrl_c_during_train_batch_stops_every_rank(tmp_path):
    """SIGINT to `pipetrain launch` (which forwards it) while stage 0 waits in a Python layer and
    stage 1 in a native receive: both ranks raise KeyboardInterrupt and nothing is left running."""
    env = dict(os.environ, OMP_NUM_THREADS='1')
    cmd = [cli_path(), 'launch', '-n', '2', '--time-limit', '300', '--', sys.executable, str(WORKER), 'hang',
           str(tmp_path)]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    wait_for([tmp_path / 'ready', tmp_path / 'entering-0', tmp_path / 'entering-1'], proc, 'the job')
    time.sleep(0.5)  # the rank that wrote 'entering' last is inside train_batch by then
    proc.send_signal(signal.SIGINT)
    out = finish(proc)
    assert proc.returncode != 0, out[-6000:]
    for r in range(2):
        assert (tmp_path / f'interrupted-{r}').exists(), f'rank {r} did not raise KeyboardInterrupt:\n{out[-6000:]}'
    assert out.count('KeyboardInterrupt') >= 2, out[-6000:]
    for r in range(2):
        pid = int((tmp_path / f'pid-{r}').read_text())
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


GPIPE_SCRIPT = '''
import os, pathlib, sys, time
import torch
from torch import nn
from pipetrain import GPipe
out = pathlib.Path(sys.argv[1])

class WaitForFile(nn.Module):
    def forward(self, x):
        (out / 'ready').write_text('in the layer')
        while not (out / 'never').exists():
            time.sleep(0.02)
        return x

model = GPipe(nn.Sequential(nn.Linear(4, 4), WaitForFile(), nn.Linear(4, 2)), balance=[1, 2], chunks=2)
try:
    model(torch.randn(4, 4))
except KeyboardInterrupt:
    (out / 'interrupted').write_text('KeyboardInterrupt')
    raise
'''


def test_ctrl_c_during_gpipe_forward(tmp_path):
    """SIGINT while a partition's worker runs a Python layer that waits for ever: forward raises
    KeyboardInterrupt in the caller and the process ends."""
    script = tmp_path / 'gpipe_hang.py'
    script.write_text(GPIPE_SCRIPT)
    proc = subprocess.Popen([sys.executable, str(script), str(tmp_path)], env=dict(os.environ, OMP_NUM_THREADS='1'),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    wait_for([tmp_path / 'ready'], proc, 'GPipe.forward')
    proc.send_signal(signal.SIGINT)
    out = finish(proc)
    assert proc.returncode != 0, out
    assert (tmp_path / 'interrupted').exists(), out
    assert 'KeyboardInterrupt' in out, out
