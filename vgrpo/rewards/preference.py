"""CLIP-family preference rewards on transformers' ``CLIPModel``, loaded from local directories.

With ``v`` the L2-normalised image embedding and ``c`` the L2-normalised text embedding of one pair:

* **CLIPScore** (Hessel et al. 2021, "CLIPScore", Eq. 1): ``w * max(cos(c, v), 0)`` with ``w = 2.5``.
  flow_grpo's variant (yifan123/flow_grpo, ``flow_grpo/clip_scorer.py``: ``logits_per_image.diagonal() / 30``)
  is ``weight = logit_scale.exp() / 30`` (100 / 30 for OpenAI's ViT-L/14) with ``clamp=False``.
* **PickScore** (Kirstain et al. 2023; yuvalkirstain/PickScore README, flow_grpo ``pickscore_scorer.py``):
  ``logit_scale.exp() * cos(c, v)``. flow_grpo trains on it ``/ 26``; MixGRPO
  (Tencent-Hunyuan/MixGRPO, ``fastvideo/models/reward_model/pick_score.py``) on ``(s - 18) / 8``: both are a
  reward set's affine normalisation (``offset``/``scale`` of :class:`vgrpo.rewards.multi.RewardTerm`), not
  part of the score.
* **HPSv2.1** (Wu et al. 2023; tgxs002/HPSv2, ``hpsv2/img_score.py``): ``cos(c, v)`` of open_clip's ViT-H-14
  with the HPS checkpoint (``diag(image_features @ text_features.T)`` on normalised features), converted to a
  ``CLIPModel`` directory by :func:`vgrpo.rewards.convert.convert_open_clip`.
* **Aesthetic** (christophschuhmann/improved-aesthetic-predictor ``simple_inference.py``, flow_grpo
  ``aesthetic_scorer.py``): a linear MLP on ``v`` of CLIP ViT-L/14.

A model directory is what ``CLIPModel.save_pretrained`` writes (safetensors only) plus a CLIP tokenizer
(``vocab.json`` + ``merges.txt`` or ``tokenizer.json``) and ``preprocessor_config.json`` (a
``CLIPImageProcessor``: bicubic resize of the short side, centre crop, normalise). Images go through the
processor's PIL backend, as in the reference code. Text longer than the text tower's positions is truncated.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch

from vgrpo.rewards.base import Metadata, Reward, RewardOutput
from vgrpo.rewards.convert import AESTHETIC_FILE, AESTHETIC_KEYS

__all__ = [
    "AestheticScore",
    "CLIPScore",
    "HPSv2",
    "LocalModelReward",
    "PickScore",
    "aesthetic_mlp",
    "load_image_processor",
    "require_files",
    "resolve_device",
    "resolve_dtype",
]

WEIGHTS = ("model.safetensors", "model.safetensors.index.json")
TOKENIZER = (("vocab.json", "merges.txt"), ("tokenizer.json",))


def resolve_device(device: str | torch.device | None) -> torch.device:
    """``device``, or ``cuda`` when available else ``cpu``."""
    return torch.device(device if device is not None else ("cuda" if torch.cuda.is_available() else "cpu"))


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """A ``torch.dtype`` from itself or its name (``"float32"``, ``"bfloat16"``, ...): params files give names."""
    if isinstance(dtype, torch.dtype):
        return dtype
    value = getattr(torch, str(dtype).removeprefix("torch."), None)
    if not isinstance(value, torch.dtype) or not value.is_floating_point:
        raise ValueError(f"dtype must be a floating torch dtype or its name, got {dtype!r}")
    return value


def require_files(path: str | Path, *groups: Sequence[str | Sequence[str]]) -> Path:
    """``path`` as a directory holding, for each group, at least one of its files (a nested group: all of them).

    Raises:
        FileNotFoundError: naming the directory and the missing file(s).
    """
    root = Path(path)
    if not root.is_dir():
        raise FileNotFoundError(f"reward model directory not found: {root}")
    for group in groups:
        options = [opt if isinstance(opt, (tuple, list)) else (opt,) for opt in group]
        if not any(all((root / f).is_file() for f in opt) for opt in options):
            wanted = " or ".join(" + ".join(opt) for opt in options)
            raise FileNotFoundError(f"{root} lacks {wanted}")
    return root


def load_image_processor(path: Path) -> Any:
    """The directory's ``CLIPImageProcessor`` on the PIL backend (the reference pipelines' PIL bicubic resize)."""
    import transformers

    cls = getattr(transformers, "CLIPImageProcessorPil", None) or transformers.CLIPImageProcessor
    return cls.from_pretrained(str(path))


def pooled_features(out: Any) -> torch.Tensor:
    """Projected features from ``get_*_features`` (a tensor in transformers 4, a model output in 5)."""
    return out if isinstance(out, torch.Tensor) else out.pooler_output


def _normalise(x: torch.Tensor) -> torch.Tensor:
    """``x / ||x||_2`` over the last dim, in float32."""
    x = x.float()
    return x / x.norm(p=2, dim=-1, keepdim=True)


class LocalModelReward(Reward):
    """A reward model read from a local directory and run in batches on one device.

    Args:
        path: the model directory; subclasses name the files it must hold (:func:`require_files`).
        device: default ``cuda`` when available, else ``cpu``.
        dtype: the model's dtype, or its name.
        batch_size: images per forward pass.
    """

    thread_safe: ClassVar[bool] = False  # the fast tokenizer's padding state is not shareable between threads

    def __init__(
        self,
        path: str | Path,
        device: str | torch.device | None = None,
        dtype: str | torch.dtype = torch.float32,
        batch_size: int = 32,
    ):
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.path = Path(path)
        self.device, self.dtype, self.batch_size = resolve_device(device), resolve_dtype(dtype), batch_size

    def batches(self, n: int) -> Iterator[slice]:
        """Slices of ``range(n)`` of at most ``batch_size`` items."""
        for start in range(0, n, self.batch_size):
            yield slice(start, min(start + self.batch_size, n))


class _CLIPReward(LocalModelReward):
    """Shared loading and embedding of a local ``CLIPModel`` directory; subclasses turn ``(v, c)`` into scores.
    Arguments as :class:`LocalModelReward`."""

    needs_text: ClassVar[bool] = True

    def __init__(self, path: str | Path, **kwargs: Any):
        from transformers import CLIPModel, CLIPTokenizer

        super().__init__(path, **kwargs)
        groups: list[Sequence[Any]] = [("config.json",), WEIGHTS, ("preprocessor_config.json",)]
        require_files(self.path, *groups, *([TOKENIZER] if self.needs_text else []))
        model: Any = CLIPModel.from_pretrained(str(self.path), use_safetensors=True, dtype=self.dtype)
        self.model = model.to(self.device).eval().requires_grad_(False)
        self.processor = load_image_processor(self.path)
        self.tokenizer = CLIPTokenizer.from_pretrained(str(self.path)) if self.needs_text else None
        self.max_length = int(self.model.config.text_config.max_position_embeddings)
        if self.tokenizer is not None:
            self._check_eos(self.model.config.text_config, self.tokenizer.eos_token_id)

    def _check_eos(self, text_config: Any, tokenizer_eos: int) -> None:
        """CLIPTextModel pools at the first ``eos_token_id``, or at the largest id under the legacy value 2 (OpenAI's
        configs, whose EOS is the last id); a mismatch would silently pool at the wrong token."""
        eos = text_config.eos_token_id
        if eos != tokenizer_eos and not (eos == 2 and tokenizer_eos == text_config.vocab_size - 1):
            raise ValueError(
                f"{self.path}: text_config.eos_token_id={eos} does not pool at the tokenizer's EOS id {tokenizer_eos}"
            )

    @torch.no_grad()
    def image_embeddings(self, images: np.ndarray) -> torch.Tensor:
        """``v``: L2-normalised image embeddings ``(N, D)`` float32 of uint8 ``images (N, H, W, 3)``."""
        out = []
        for sl in self.batches(len(images)):
            pixels = self.processor(images=list(images[sl]), return_tensors="pt")["pixel_values"]
            feats = self.model.get_image_features(pixel_values=pixels.to(self.device, self.dtype))
            out.append(_normalise(pooled_features(feats)))
        return torch.cat(out)

    @torch.no_grad()
    def text_embeddings(self, prompts: Sequence[str]) -> torch.Tensor:
        """``c``: L2-normalised text embeddings ``(N, D)`` float32, prompts truncated to the text positions."""
        if self.tokenizer is None:
            raise RuntimeError(f"reward {self.name!r} loads no tokenizer")
        out = []
        for sl in self.batches(len(prompts)):
            tok = self.tokenizer(
                list(prompts[sl]), padding=True, truncation=True, max_length=self.max_length, return_tensors="pt"
            )
            feats = self.model.get_text_features(
                input_ids=tok["input_ids"].to(self.device), attention_mask=tok["attention_mask"].to(self.device)
            )
            out.append(_normalise(pooled_features(feats)))
        return torch.cat(out)

    def cosine(self, images: np.ndarray, prompts: Sequence[str]) -> torch.Tensor:
        """``cos(c, v)`` per pair, ``(N,)`` float32."""
        return (self.image_embeddings(images) * self.text_embeddings(prompts)).sum(-1)

    @property
    def logit_scale(self) -> float:
        """``exp(logit_scale)``, CLIP's learned inverse temperature (100 for OpenAI's models)."""
        return float(self.model.logit_scale.detach().float().exp())


class CLIPScore(_CLIPReward):
    """CLIPScore (Hessel et al. 2021, Eq. 1): ``weight * max(cos(c, v), 0)``; sub-score ``cosine``.

    Args:
        path: a CLIP directory (OpenAI ViT-L/14 in flow_grpo; the world CLIP in the embedded world).
        weight: ``w``, 2.5 in the paper; ``logit_scale / 30`` with ``clamp=False`` is flow_grpo's variant.
        clamp: apply ``max(., 0)`` (the paper) or not.
    """

    name: ClassVar[str] = "clipscore"

    def __init__(self, path: str | Path, weight: float = 2.5, clamp: bool = True, **kwargs: Any):
        super().__init__(path, **kwargs)
        self.weight, self.clamp = float(weight), bool(clamp)

    def score(self, images: np.ndarray, prompts: Sequence[str], metadata: Sequence[Metadata] | None) -> RewardOutput:
        cos = self.cosine(images, prompts).double()
        scores = self.weight * (cos.clamp_min(0.0) if self.clamp else cos)
        return RewardOutput(scores=scores.cpu().numpy(), sub_scores={"cosine": cos.cpu().numpy()})


class PickScore(_CLIPReward):
    """PickScore (Kirstain et al. 2023): ``logit_scale.exp() * cos(c, v)``; sub-score ``cosine``.

    flow_grpo's ``/ 26`` and MixGRPO's ``(s - 18) / 8`` are ``scale: 26`` and ``offset: 18, scale: 8`` of the
    reward's entry in a params file (:class:`vgrpo.rewards.multi.RewardTerm`).
    """

    name: ClassVar[str] = "pickscore"

    def score(self, images: np.ndarray, prompts: Sequence[str], metadata: Sequence[Metadata] | None) -> RewardOutput:
        cos = self.cosine(images, prompts).double()
        return RewardOutput(scores=(self.logit_scale * cos).cpu().numpy(), sub_scores={"cosine": cos.cpu().numpy()})


class HPSv2(_CLIPReward):
    """HPSv2.1 (tgxs002/HPSv2 ``hpsv2/img_score.py``): ``cos(c, v)`` of the HPS-finetuned open_clip ViT-H-14.

    ``path``: the output of :func:`vgrpo.rewards.convert.convert_open_clip` on ``HPS_v2.1_compressed.pt`` with
    a CLIP tokenizer copied in.
    """

    name: ClassVar[str] = "hpsv2"

    def score(self, images: np.ndarray, prompts: Sequence[str], metadata: Sequence[Metadata] | None) -> RewardOutput:
        return RewardOutput(scores=self.cosine(images, prompts).double().cpu().numpy())


def aesthetic_mlp(state: dict[str, torch.Tensor]) -> torch.nn.Sequential:
    """The LAION improved-aesthetic-predictor MLP: ``Linear(d,1024), Dropout, Linear(1024,128), Dropout,
    Linear(128,64), Dropout, Linear(64,16), Linear(16,1)`` with no activations (``simple_inference.py``);
    ImageReward's head has the same layout."""
    if set(state) != set(AESTHETIC_KEYS):
        raise ValueError(f"MLP head keys must be {sorted(AESTHETIC_KEYS)}, got {sorted(state)}")
    dims = [state["layers.0.weight"].shape[1]] + [state[f"layers.{i}.weight"].shape[0] for i in (0, 2, 4, 6, 7)]
    mlp = torch.nn.Sequential(
        torch.nn.Linear(dims[0], dims[1]),
        torch.nn.Dropout(0.2),
        torch.nn.Linear(dims[1], dims[2]),
        torch.nn.Dropout(0.2),
        torch.nn.Linear(dims[2], dims[3]),
        torch.nn.Dropout(0.1),
        torch.nn.Linear(dims[3], dims[4]),
        torch.nn.Linear(dims[4], dims[5]),
    )
    mlp.load_state_dict({k.removeprefix("layers."): v for k, v in state.items()}, strict=True)
    return mlp.eval().requires_grad_(False)


