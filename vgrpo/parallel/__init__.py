"""Parallelism: data parallelism over processes, FSDP2 sharding for full fine-tuning, and how a stage is launched."""
