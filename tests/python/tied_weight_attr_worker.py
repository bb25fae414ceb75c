"""One rank of test_tied_weight_attr.py: trains each model with pipetrain.initialize on 2 stages
and writes its losses and its layers' weights for the test to compare with the oracle."""
import gc
import os
import pathlib
import sys

import torch
from torch import nn

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import pipetrain  # noqa: E402
from pipetrain.pipe import PipelineModule  # noqa: E402

import tied_weight_attr_cases as cases  # noqa: E402


def run(model, out_dir, steps=2):
    rank = int(os.environ['RANK'])
    module = PipelineModule(layers=cases.specs(model), loss_fn=nn.MSELoss(), num_stages=2,
                            partition_method='uniform')
    cases.set_start(module.local_layers, module.stage_owner)
    config = {'train_micro_batch_size_per_gpu': 2, 'gradient_accumulation_steps': 4, 'steps_per_print': 10**6,
              'optimizer': {'type': 'SGD', 'params': {'lr': 0.1}}, 'pipeline': {'comm_timeout_s': 20}}
    engine, _, _, _ = pipetrain.initialize(model=module, config=config)
    data = iter([cases.micro_batch(model, i) for i in range(steps * 4)])
    losses = [engine.train_batch(data).item() for _ in range(steps)]
    state = {i: {k: v.detach().clone() for k, v in m.state_dict().items()} for i, m in module.local_layers.items()}
    stage = engine.stage_id
    # A checkpoint keeps each use's untied parameters: a fresh model (other start values) that
    # loads it holds exactly the trained state.
    ckpt = pathlib.Path(out_dir) / f'ckpt-{model}'
    engine.save_checkpoint(ckpt)
    del engine
    gc.collect()
    fresh = PipelineModule(layers=cases.specs(model), loss_fn=nn.MSELoss(), num_stages=2,
                           partition_method='uniform')
    engine, _, _, _ = pipetrain.initialize(model=fresh, config=config)
    engine.load_checkpoint(ckpt)
    loaded = {i: {k: v.detach().clone() for k, v in m.state_dict().items()} for i, m in fresh.local_layers.items()}
    del engine
    gc.collect()
    torch.save({'losses': losses, 'state': state, 'loaded': loaded, 'parts': module.parts, 'stage': stage},
               pathlib.Path(out_dir) / f'{model}-rank{rank}.pt')


def main():
    for model in sys.argv[1].split(','):
        run(model, sys.argv[2])


if __name__ == '__main__':
    main()
