"""Prefect flows composing :mod:`tasks`: :mod:`flows.curriculum` (a curriculum's stages in order),
:mod:`flows.sweep` (an ablation sweep: the curriculum flow once per cell), :mod:`flows.deploy` (the deployments)
and :mod:`flows.services` (a throwaway local Prefect server for tests and benchmarks)."""
