"""Shared fixtures of the Python front end's tests (run by CTest with PYTHONPATH=<build>/python)."""
import os
import pathlib
import subprocess
import sys

import pytest
import torch

ROOT = pathlib.Path(__file__).resolve().parents[2]


def cli_path():
    path = os.environ.get('PIPETRAIN_CLI')
    if path:
        return path
    return str(ROOT / 'build' / 'pipetrain')


def launch(nproc, script, *args, time_limit=150, env=None, check=True):
    """Runs `pipetrain launch -n nproc -- python3 script args...`; returns the CompletedProcess.
    Every rank is bounded by --time-limit, the whole launch by a timeout a little longer."""
    cmd = [cli_path(), 'launch', '-n', str(nproc), '--time-limit', str(time_limit), '--',
           sys.executable, str(script), *map(str, args)]
    full_env = dict(os.environ)
    full_env.setdefault('OMP_NUM_THREADS', '1')
    if env:
        full_env.update(env)
    result = subprocess.run(cmd, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            timeout=time_limit + 60, check=False)
    if check and result.returncode != 0:
        raise AssertionError(f'{" ".join(cmd)} exited {result.returncode}:\n{result.stdout[-6000:]}')
    return result


@pytest.fixture(autouse=True)
def _seeded():
    torch.manual_seed(0)
    yield
