"""benchmarks.memory_families: the newer families' element counts are the published models' sizes, the LoRA counts
follow the shipped params files, and the tables add up (docs/real-models.md#memory-of-the-newer-families)."""

from __future__ import annotations

import pytest

from benchmarks import memory_families
from benchmarks.memory_families import FAMILIES


def test_counts_match_the_model_cards_and_a_bf16_base_halves_the_transformer() -> None:
    c = memory_families.count_parameters()
    # Qwen-Image "20B", FLUX.2-dev "32B", Z-Image "6B", Wan2.1 "14B"; the text encoders' language models: Qwen2.5-VL
    # 7B's, Mistral-Small-3.1 24B's (without its head and vision tower), Qwen3-4B, UMT5-XXL's encoder.
    transformers = {name: c[name]["transformer"] / 1e9 for name in c}
    assert transformers == pytest.approx(
        {"Qwen-Image": 20.430, "FLUX.2-dev": 32.223, "Z-Image-Turbo": 6.155, "Wan2.1-T2V-14B": 14.289}, abs=1e-3
    )
    encoders = {name: c[name]["text_encoder"] / 1e9 for name in c}
    assert encoders == pytest.approx(
        {"Qwen-Image": 7.071, "FLUX.2-dev": 22.901, "Z-Image-Turbo": 4.022, "Wan2.1-T2V-14B": 5.681}, abs=1e-3
    )
    totals = {}
    for family in FAMILIES:
        for base in ("fp32", "bf16"):
            rows = memory_families.lora_rows(family, c[family.name], base)
            totals[family.name, base] = sum(r[1] for r in rows) / 1e9
        saved = totals[family.name, "fp32"] - totals[family.name, "bf16"]
        assert saved == pytest.approx(2 * c[family.name]["transformer"] / 1e9)
    # FLUX.2-dev's LoRA stage fits one 141 GB GPU only with its base in bf16.
    assert totals["FLUX.2-dev", "fp32"] > 141 > totals["FLUX.2-dev", "bf16"]
    assert totals["Qwen-Image", "bf16"] == pytest.approx(62.6, abs=0.05)
    assert totals["FLUX.2-dev", "bf16"] == pytest.approx(80.6, abs=0.05)
    # The LoRA follows the params file: FLUX.2's targets include its MLPs (r 64).
    assert c["FLUX.2-dev"]["lora"] == pytest.approx(308.3e6, rel=1e-3)
