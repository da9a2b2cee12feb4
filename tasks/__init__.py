"""Prefect tasks: thin wrappers over :mod:`vgrpo` that pass paths and content hashes, not tensors.

:mod:`tasks.stage` (train one curriculum stage), :mod:`tasks.tracking` (MLflow helpers with explicit run ids).
"""
