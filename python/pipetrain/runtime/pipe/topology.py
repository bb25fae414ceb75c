"""deepspeed.runtime.pipe.topology: the process grids (pipetrain.pipe.topology's) and
PipelineParallelGrid (pipetrain.comm's)."""
import importlib

from ...pipe.topology import PipeDataParallelTopology, PipeModelDataParallelTopology, ProcessTopology

__all__ = ['ProcessTopology', 'PipeDataParallelTopology', 'PipeModelDataParallelTopology', 'PipelineParallelGrid']


def __getattr__(name):
    # The grid makes process groups, so it lives with the communication code; imported on use.
    if name == 'PipelineParallelGrid':
        return importlib.import_module('pipetrain.comm.grid').PipelineParallelGrid
    raise AttributeError(f"module '{__name__}' has no attribute '{name}'")
