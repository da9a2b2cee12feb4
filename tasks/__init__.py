"""Prefect tasks: thin wrappers over :mod:`vgrpo` that pass paths and content hashes, not tensors.

Empty until the pipeline lands (see the README's status); the library runs without Prefect.
"""
