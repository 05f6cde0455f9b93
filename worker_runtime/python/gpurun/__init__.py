"""gpurun for Python: elastic data-parallel training under ``gpurun --config``
(docs/python.md). Pure Python; torch >= 1.13."""
from ._sampler import ElasticSampler
from ._decorator import elastic, elastic_scheduler
from ._iterations import Micro
from ._model import ElasticModel
from ._energy import EnergyReading, EnergyUnavailable, Measurement, StopReason
from .runtime import Runtime, StateMismatch, is_comm_failure

__all__ = ["Runtime", "ElasticSampler", "ElasticModel", "Micro", "StateMismatch", "elastic",
           "elastic_scheduler", "is_comm_failure", "EnergyReading", "EnergyUnavailable",
           "Measurement", "StopReason"]
__version__ = "0.1.0"
