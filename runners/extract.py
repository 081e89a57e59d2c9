"""Layer-wise token covariance spectra of a ViT over a fixed probe set, in one hooked forward pass.

Observation points (timm ``VisionTransformer``), in depth order:

* ``patch_embed``: output of the patch embedding (patch tokens only, before any prefix token);
* ``pos_embed``: tokens after the positional embedding (the input of ``pos_drop``);
* ``block_01`` .. ``block_NN``: output of each transformer block;
* ``norm``: output of the final norm.

Token sets: ``all`` (every token of every probe image), ``cls`` (the class token only) and ``patch``
(patch tokens only). ``patch_embed`` has no class token, so its ``all`` equals its ``patch``.

Per (point, token set) the covariance is accumulated by streaming float64 sums of shifted activations
``y = x - k`` (``k``: the first batch's mean at that point, a shift that keeps float64 sums exact even for
activations with large means): ``n``, ``s = sum y``, ``Q = sum y y^T``; then
``C = (Q - s s^T / n) / (n - 1)``, symmetrised, ``eigh`` in float64, negative eigenvalues clipped to 0.
Memory is O(D^2) per point, independent of the number of probe images. Sums live on the model's device.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from study.errors import RunFailedError

TOKEN_SETS = ("all", "cls", "patch")


@dataclass
class _Moments:
    shift: torch.Tensor  # (D,) float64
    n: int = 0
    s: torch.Tensor | None = None  # (D,)
    q: torch.Tensor | None = None  # (D, D)

    def add(self, x: torch.Tensor) -> None:
        """x: (n_tokens, D) in any float dtype."""
        y = x.to(torch.float64) - self.shift
        s, q = y.sum(0), y.T @ y
        self.s = s if self.s is None else self.s + s
        self.q = q if self.q is None else self.q + q
        self.n += y.shape[0]

    def merged(self, other: _Moments) -> _Moments:
        return _Moments(self.shift, self.n + other.n, self.s + other.s, self.q + other.q)

    def covariance(self) -> np.ndarray:
        cov = (self.q - torch.outer(self.s, self.s) / self.n) / (self.n - 1)
        cov = 0.5 * (cov + cov.T)
        return cov.cpu().numpy()


@dataclass
class Spectra:
    """Eigenvalues per (layer, token set), descending, float64 ``(D,)``; token counts per entry."""

    eigenvalues: dict[tuple[str, str], np.ndarray] = field(default_factory=dict)
    n_tokens: dict[tuple[str, str], int] = field(default_factory=dict)


def observation_points(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module, str]]:
    """(name, module, 'pre'|'post') for each observation point of a timm VisionTransformer."""
    points = [("patch_embed", model.patch_embed, "post"), ("pos_embed", model.pos_drop, "pre")]
    points += [(f"block_{i + 1:02d}", blk, "post") for i, blk in enumerate(model.blocks)]
    points.append(("norm", model.norm, "post"))
    return points


def eigenvalues(cov: np.ndarray) -> np.ndarray:
    """Descending, clipped eigenvalues of a symmetric matrix, computed in float64."""
    lam = np.linalg.eigvalsh(np.asarray(cov, dtype=np.float64))
    return np.clip(lam[::-1], 0.0, None).copy()


@torch.no_grad()
def extract_spectra(
    model: torch.nn.Module, images: torch.Tensor, batch_size: int = 256, epoch: int | None = None
) -> Spectra:
    """Covariance spectra at every observation point and token set over a probe set.

    Args:
        model: a timm VisionTransformer (put into eval mode here, restored afterwards).
        images: (N, 3, H, W) float tensor, already normalised; moved to the model's device per batch.
        batch_size: probe images per forward pass.
        epoch: the checkpoint epoch, only for error messages.

    Raises:
        RunFailedError: an activation is NaN or Inf (names the layer and checkpoint).
    """
    device = next(model.parameters()).device
    n_prefix = int(getattr(model, "num_prefix_tokens", 1))
    has_cls = bool(getattr(model, "cls_token", None) is not None)
    moments: dict[tuple[str, str], _Moments] = {}
    shifts: dict[str, torch.Tensor] = {}

    def record(name: str, x: torch.Tensor) -> None:
        if not torch.isfinite(x).all():
            raise RunFailedError(f"non-finite activation at layer {name} (checkpoint epoch {epoch})", epoch)
        d = x.shape[-1]
        if name == "patch_embed":
            groups = {"patch": x.reshape(-1, d)}
        else:
            groups = {"patch": x[:, n_prefix:].reshape(-1, d)}
            if has_cls:
                groups["cls"] = x[:, 0]
        if name not in shifts:  # one shift per layer, shared by its token sets, so all = cls + patch
            shifts[name] = x.reshape(-1, d).to(torch.float64).mean(0)
        for tset, tokens in groups.items():
            moments.setdefault((name, tset), _Moments(shift=shifts[name])).add(tokens)

    handles = []
    for name, module, kind in observation_points(model):
        if kind == "pre":
            handles.append(module.register_forward_pre_hook(lambda m, args, name=name: record(name, args[0])))
        else:
            handles.append(module.register_forward_hook(lambda m, args, out, name=name: record(name, out)))
    was_training = model.training
    model.eval()
    try:
        for i in range(0, images.shape[0], batch_size):
            batch = images[i : i + batch_size].to(device, non_blocking=True)
            if device.type == "cuda":
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    model.forward_features(batch)
            else:
                model.forward_features(batch)
    finally:
        for h in handles:
            h.remove()
        model.train(was_training)

    out = Spectra()
    for name, _, _ in observation_points(model):
        patch = moments[(name, "patch")]
        sets = {"patch": patch}
        if (name, "cls") in moments:
            sets["cls"] = moments[(name, "cls")]
            sets["all"] = patch.merged(moments[(name, "cls")])
        else:
            sets["all"] = patch
        for tset, mom in sets.items():
            out.eigenvalues[(name, tset)] = eigenvalues(mom.covariance())
            out.n_tokens[(name, tset)] = mom.n
    return out
