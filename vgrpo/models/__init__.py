"""Adapters that turn diffusers transformers into :class:`vgrpo.policy.VelocityModel` s."""

from vgrpo.models.flux import FluxVelocity
from vgrpo.models.lora import add_lora
from vgrpo.models.sd3 import SD3Velocity

__all__ = ["FluxVelocity", "SD3Velocity", "add_lora"]
