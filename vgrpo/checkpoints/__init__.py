"""Checkpoints on disk: resumable training state (dense or sharded), LoRA exports, which checkpoints belong to a run,
and what a weights folder holds."""
