"""Prefect flows composing :mod:`tasks` declaratively (stage and curriculum flows).

Empty until the pipeline lands (see the README's status).
"""
