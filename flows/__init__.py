"""Prefect flows composing :mod:`tasks`: :mod:`flows.curriculum` (the ``vgrpo`` flow) and
:mod:`flows.services` (the local Prefect and MLflow servers)."""
