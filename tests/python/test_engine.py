"""pipetrain.initialize and the PipelineEngine on several processes (`pipetrain launch`),
against the oracle: the same Python model trained in one process gives the same losses and
the same weights, for each schedule, activation checkpointing, Python and native layers, a
Python loss, tied layers, data-parallel replicas with ZeRO-1, clipping and AdamW."""
import json
import pathlib
import subprocess
import time

import pytest
import torch

from conftest import launch
import engine_cases

HERE = pathlib.Path(__file__).resolve().parent
WORKER = HERE / 'engine_worker.py'

TWO_STAGE_CASES = [
    {'name': 'mlp-1f1b', 'model': 'mlp'},
    {'name': 'mlp-fill-drain', 'model': 'mlp', 'schedule': 'fill-drain'},
    {'name': 'mlp-interleaved', 'model': 'mlp', 'schedule': 'interleaved', 'chunks': 2},
    {'name': 'mlp-zb-h1', 'model': 'mlp', 'schedule': 'zb-h1'},
    {'name': 'mlp-checkpointed', 'model': 'mlp', 'interval': 1},
    {'name': 'mlp-python-layers', 'model': 'mlp', 'native': False},
    {'name': 'python-layers-and-loss', 'model': 'python', 'interval': 2},
    {'name': 'tied', 'model': 'tied', 'partition': 'uniform'},
    {'name': 'mlp-adamw-clipped', 'model': 'mlp', 'optimizer': 'AdamW', 'optimizer_params': {'weight_decay': 0.01},
     'clip': 0.05},
]
REPLICA_CASES = [
    {'name': 'replicas-zero1', 'model': 'mlp', 'stages': 1, 'zero': True, 'optimizer': 'AdamW',
     'optimizer_params': {'weight_decay': 0.01}},
    {'name': 'replicas-python', 'model': 'python', 'stages': 1},
]


def run_cases(tmp_path_factory, nproc, cases):
    out = tmp_path_factory.mktemp('engine')
    (out / 'cases.json').write_text(json.dumps(cases))
    launch(nproc, WORKER, out / 'cases.json', out)
    return out


@pytest.fixture(scope='module')
def two_stage_results(tmp_path_factory):
    return run_cases(tmp_path_factory, 2, TWO_STAGE_CASES)


@pytest.fixture(scope='module')
def replica_results(tmp_path_factory):
    return run_cases(tmp_path_factory, 2, REPLICA_CASES)


def check_against_oracle(out, case, nproc):
    stages = case.get('stages', nproc)
    replicas = nproc // stages
    ranks = [torch.load(out / f"{case['name']}-rank{r}.pt") for r in range(nproc)]
    expected_losses, expected_state = engine_cases.oracle(case, replicas, case.get('steps', 3))
    for r in ranks:
        assert r['losses'] == pytest.approx(expected_losses, rel=1e-5, abs=1e-7), case['name']
    seen = set()
    for r in ranks:
        assert r['is_first'] == (r['stage'] == 0) and r['is_last'] == (r['stage'] == stages - 1)
        assert r['global_steps'] == case.get('steps', 3)
        for index, state in r['state'].items():
            seen.add(index)
            for key, value in state.items():
                torch.testing.assert_close(value, expected_state[index][key], rtol=2e-5, atol=1e-6,
                                           msg=f"{case['name']}: layer {index} {key} on stage {r['stage']}")
    assert seen == set(expected_state), 'every layer lives on some rank'
    return ranks


@pytest.mark.parametrize('case', TWO_STAGE_CASES, ids=[c['name'] for c in TWO_STAGE_CASES])
def test_two_stages_train_as_one_process(two_stage_results, case):
    ranks = check_against_oracle(two_stage_results, case, 2)
    # Each stage holds only its own layers (both stages' layers for interleaved chunks).
    assert not set(ranks[0]['state']) & set(ranks[1]['state']) or case['model'] == 'tied'


@pytest.mark.parametrize('case', REPLICA_CASES, ids=[c['name'] for c in REPLICA_CASES])
def test_data_parallel_replicas_train_as_one_process(replica_results, case):
    ranks = check_against_oracle(replica_results, case, 2)
    for index, state in ranks[0]['state'].items():
        for key, value in state.items():
            torch.testing.assert_close(value, ranks[1]['state'][index][key], rtol=0, atol=0)


def test_a_checkpoint_resumes_under_another_layout(tmp_path):
    ckpt = tmp_path / 'ckpt'
    first = [{'name': 'first', 'model': 'mlp', 'optimizer': 'AdamW', 'steps': 2, 'save_to': str(ckpt)}]
    (tmp_path / 'first.json').write_text(json.dumps(first))
    launch(2, WORKER, tmp_path / 'first.json', tmp_path)
    assert (ckpt / 'latest').read_text().strip() == 'global_step2'
    # 2 replicas of 2 micro-batches see the same global batches as 1 replica of 4.
    second = [{'name': 'second', 'model': 'mlp', 'optimizer': 'AdamW', 'steps': 2, 'stages': 1, 'micro_batches': 2,
               'load_from': str(ckpt)}]
    (tmp_path / 'second.json').write_text(json.dumps(second))
    launch(2, WORKER, tmp_path / 'second.json', tmp_path)
    expected_losses, expected_state = engine_cases.oracle({'model': 'mlp', 'optimizer': 'AdamW'}, 1, 4)
    resumed = torch.load(tmp_path / 'second-rank0.pt')
    assert resumed['start'] == 2 and resumed['client_state'] == {'saved_by': 'first'}
    assert resumed['losses'] == pytest.approx(expected_losses[2:], rel=1e-5)
    for index, state in resumed['state'].items():
        for key, value in state.items():
            torch.testing.assert_close(value, expected_state[index][key], rtol=2e-5, atol=1e-6)


def test_a_python_exception_on_one_rank_ends_every_rank_with_its_traceback(tmp_path):
    cases = [{'name': 'failing', 'model': 'failing', 'steps': 3}]
    (tmp_path / 'cases.json').write_text(json.dumps(cases))
    result = launch(2, WORKER, tmp_path / 'cases.json', tmp_path, time_limit=90, check=False)
    assert result.returncode != 0
    log = result.stdout
    assert 'ValueError: injected failure in call 5' in log, log[-4000:]
    assert 'engine_cases.py' in log and 'in forward' in log  # the Python traceback of the layer
    assert 'pipetrain: raised in stage' in log  # where in the schedule it happened
    assert 'rank 1' in log  # the other rank names the one that failed


def test_a_stopped_rank_is_named_by_the_other_and_nothing_is_left_running(tmp_path):
    # Rank 0 stops (SIGSTOP) before its third step: only its silence tells. Rank 1 must name it
    # after the 3 s timeout, and the launcher must then end the stopped rank too.
    cases = [{'name': 'stopped', 'model': 'mlp', 'steps': 4, 'stop_at_step': 2, 'comm_timeout_s': 3}]
    cases_path = tmp_path / 'stopped-cases.json'
    cases_path.write_text(json.dumps(cases))
    start = time.monotonic()
    result = launch(2, WORKER, cases_path, tmp_path, time_limit=120, check=False)
    elapsed = time.monotonic() - start
    assert result.returncode != 0
    assert 'rank 0 stopped answering' in result.stdout, result.stdout[-4000:]
    assert elapsed < 60, f'took {elapsed:.0f} s; the timeout is 3 s'
    left = subprocess.run(['pgrep', '-f', str(cases_path)], stdout=subprocess.PIPE, text=True, check=False)
    assert left.stdout == '', f'still running: {left.stdout}'
