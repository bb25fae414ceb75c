"""deepspeed.runtime.pipe.module: PipelineModule, LayerSpec, TiedLayerSpec (pipetrain.pipe's)."""
from ...pipe.module import PipelineModule
from ...pipe.spec import LayerSpec, TiedLayerSpec

__all__ = ['PipelineModule', 'LayerSpec', 'TiedLayerSpec']
