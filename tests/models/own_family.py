"""A model family of one's own, outside vgrpo's registry (tests/models/test_registry.py): an SD3 adapter under
another pipeline class's name, and a class that forgets the family's attributes."""

from __future__ import annotations

from vgrpo.models.adapter import PipelineAdapter
from vgrpo.models.sd3 import SD3Adapter


class OwnAdapter(SD3Adapter):
    """SD3's encoding, latents and geometry, for a pipeline class of its own."""

    name = "own"
    pipeline_class = "OwnPipeline"


class Incomplete(PipelineAdapter):
    """An adapter class that names no pipeline: refused when it is resolved."""

    name = "incomplete"
