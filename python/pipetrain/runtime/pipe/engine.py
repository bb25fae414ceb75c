"""deepspeed.runtime.pipe.engine: PipelineEngine (pipetrain.pipe's)."""
from ...pipe.engine import PipelineEngine

__all__ = ['PipelineEngine']
