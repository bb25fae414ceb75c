"""DeepSpeed's pipeline API on pipetrain's native engine (deepspeed.pipe and deepspeed.initialize).

    from pipetrain.pipe import PipelineModule, LayerSpec, TiedLayerSpec   # was: deepspeed.pipe
    import pipetrain
    engine, _, _, _ = pipetrain.initialize(model=PipelineModule(...), config='ds_config.json')
    loss = engine.train_batch(data_iter)

Launched as several processes: ``pipetrain launch -n 2 -- python3 train.py``, mpirun or a
working torchrun.
"""
from .engine import PipelineEngine, RepeatingLoader, init_distributed, initialize
from .module import PipelineModule
from .spec import LayerSpec, TiedLayerSpec
from .topology import PipeDataParallelTopology, PipeModelDataParallelTopology, ProcessTopology

__all__ = ['PipelineModule', 'LayerSpec', 'TiedLayerSpec', 'PipelineEngine', 'initialize', 'init_distributed',
           'RepeatingLoader', 'PipeDataParallelTopology', 'PipeModelDataParallelTopology', 'ProcessTopology']
