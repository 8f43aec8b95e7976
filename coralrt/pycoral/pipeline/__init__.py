"""pycoral.pipeline on coralrt: run a model cut into segments, one thread per segment."""

from coralrt.pycoral.pipeline.pipelined_model_runner import PipelinedModelRunner

__all__ = ["PipelinedModelRunner"]