class AestheticScore(_CLIPReward):
    """LAION aesthetic predictor: ``MLP(v)`` on CLIP ViT-L/14's normalised image embedding (prompts unused).

    ``path``: a CLIP directory (no tokenizer needed) holding ``aesthetic_mlp.safetensors`` (written by
    :func:`vgrpo.rewards.convert.convert_aesthetic`), or ``mlp_file`` naming that file elsewhere.
    """

    name: ClassVar[str] = "aesthetic"
    needs_text: ClassVar[bool] = False

    def __init__(self, path: str | Path, mlp_file: str | Path | None = None, **kwargs: Any):
        from safetensors.torch import load_file

        super().__init__(path, **kwargs)
        file = Path(mlp_file) if mlp_file is not None else self.path / AESTHETIC_FILE
        if not file.is_file():
            raise FileNotFoundError(f"aesthetic MLP not found: {file} (convert the .pth with convert_aesthetic)")
        self.mlp = aesthetic_mlp(load_file(str(file))).to(self.device)

    @torch.no_grad()
    def score(self, images: np.ndarray, prompts: Sequence[str], metadata: Sequence[Metadata] | None) -> RewardOutput:
        v = self.image_embeddings(images)
        return RewardOutput(scores=self.mlp(v).squeeze(-1).double().cpu().numpy())
