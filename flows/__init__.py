"""Prefect flows composing :mod:`tasks`: :mod:`flows.curriculum` (the ``vgrpo`` flow) and
:mod:`flows.services` (a throwaway local Prefect server for tests and benchmarks)."""
