"""One rank of test_engine_api.py's two-rank cases: eval_batch's arguments and
reset_activation_shape on two stages, a client optimizer on two stages, and training_data
sharded between two replicas. Writes what it saw for the test to compare with one process."""
import os
import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import pipetrain  # noqa: E402
from pipetrain.pipe import PipelineModule  # noqa: E402

import engine_cases  # noqa: E402


def module(stages):
    layers, loss_fn = engine_cases.specs('mlp')
    return PipelineModule(layers=layers, num_stages=stages, loss_fn=loss_fn, seed_layers=True,
                          base_seed=engine_cases.BASE_SEED, partition_method='parameters')


def config(micro_batches=4, replicas=1, **extra):
    return dict({'train_micro_batch_size_per_gpu': 2, 'gradient_accumulation_steps': micro_batches,
                 'train_batch_size': 2 * micro_batches * replicas, 'steps_per_print': 10**6,
                 'optimizer': {'type': 'SGD', 'params': {'lr': 0.1}}}, **extra)


def eval_case():
    engine, _, _, _ = pipetrain.initialize(model=module(2), config=config())
    data = [engine_cases.micro_batch('mlp', i) for i in range(4)]
    result = {'avg': engine.eval_batch(iter(data)).item()}
    no_bcast = engine.eval_batch(iter(data), bcast_loss=False)
    result['no_bcast'] = None if no_bcast is None else no_bcast.item()
    per_micro = engine.eval_batch(iter(data), reduce_output=None)
    result['per_micro'] = None if per_micro is None else [l.item() for l in per_micro]
    result['outputs'] = engine.eval_batch(iter(data), compute_loss=False)
    engine.train_batch(iter(data))
    engine.reset_activation_shape()
    three = [engine_cases.micro_batch('mlp', i, rows=3) for i in range(4)]
    _, result['three_rows_logits'] = engine.eval_batch(iter(three), return_logits=True)
    return engine, result


def client_case():
    net = module(2)
    optimizer = torch.optim.AdamW(net.parameters(), lr=0.1, weight_decay=0.01)
    engine, _, _, _ = pipetrain.initialize(model=net, optimizer=optimizer, config=config())
    data = engine_cases.data('mlp', 0, 1, 4, 3)
    losses = [engine.train_batch(data).item() for _ in range(3)]
    state = {i: {k: v.detach().clone() for k, v in m.state_dict().items()} for i, m in net.local_layers.items()}
    return engine, {'losses': losses, 'state': state}


class Numbered(torch.utils.data.Dataset):
    """Sample i: inputs filled with i, labels 0."""

    def __len__(self):
        return 8

    def __getitem__(self, i):
        return torch.full((8,), float(i)), torch.zeros(4)


def replicas_case():
    engine, _, loader, _ = pipetrain.initialize(model=module(1), training_data=Numbered(),
                                                config=config(micro_batches=2, replicas=2))
    first_inputs = next(iter(loader.loader))[0][:, 0].tolist()
    losses = [engine.train_batch().item() for _ in range(3)]
    del engine
    try:
        pipetrain.initialize(model=module(1), optimizer=lambda p: torch.optim.SGD(p, lr=0.1),
                             config=config(micro_batches=2, replicas=2, zero_optimization={'stage': 1}))
        refused = ''
    except pipetrain.ConfigError as e:
        refused = str(e)
    return None, {'first_inputs': first_inputs, 'losses': losses, 'zero_with_client': refused}


def main():
    out = pathlib.Path(sys.argv[1])
    rank = int(os.environ.get('RANK', '0'))
    for name, case in (('eval', eval_case), ('client', client_case), ('replicas', replicas_case)):
        engine, result = case()
        torch.save(result, out / f'{name}-rank{rank}.pt')
        del engine
        import gc  # pylint: disable=import-outside-toplevel
        gc.collect()


if __name__ == '__main__':
    main()
