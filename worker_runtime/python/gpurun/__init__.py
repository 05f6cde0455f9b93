"""gpurun for Python: elastic data-parallel training under ``gpurun --config``
(docs/python.md). Pure Python; torch >= 1.13."""
from ._sampler import ElasticSampler
from .runtime import Runtime, StateMismatch

__all__ = ["Runtime", "ElasticSampler", "StateMismatch"]
__version__ = "0.1.0"
