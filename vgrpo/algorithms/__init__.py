"""Algorithms behind one interface: V-GRPO, the naive ELBO-GRPO, Flow-GRPO, MixGRPO, DiffusionNFT."""

from vgrpo.algorithms.base import Algorithm, Payload, PreparedBatch, Rollout
from vgrpo.algorithms.registry import ALGORITHMS, build_algorithm, get_algorithm_class

__all__ = ["ALGORITHMS", "Algorithm", "Payload", "PreparedBatch", "Rollout", "build_algorithm", "get_algorithm_class"]
