"""Packaging: ranges in pyproject.toml, the exact set in constraints.txt, the SPDX licence, a gpu extra."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

REPO = Path(__file__).parents[1]
PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())


def _name(requirement: str) -> str:
    return re.split(r"[\s<>=!~;\[]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def _pins() -> dict[str, str]:
    lines = (REPO / "constraints.txt").read_text().splitlines()
    return {_name(line): line.split("==", 1)[1] for line in lines if "==" in line and not line.startswith("#")}


def test_core_dependencies_are_ranges_and_the_lock_pins_each_inside_them() -> None:
    from packaging.requirements import Requirement

    pins = _pins()
    for text in PROJECT["project"]["dependencies"]:
        requirement = Requirement(text)
        name = _name(text)
        if name != "rapidocr-onnxruntime":  # the OCR models ship inside that exact wheel
            assert not str(requirement.specifier).startswith("=="), text
        assert name in pins, f"{name} is not pinned in constraints.txt"
        assert requirement.specifier.contains(pins[name], prereleases=True), (text, pins[name])
    torch = next(t for t in PROJECT["project"]["dependencies"] if _name(t) == "torch")
    assert Requirement(torch).specifier.contains("2.6.0") and Requirement(torch).specifier.contains("2.11.0")


def test_the_licence_is_an_spdx_string_with_a_build_backend_that_reads_it() -> None:
    assert PROJECT["project"]["license"] == "Apache-2.0"
    assert "setuptools>=77" in PROJECT["build-system"]["requires"]


def test_the_gpu_extra_declares_bitsandbytes_and_nvml() -> None:
    assert sorted(_name(r) for r in PROJECT["project"]["optional-dependencies"]["gpu"]) == [
        "bitsandbytes",
        "nvidia-ml-py",
    ]
