"""Evaluation: sampling a fixed prompt set, scoring, tables with bootstrap confidence intervals, image grids and
reports."""
