"""The golden tiny-world adapters: a three-iteration V-GRPO and DiffusionNFT stage on the tests' tiny world, and
the SHA-256 (16 hex digits) of each exported LoRA. A refactor that claims "no behaviour change" leaves both hashes
as they were on the same machine and torch build (docs/development.md records them).

    python scripts/golden_adapters.py        # about a minute on 2 cores; prints one JSON line
"""

from __future__ import annotations

import hashlib
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.tiny_world import tiny_stage_config, write_tiny_world
from vgrpo.checkpoints.state import LORA_FILE
from vgrpo.training.stage import run_stage

ALGORITHMS = {"vgrpo": {"name": "vgrpo", "n_mc": 2}, "diffusion_nft": {"name": "diffusion_nft"}}


def main() -> None:
    hashes = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = write_tiny_world(Path(tmp))
        for name, algorithm in ALGORITHMS.items():
            out = root / f"out-{name}"
            run_stage(
                tiny_stage_config(algorithm=algorithm),
                pipeline_dir=Path("base"),
                work_dir=root / name,
                out_dir=out,
                root=root,
            )
            hashes[name] = hashlib.sha256((out / LORA_FILE).read_bytes()).hexdigest()[:16]
    print(json.dumps(hashes))


if __name__ == "__main__":
    main()
