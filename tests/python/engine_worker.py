"""One rank of the multi-process engine tests: trains each case of a JSON list with
pipetrain.initialize and writes what it saw (losses, its layers' weights) for the test to
compare with the one-process oracle."""
import json
import os
import pathlib
import signal
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import pipetrain  # noqa: E402
from pipetrain.pipe import PipelineModule  # noqa: E402

import engine_cases  # noqa: E402


def run(case, out_dir):
    rank = int(os.environ.get('RANK', '0'))
    world = int(os.environ.get('WORLD_SIZE', '1'))
    stages = case.get('stages', world)
    replicas = world // stages
    if 'native' in case:
        os.environ['PIPETRAIN_NATIVE_LAYERS'] = '1' if case['native'] else '0'
    layers, loss_fn = engine_cases.specs(case['model'])
    module = PipelineModule(layers=layers, num_stages=stages, loss_fn=loss_fn, seed_layers=True,
                            base_seed=engine_cases.BASE_SEED, partition_method=case.get('partition', 'parameters'),
                            activation_checkpoint_interval=case.get('interval', 0))
    config = engine_cases.config(case, replicas)
    engine, _, _, _ = pipetrain.initialize(model=module, config=config)
    steps = case.get('steps', 3)
    client_state = None
    if case.get('load_from'):
        _, client_state = engine.load_checkpoint(case['load_from'])
    start = engine.global_steps
    data = engine_cases.data(case['model'], engine.global_rank % replicas, replicas, engine.micro_batches, steps,
                             start)
    losses = []
    for step in range(steps):
        if step == case.get('stop_at_step') and rank == case.get('stop_rank', 0):
            os.kill(os.getpid(), signal.SIGSTOP)  # hangs here, as a rank stuck in a kernel or a debugger would
        losses.append(engine.train_batch(data).item())
    if case.get('save_to'):
        engine.save_checkpoint(case['save_to'], client_state={'saved_by': case['name']})
    state = {i: {k: v.detach().clone() for k, v in m.state_dict().items()} for i, m in module.local_layers.items()}
    result = {'losses': losses, 'state': state, 'stage': engine.stage_id, 'replica': engine.global_rank % replicas,
              'balance': module.balance, 'is_first': engine.is_first_stage(), 'is_last': engine.is_last_stage(),
              'global_steps': engine.global_steps, 'start': start, 'client_state': client_state}
    torch.save(result, pathlib.Path(out_dir) / f"{case['name']}-rank{rank}.pt")


def main():
    cases = json.loads(pathlib.Path(sys.argv[1]).read_text())
    for case in cases:
        run(case, sys.argv[2])


if __name__ == '__main__':
    main()
