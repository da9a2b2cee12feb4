"""Training: one curriculum stage as a loop over named phases, one iteration of any algorithm, the optimiser, the
policy EMA, numerical guards and the preflight of a run's inputs."""
