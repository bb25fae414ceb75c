"""deepspeed.runtime.pipe: the pipeline classes under DeepSpeed's own path (the same objects as
pipetrain.pipe)."""
from . import schedule
from .module import LayerSpec, PipelineModule, TiedLayerSpec
from .topology import ProcessTopology

__all__ = ['PipelineModule', 'LayerSpec', 'TiedLayerSpec', 'ProcessTopology', 'schedule']
