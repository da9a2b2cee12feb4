"""benchmarks.memory_estimate: the element counts behind docs/real-models.md's memory tables are the published
models' sizes, and the tables add up."""

from __future__ import annotations

import pytest

from benchmarks import memory_estimate


def test_counts_match_the_model_cards_and_the_tables_add_up() -> None:
    c = memory_estimate.count_parameters()
    # SD3.5-M "2.5B" (its 2.24 B parameters and the 384^2 x 1536 position-embedding buffer), FLUX.1 "12B",
    # T5-XXL's encoder 4.76 B, CLIP-L 124 M, OpenCLIP bigG's text tower 695 M, the 16-channel VAE 84 M.
    assert c["sd35m_transformer"] == pytest.approx(2.470e9, rel=1e-3)
    assert c["sd35m_pos_embed_buffer"] == 384 * 384 * 1536
    assert c["flux_dev_transformer"] == pytest.approx(11.901e9, rel=1e-3)
    assert c["t5_xxl_encoder"] == pytest.approx(4.762e9, rel=1e-3)
    assert (c["clip_l"], c["clip_g"], c["vae"]) == pytest.approx((123.65e6, 694.66e6, 83.82e6), rel=1e-3)
    assert c["sd35m_lora_r32"] == 23_887_872
    sd35, flux = memory_estimate.sd35_lora(c), memory_estimate.flux_full_fsdp(c)
    assert sum(r[1] for r in sd35) / 1e9 == pytest.approx(23.7, abs=0.05)
    assert sum(r[1] for r in flux) / 1e9 == pytest.approx(41.1, abs=0.05)
    cpu = sum(r[1] for r in memory_estimate.sd35_lora(c, text_encoders="cpu"))
    assert (sum(r[1] for r in sd35) - cpu) / 1e9 == pytest.approx(11.16, abs=0.01)  # the encoders leave the GPU
    assert "| **total** | **23.7** |" in memory_estimate.table(sd35)
