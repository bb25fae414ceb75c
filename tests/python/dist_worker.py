"""One rank of test_distributed.py: a DeepSpeed-style script that uses deepspeed.comm
(pipetrain.comm) around pipetrain.initialize, under pipetrain launch, mpirun or an emulated
torchrun. `python3 dist_worker.py MODE OUT_DIR`; each rank writes OUT_DIR/<mode>-rank<r>.json."""
import gc
import json
import os
import pathlib
import sys
import time

import torch
from torch import nn
import torch.distributed as tdist

import pipetrain as deepspeed
from pipetrain import comm as dist
from pipetrain.pipe import PipelineModule
from pipetrain.pipe.topology import PipeDataParallelTopology

CONFIG = {'train_batch_size': 4, 'train_micro_batch_size_per_gpu': 2,
          'optimizer': {'type': 'SGD', 'params': {'lr': 0.1}}}


def data(rank, steps=2):
    g = torch.Generator().manual_seed(100 + rank)
    return iter([(torch.randn(2, 4, generator=g), torch.randn(2, 2, generator=g)) for _ in range(steps * 4)])


def engine(stages, replicas=1):
    torch.manual_seed(3)
    module = PipelineModule(layers=[nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)], num_stages=stages,
                            loss_fn=nn.MSELoss(), partition_method='uniform')
    config = dict(CONFIG, train_batch_size=2 * 2 * replicas)
    eng, _, _, _ = deepspeed.initialize(model=module, config=config)
    return eng


def collectives(out):
    """deepspeed.comm's calls on the group init_distributed made."""
    rank, world = dist.get_rank(), dist.get_world_size()
    out['rank'], out['world'], out['local_rank'] = rank, world, dist.get_local_rank()
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    out['sum'] = t.item()
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t, op=dist.ReduceOp.AVG)
    out['avg'] = t.item()
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    out['max'] = t.item()
    b = torch.tensor([7.0 if rank == world - 1 else 0.0])
    dist.broadcast(b, src=world - 1)
    out['bcast'] = b.item()
    parts = [torch.zeros(1) for _ in range(world)]
    dist.all_gather(parts, torch.tensor([float(rank * 10)]))
    out['gather'] = [p.item() for p in parts]
    group = dist.new_group([0, world - 1])
    t = torch.tensor([1.0])
    dist.all_reduce(t, group=group)
    out['pair_sum'] = t.item()
    out['global_of_group_rank_1'] = dist.get_global_rank(group, 1)
    dist.barrier()


def mode_ds_order(out):
    """DeepSpeed's order: init_distributed, comm calls, initialize, comm calls again, then a second
    engine of another layout (1 stage x 2 replicas) in the same process."""
    deepspeed.init_distributed()
    out['env'] = {k: os.environ.get(k) for k in ('RANK', 'WORLD_SIZE', 'LOCAL_RANK', 'MASTER_ADDR', 'MASTER_PORT')}
    out['initialized_before'] = dist.is_initialized()
    if dist.get_rank() == 0:
        pass  # a download would go here
    dist.barrier()
    eng = engine(stages=2)
    out['losses_a'] = [eng.train_batch(data(0)).item() for _ in range(1)]
    collectives(out)
    del eng
    gc.collect()
    eng = engine(stages=1, replicas=2)
    out['layout_b'] = [eng.num_stages, eng.dp_world_size]
    out['losses_b'] = [eng.train_batch(data(dist.get_rank())).item()]
    dist.barrier()


def mode_torch_first(out):
    """The script made torch.distributed's group itself before initialize: pipetrain adopts it."""
    tdist.init_process_group('gloo')
    eng = engine(stages=2)
    out['losses_a'] = [eng.train_batch(data(0)).item()]
    deepspeed.init_distributed()  # adopts, as DeepSpeed's does
    collectives(out)


def mode_implicit(out):
    """initialize alone makes torch.distributed's group (as DeepSpeed's initialize does)."""
    out['initialized_before'] = tdist.is_initialized()
    eng = engine(stages=2)
    out['losses_a'] = [eng.train_batch(data(0)).item()]
    out['initialized_after'] = tdist.is_initialized()
    collectives(out)


def mode_grid(out):
    world = int(os.environ.get('WORLD_SIZE', '1'))
    deepspeed.init_distributed(verbose=False)
    topo = PipeDataParallelTopology(num_pp=2, num_dp=world // 2)
    grid = dist.PipelineParallelGrid(topology=topo)
    rank = dist.get_rank()
    out['rank'] = rank
    out['stage'] = grid.get_stage_id()
    out['pipe'] = [grid.get_pipe_parallel_rank(), grid.get_pipe_parallel_world_size()]
    out['data'] = [grid.get_data_parallel_rank(), grid.get_data_parallel_world_size()]
    out['model'] = [grid.get_model_parallel_rank(), grid.get_model_parallel_world_size()]
    out['slice'] = [grid.get_slice_parallel_rank(), grid.get_slice_parallel_world_size()]
    out['stage_to_global'] = [grid.stage_to_global(s) for s in range(2)]
    out['first_last'] = [grid.is_first_stage, grid.is_last_stage]
    out['topology_is'] = grid.topology() is topo
    for name, group in (('dp', grid.get_data_parallel_group()), ('pp', grid.get_pipe_parallel_group()),
                        ('mp', grid.get_model_parallel_group()), ('slice', grid.get_slice_parallel_group())):
        t = torch.tensor([float(2 ** rank)])  # distinct bits: the sum names the members
        dist.all_reduce(t, group=group)
        out[name + '_members'] = [r for r in range(world) if int(t.item()) >> r & 1]


def mode_hang(out_dir):
    """Blocks inside train_batch until interrupted: stage 0 in a Python layer that waits for a file
    that never comes, stage 1 in the native receive of its activations."""
    out = pathlib.Path(out_dir)
    rank = int(os.environ['RANK'])
    (out / f'pid-{rank}').write_text(str(os.getpid()))

    class WaitForFile(nn.Module):
        def forward(self, x):
            (out / 'ready').write_text('in the layer')
            while not (out / 'never').exists():
                torch.tensor(0.0).add_(1)  # Python bytecode, as a real layer runs
                time.sleep(0.02)
            return x

    module = PipelineModule(layers=[nn.Linear(4, 4), WaitForFile(), nn.Linear(4, 2)], num_stages=2,
                            loss_fn=nn.MSELoss(), partition_method='uniform')
    eng, _, _, _ = deepspeed.initialize(model=module, config=CONFIG)
    try:
        (out / f'entering-{rank}').write_text('train_batch')
        eng.train_batch(data(0))
    except KeyboardInterrupt:
        (out / f'interrupted-{rank}').write_text('KeyboardInterrupt')
        raise


def main():
    mode, out_dir = sys.argv[1], pathlib.Path(sys.argv[2])
    if mode == 'hang':
        mode_hang(out_dir)
        return
    out = {}
    {'ds-order': mode_ds_order, 'torch-first': mode_torch_first, 'implicit': mode_implicit, 'grid': mode_grid}[mode](out)
    (out_dir / f'{mode}-rank{dist.get_rank()}.json').write_text(json.dumps(out))


if __name__ == '__main__':
    main()
