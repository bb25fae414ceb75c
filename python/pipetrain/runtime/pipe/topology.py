"""deepspeed.runtime.pipe.topology: the process grids (pipetrain.pipe.topology's)."""
from ...pipe.topology import PipeDataParallelTopology, PipeModelDataParallelTopology, ProcessTopology

__all__ = ['ProcessTopology', 'PipeDataParallelTopology', 'PipeModelDataParallelTopology']
