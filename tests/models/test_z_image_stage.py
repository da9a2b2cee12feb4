"""Z-Image in the pipeline, on a tiny ZImagePipeline built offline: the family's stage contract
(tests/models/family_contract.py: a stage on a saved directory trains its LoRA, exported for a plain ZImagePipeline,
or every weight, exported as a whole pipeline; a killed stage resumes to the weights of the uninterrupted one, bit for
bit), and SD3's LoRA targets refused on its transformer, naming the family's."""

from __future__ import annotations

from pathlib import Path

from tests.models.family_contract import FamilyStageContract
from vgrpo.models.registry import FAMILIES
from vgrpo.models.tiny import tiny_z_image_pipeline


class TestZImageStage(FamilyStageContract):
    family = "z-image"
    shift = evaluation_shift = 3.0
    tiny_pipeline = staticmethod(lambda prompts: tiny_z_image_pipeline(seed=0))  # a byte-level tokenizer

    def test_the_sd3_lora_targets_on_a_z_image_pipeline_are_refused_naming_the_family_s(self, world: Path) -> None:
        from vgrpo.checkpoints.weight_files import lora_target_problems, transformer_shapes
        from vgrpo.models.config import LoraConfig

        pipeline = world / "base"
        shapes = transformer_shapes(pipeline)
        assert shapes is not None
        assert lora_target_problems(FAMILIES["z-image"].lora_targets, shapes, pipeline) == []
        (problem,) = lora_target_problems(LoraConfig().target_modules, shapes, pipeline)
        missing = "['add_q_proj', 'add_k_proj', 'add_v_proj', 'to_add_out']"
        assert problem.startswith(f"lora.target_modules: {missing} name no")
        assert problem.endswith("the z-image family's: ['to_q', 'to_k', 'to_v', 'to_out.0'])")
