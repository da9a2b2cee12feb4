"""World records (a prompt's metadata with its ground-truth scene) as JSON lines: their files written and read."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from vgrpo.atomic import write_text_atomic
from vgrpo.prompts import PromptFileError, load_prompts
from vgrpo.world.scene import ObjectSpec, Scene

__all__ = ["Record", "read_jsonl", "read_split", "scene_from_dict", "scene_to_dict", "write_jsonl"]

Record = tuple[dict[str, Any], Scene]
"""``(metadata, scene)``: a prompt's metadata with its ground-truth scene."""


def scene_to_dict(scene: Scene) -> dict[str, Any]:
    """JSON-ready form of a scene."""
    return {"objects": [vars(o) for o in scene.objects], "text": scene.text}


def scene_from_dict(d: dict[str, Any]) -> Scene:
    """Inverse of :func:`scene_to_dict`."""
    return Scene(objects=tuple(ObjectSpec(**o) for o in d["objects"]), text=d.get("text"))


def write_jsonl(path: str | os.PathLike[str], records: Iterable[dict[str, Any]]) -> None:
    """Write one JSON object per line atomically (:func:`write_text_atomic`)."""
    write_text_atomic(path, "".join(json.dumps(rec) + "\n" for rec in records))


def read_jsonl(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Read a JSONL file written by :func:`write_jsonl` (blank lines skipped)."""
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def read_split(path: str | Path) -> list[Record]:
    """``(metadata, scene)`` of every row of a split file written by :func:`vgrpo.world.prompts.write_splits`; a
    row without its ground-truth ``scene`` is a :class:`vgrpo.prompts.PromptFileError` naming the file and the row."""
    rows = load_prompts(path)
    for i, md in enumerate(rows, 1):
        if "scene" not in md:
            raise PromptFileError(f"{path}:{i}: a record needs its ground-truth 'scene' (a world split file)")
    return [(md, scene_from_dict(md["scene"])) for md in rows]
