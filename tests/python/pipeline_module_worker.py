"""One rank of the PipelineModule tests: trains each case of a JSON list with pipetrain.initialize
and writes its losses and its layers' weights for the test to compare with the oracle."""
import json
import os
import pathlib
import sys

import torch
from torch import nn

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import pipetrain  # noqa: E402
from pipetrain.pipe import PipeDataParallelTopology, PipelineModule  # noqa: E402

import pipeline_module_cases as cases  # noqa: E402


def run(case, out_dir):
    rank = int(os.environ['RANK'])
    os.environ['PIPETRAIN_NATIVE_LAYERS'] = '1' if case.get('native', True) else '0'
    kwargs = {'topology': PipeDataParallelTopology(num_pp=2, num_dp=1)} if case.get('topology') else {'num_stages': 2}
    module = PipelineModule(layers=cases.layers(case['model']), loss_fn=nn.MSELoss(),
                            partition_method=case.get('partition', 'uniform'),
                            activation_checkpoint_interval=case.get('interval', 0), **kwargs)
    if case.get('load_and_freeze'):
        cases.load_and_freeze(module.local_layers)
    engine, _, _, _ = pipetrain.initialize(model=module, config=cases.config(case))
    steps = case.get('steps', 2)
    data = iter([cases.micro_batch(i) for i in range(steps * 4)])
    losses = [engine.train_batch(data).item() for _ in range(steps)]
    state = {i: {k: v.detach().clone() for k, v in m.state_dict().items()} for i, m in module.local_layers.items()}
    torch.save({'losses': losses, 'state': state, 'parts': module.parts, 'stage': engine.stage_id},
               pathlib.Path(out_dir) / f"{case['name']}-rank{rank}.pt")


def main():
    for case in json.loads(pathlib.Path(sys.argv[1]).read_text()):
        run(case, sys.argv[2])


if __name__ == '__main__':
    main()
