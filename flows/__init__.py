"""Prefect flows composing :mod:`tasks`: :mod:`flows.curriculum` (a curriculum's stages in order),
:mod:`flows.sweep` (an ablation sweep: the curriculum flow once per cell) and :mod:`flows.deploy` (the deployments).
The servers they talk to are :mod:`services`'."""
