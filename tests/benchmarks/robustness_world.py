"""The tiny world the robustness command's tests run: a two-stage curriculum on it and its evaluation params."""

from __future__ import annotations

from pathlib import Path

import yaml

CURRICULUM = {"name": "tiny", "base": [], "model": "empty.yaml", "stages": ["s1.yaml", "s2.yaml"]}
"""``curriculum.yaml``'s section: stages ``s1`` and ``s2`` (2 iterations each, evaluated on validation)."""


def write_robustness_world(root: Path) -> Path:
    """The tiny world at ``root`` with ``validation.jsonl``, stage files ``s1.yaml`` and ``s2.yaml``,
    ``curriculum.yaml``, the test evaluation's params ``evaluate.yaml`` (seed 0) and the validation overlay
    ``validation-eval.yaml`` (seed 1); returns ``root``."""
    from tests.tiny_world import WORLD_PICK, tiny_stage_config, write_tiny_world
    from vgrpo.world.prompts import make_splits, make_validation, write_jsonl

    root = write_tiny_world(root)
    _, test = make_splits(0, 40, 8)
    write_jsonl(root / "validation.jsonl", [md for md, _ in make_validation(0, 8, [md["prompt"] for md, _ in test])])
    pick = {"name": "pickscore", "key": "world_pickscore", "options": {"path": str(WORLD_PICK)}}
    evaluation = {"group_size": 1, "num_steps": 2, "seed": 1, "rewards": [{"name": "geneval"}, pick]}
    for i in (1, 2):
        stage = tiny_stage_config(name=f"s{i}", iterations=2, eval_every=2, eval_prompts="validation.jsonl")
        data = {**stage.model_dump(mode="json"), "pipeline": "base", "evaluation": evaluation}
        (root / f"s{i}.yaml").write_text(yaml.safe_dump(data))
    (root / "empty.yaml").write_text("{}\n")
    (root / "curriculum.yaml").write_text(yaml.safe_dump({"curriculum": CURRICULUM}))
    (root / "evaluate.yaml").write_text(yaml.safe_dump({"evaluation": {**evaluation, "seed": 0}}))
    (root / "validation-eval.yaml").write_text(yaml.safe_dump({"evaluation": {"seed": 1}}))
    return root
