"""The base of every typed config: a frozen pydantic model in which an unknown key is an error.

Each config lives beside the code that reads it; :mod:`vgrpo.config` composes them into a run's config and
loads them from YAML."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

__all__ = ["FrozenConfig"]


class FrozenConfig(BaseModel):
    """Base of every config: frozen, and an unknown key is an error."""

    model_config = ConfigDict(extra="forbid", frozen=True)
