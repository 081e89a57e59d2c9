"""Layer-wise token covariance spectra of a ViT over a fixed probe set, in one hooked forward pass.

    sp = extract_spectra(model, probe_images, batch_size=256, epoch=8, covariances=True)

Observation points (timm ``VisionTransformer``), in depth order:

* ``patch_embed``: output of the patch embedding (patch tokens only, before any prefix token);
* ``pos_embed``: tokens after the positional embedding (the input of ``pos_drop``);
* ``block_01`` .. ``block_NN``: output of each transformer block;
* ``norm``: output of the final norm.

Token sets: ``all`` (every token of every probe image), ``cls`` (the class token only) and ``patch``
(patch tokens only). ``patch_embed`` has no class token, so its ``all`` equals its ``patch``.

Per point the covariance is accumulated by streaming float64 sums of shifted activations ``y = x - k``
(``k``: the first batch's mean at that point, a shift that keeps float64 sums exact even for
activations with large means): ``n``, ``s = sum y``, ``Q = sum y y^T``; then
``C = (Q - s s^T / n) / (n - 1)``, symmetrised, ``eigh`` in float64, eigenvalues below the round-off
level ``(D + n) * eps64 * max_i Q_ii / (n - 1)`` (negative ones included) set to 0.
Only two Grams are formed per batch and point: ``all`` (every token) and the prefix (the class token,
one per image); ``patch = all - prefix`` exactly, because both share the point's shift. Each Gram is
symmetric, so on CPU only its lower block triangle is multiplied (``gram_blocks``: 56% of the float64
work of a full ``Y^T Y`` at D = 384) from a float64 buffer reused by every point, filled at most
``CHUNK_ROWS`` tokens at a time on CPU (``runners.token_moments``). Memory is O(D^2) per point (its lower
block triangle) plus that chunk (a batch on a GPU) and a fixed token subsample, independent of the number
of probe images and, on CPU, of the batch size. Sums live on the model's device.

Besides eigenvalues, each (point, token set) gets every observable registered in
``analysis.observables.OBSERVABLES``: those computed on the covariance (``diagonality``) from its
covariance, those computed on the sample (``cosine_anisotropy``, ``twonn_id``) from a fixed, seeded
subsample of at most ``subsample`` tokens (the same token positions at every point, drawn with
``subsample_seed``, so identical across checkpoints and runs that share the probe set).

The streamed sums are in ``runners.token_moments``; what a checkpoint writes into the run folder is in
``runners.measurement_files``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import cast

import numpy as np
import torch

from analysis.observables import compute_observables
from runners.token_moments import _Moments, _spectrum, _summary, _Workspace, token_metrics
from vitstudy_core.errors import RunFailedError

SUBSAMPLE = 1024  # tokens per (point, token set) for cosine anisotropy / TwoNN: O(m^2) distances stay cheap
SUBSAMPLE_SEED = 0  # fixed: every checkpoint and run that shares a probe set sees the same token positions


@dataclass
class Spectra:
    """What one extraction measured.

    Attributes:
        eigenvalues: ``(layer, token_set) -> (D,)`` float64, descending, clipped at 0.
        n_tokens: ``(layer, token_set) -> tokens behind that covariance``.
        scalars: ``(layer, token_set, observable) -> value`` for ``analysis.observables.OBSERVABLES``.
        covariances: ``layer -> (D, D)`` float32 covariance of token set ``all`` (only if requested).
        n_subsample: ``(layer, token_set) -> tokens in the observables' subsample``.
        probe_sizes: ``(layer, token_set, label) -> (eigenvalues (D,), n_tokens, {metric: value})`` of
            the same covariance on a smaller probe (:func:`probe_labels`): the first 1/4 and 1/2 of the
            probe images (``images_1_4``, ``images_1_2``) and a seeded subsample of as many tokens as
            there are probe images (``tokens_matched``, only where the token set has more); the values are
            the covariance observables and token-count metrics.
        blocks: ``(layer, token_set) -> {"n": (K,), "s": (K, D), "q": (K, D, D), "u": (K, D), "w": (K,)}``
            shifted sums over K contiguous blocks of probe images (only with ``blocks``).
    """

    eigenvalues: dict[tuple[str, str], np.ndarray] = field(default_factory=dict)
    n_tokens: dict[tuple[str, str], int] = field(default_factory=dict)
    scalars: dict[tuple[str, str, str], float] = field(default_factory=dict)
    covariances: dict[str, np.ndarray] = field(default_factory=dict)
    n_subsample: dict[tuple[str, str], int] = field(default_factory=dict)
    probe_sizes: dict[tuple[str, str, str], tuple[np.ndarray, int, dict[str, float]]] = field(
        default_factory=dict
    )
    blocks: dict[tuple[str, str], dict[str, np.ndarray]] = field(default_factory=dict)


FRACTIONS = {"images_1_4": 4, "images_1_2": 2}  # label -> the probe is cut after n_images // this images
MATCHED = "tokens_matched"
MATCH_SEED = 1  # the matched token subsample's seed (fixed, like SUBSAMPLE_SEED, but a stream of its own)


def cuts(n_images: int, blocks: int) -> list[int]:
    """Image indices after which the running sums are snapshot: the probe fractions of :data:`FRACTIONS`
    and the ``blocks`` block edges ``round(n_images * k / blocks)``, k = 1..blocks-1 (sorted, unique)."""
    edges = {n_images // d for d in FRACTIONS.values()}
    edges |= {round(n_images * k / blocks) for k in range(1, blocks)} if blocks > 1 else set()
    return sorted(e for e in edges if 0 < e < n_images)


def observation_points(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module, str]]:
    """(name, module, 'pre'|'post') for each observation point of a timm VisionTransformer."""
    sub = model.get_submodule  # typed nn.Module, where torch types a submodule attribute Tensor | Module
    points = [("patch_embed", sub("patch_embed"), "post"), ("pos_embed", sub("pos_drop"), "pre")]
    blocks = cast(Iterable[torch.nn.Module], sub("blocks"))  # an nn.Sequential (nn.ModuleList in Eva)
    points += [(f"block_{i + 1:02d}", blk, "post") for i, blk in enumerate(blocks)]
    points.append(("norm", sub("norm"), "post"))
    return points


class _Subsampler:
    """Fixed seeded token positions per token count, gathered batch by batch.

    Positions index the flattened ``(image, token)`` grid of one token set: ``image * T + t``. They depend
    only on (number of images, tokens per image, m, seed), so every point with the same token count, every
    checkpoint and every run on the same probe set sees the same tokens.
    """

    def __init__(self, n_images: int, m: int, seed: int):
        self.n_images, self.m, self.seed = n_images, m, seed
        self._idx: dict[int, np.ndarray] = {}
        self._dev: dict[tuple[int, str], torch.Tensor] = {}
        # (tokens per image, device) -> (image index, token index) of the current batch's rows, or None:
        # every point of a forward pass asks for the same rows, so they are found once per batch
        self._batch: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor] | None] = {}
        self._batch_at: tuple[int, int] = (-1, -1)  # (first image, images) the cached rows belong to
        self.parts: dict[tuple[str, str], list[torch.Tensor]] = {}

    def positions(self, tokens_per_image: int) -> np.ndarray:
        if tokens_per_image not in self._idx:
            total = self.n_images * tokens_per_image
            rng = np.random.default_rng([self.seed, tokens_per_image])
            self._idx[tokens_per_image] = np.sort(rng.choice(total, size=min(self.m, total), replace=False))
        return self._idx[tokens_per_image]

    def rows(self, tokens: torch.Tensor, first_image: int) -> torch.Tensor | None:
        """The subsample's rows ``(r, D)`` among ``tokens: (B, T, D)`` of one token set for images
        ``first_image .. first_image + B - 1``, in the tokens' dtype (None: none of them is drawn).

        No host synchronisation on a GPU: the row range comes from the host's positions, and the positions
        go to the device once per token count (not per batch). The rows are gathered by (image, token)
        index from ``tokens`` as given: a token set that is a slice of the point's tokens (``patch``:
        ``x[:, 1:]``) is not copied whole first, as flattening the slice would."""
        b, t, _ = tokens.shape
        if self._batch_at != (first_image, b):
            self._batch_at, self._batch = (first_image, b), {}
        key = (t, str(tokens.device))
        if key not in self._batch:
            pos = self.positions(t)
            lo, hi = np.searchsorted(pos, [first_image * t, (first_image + b) * t])
            sel = self._on_device(t, tokens.device)[lo:hi] - first_image * t
            self._batch[key] = (sel // t, sel % t) if hi > lo else None
        index = self._batch[key]
        return None if index is None else tokens[index]

    def add(self, key: tuple[str, str], tokens: torch.Tensor, first_image: int) -> None:
        """Keep this batch's :meth:`rows` (as float32, on the tokens' device until :meth:`get`)."""
        rows = self.rows(tokens, first_image)
        if rows is not None:
            self.parts.setdefault(key, []).append(rows.float())

    def _on_device(self, tokens_per_image: int, device: torch.device) -> torch.Tensor:
        key = (tokens_per_image, str(device))
        if key not in self._dev:
            self._dev[key] = torch.as_tensor(self.positions(tokens_per_image), device=device)
        return self._dev[key]

    def get(self, key: tuple[str, str]) -> np.ndarray:
        if key not in self.parts:
            return np.zeros((0, 0), np.float32)
        return torch.cat(self.parts[key]).cpu().numpy()


class SpectralObserver:
    """Hooks on every observation point that stream each forward pass into covariance moments.

    Use as a context manager (hooks attached and eval mode set on entry, both undone on exit)::

        with SpectralObserver(model, n_images=len(images)) as obs:
            for batch in batches:          # in probe order: the subsample positions follow it
                obs.observe(batch)
        spectra = obs.result()

    ``extract_spectra`` is this loop; the benchmark drives it batch by batch to time it side by side with
    a plain forward pass.

    Args:
        model: a timm VisionTransformer.
        n_images: probe images that will be observed in total (fixes the subsample positions).
        epoch: the checkpoint epoch, only for error messages.
        covariances: also keep the float32 ``(D, D)`` covariance of token set ``all`` per point.
        subsample: at most this many tokens per (point, token set) for cosine anisotropy and TwoNN.
        subsample_seed: seed of the subsample positions.
        observables: compute ``analysis.observables`` (off: eigenvalues only).
        blocks: K >= 2: also keep the sums of K contiguous blocks of probe images (``Spectra.blocks``), from
            which any resample of blocks gives its covariance without a second pass (0: off).
        probe_sizes: also measure the smaller-probe spectra of ``Spectra.probe_sizes`` (on by default).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        n_images: int,
        epoch: int | None = None,
        covariances: bool = False,
        subsample: int = SUBSAMPLE,
        subsample_seed: int = SUBSAMPLE_SEED,
        observables: bool = True,
        blocks: int = 0,
        probe_sizes: bool = True,
    ):
        self.model, self.epoch, self.covariances = model, epoch, covariances
        self.n_images, self.n_blocks = n_images, blocks
        self.cuts = cuts(n_images, blocks) if (probe_sizes or blocks > 1) else []
        # (point, set) -> cut -> sums: copies of the running sums, kept only where block sums need them
        self.snapshots: dict[tuple[str, str], dict[int, _Moments]] = {}
        # (point, set, label) -> summary of the probe's first 1/4 and 1/2, taken at the cut (no blocks)
        self.fractions: dict[tuple[str, str, str], tuple[np.ndarray, int, dict[str, float]]] = {}
        self.matcher = _Subsampler(n_images, n_images, MATCH_SEED) if probe_sizes else None
        self.matched: dict[tuple[str, str], _Moments] = {}  # (point, set) -> the matched subsample's sums
        self.device = next(model.parameters()).device
        self.n_prefix = int(getattr(model, "num_prefix_tokens", 1))
        self.has_cls = bool(getattr(model, "cls_token", None) is not None)
        self.moments: dict[tuple[str, str], _Moments] = {}
        self.work = _Workspace()
        self.sampler = _Subsampler(n_images, subsample, subsample_seed) if observables else None
        self.first_image = 0
        self._handles: list = []
        self._was_training = model.training

    def _record(self, name: str, x: torch.Tensor) -> None:
        d = x.shape[-1]
        flat = x.reshape(-1, d)
        if (name, "all") not in self.moments:  # one shift per point, shared by its token sets
            self.moments[(name, "all")] = _Moments(shift=flat.to(torch.float64).mean(0))
        mom = self.moments[(name, "all")]
        prefixed = name != "patch_embed" and self.n_prefix > 0
        # the batch is added in segments split at the cut images, so the sums can be snapshot there
        first, b = self.first_image, x.shape[0]
        edges = [first] + [c for c in self.cuts if first < c < first + b] + [first + b]
        for lo, hi in zip(edges[:-1], edges[1:], strict=True):
            self._add(name, x[lo - first : hi - first], mom, prefixed)
            if hi in self.cuts:
                self._cut(name, hi)
        # a NaN/Inf activation makes the float64 running sum non-finite: one (D,) check, not a full pass;
        # on a GPU the check would stall the device every point and batch, so it waits for result()
        if self.device.type != "cuda":
            self._check_finite(name)
        if self.matcher is not None:  # a seeded subsample of as many tokens as images, per token set
            self._match((name, "all"), x, first, mom.shift)
            if prefixed:
                self._match((name, "patch"), x[:, self.n_prefix :], first, mom.shift)
        if self.sampler is not None:
            self.sampler.add((name, "all"), x, first)
            if prefixed:
                self.sampler.add((name, "patch"), x[:, self.n_prefix :], first)
                if self.has_cls:
                    self.sampler.add((name, "cls"), x[:, :1], first)

    def _cut(self, name: str, image: int) -> None:
        """The running sums of point ``name`` reached cut ``image``: with block sums, snapshot them (the
        blocks and probe fractions are read from the copies in :meth:`result`); else summarise the probe
        fractions that end here at once, so no copy of the sums lives on."""
        if self.n_blocks > 1:
            for key, m in self.moments.items():
                if key[0] == name:
                    self.snapshots.setdefault(key, {})[image] = m.copy()
            return
        labels = [label for label, div in FRACTIONS.items() if self.n_images // div == image >= 2]
        # non-finite sums are not summarised (eigh of NaN): result() raises for them
        if not labels or not torch.isfinite(self.moments[(name, "all")].filled()[0]).all():
            return
        for tset, mom in self._sets(name, self.moments.__getitem__).items():
            summary = _summary(mom)
            for label in labels:
                self.fractions[(name, tset, label)] = summary

    def _match(self, key: tuple[str, str], tokens: torch.Tensor, first: int, shift: torch.Tensor) -> None:
        """Stream this batch's rows of the matched subsample (``self.matcher``) into its sums for ``key``:
        one Gram triangle per (point, token set), the sample itself is never kept."""
        assert self.matcher is not None  # set with probe_sizes, the only caller's condition
        rows = self.matcher.rows(tokens, first)
        if rows is not None:
            self.matched.setdefault(key, _Moments(shift=shift)).add(rows, self.work)

    def _check_finite(self, name: str) -> None:
        """RunFailedError if the running sum of point ``name`` is not finite (a NaN/Inf activation)."""
        if not torch.isfinite(self.moments[(name, "all")].filled()[0]).all():
            raise RunFailedError(
                f"non-finite activation at layer {name} (checkpoint epoch {self.epoch})", self.epoch
            )

    def _add(self, name: str, x: torch.Tensor, mom: _Moments, prefixed: bool) -> None:
        """Add images ``x: (B, T, D)`` to the point's running sums (all tokens, prefix, class token)."""
        d = x.shape[-1]
        mom.add(x.reshape(-1, d), self.work)
        if prefixed:
            # prefix tokens (class token, plus any register tokens) are subtracted from `all` for `patch`
            pre = x[:, : self.n_prefix].reshape(-1, d)
            self.moments.setdefault((name, "prefix"), _Moments(shift=mom.shift)).add(pre, self.work)
            if self.has_cls and self.n_prefix > 1:
                self.moments.setdefault((name, "cls"), _Moments(shift=mom.shift)).add(x[:, 0], self.work)

    def __enter__(self) -> SpectralObserver:
        for name, module, kind in observation_points(self.model):
            if kind == "pre":
                hook = module.register_forward_pre_hook(
                    lambda m, args, name=name: self._record(name, args[0])
                )
            else:
                hook = module.register_forward_hook(lambda m, args, out, name=name: self._record(name, out))
            self._handles.append(hook)
        self._was_training = self.model.training
        self.model.eval()
        return self

    def __exit__(self, *exc: object) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()
        self.model.train(self._was_training)

    @torch.inference_mode()
    def observe(self, batch: torch.Tensor) -> None:
        """One forward pass of ``batch: (B, 3, H, W)`` (the next B probe images, in order)."""
        batch = batch.to(self.device, non_blocking=True)
        # timm's method, which torch's typing of a Module attribute sees as Tensor | Module
        forward_features = cast(Callable[[torch.Tensor], torch.Tensor], self.model.forward_features)
        if self.device.type == "cuda":
            with torch.autocast("cuda", dtype=torch.bfloat16):
                forward_features(batch)
        else:
            forward_features(batch)
        self.first_image += batch.shape[0]

    def _sets(self, name: str, get) -> dict[str, _Moments]:
        """Token set -> sums of one point, from ``get(key)`` of the accumulated ``all``/``prefix``/``cls``."""
        full = get((name, "all"))
        if (name, "prefix") not in self.moments:
            return {"all": full, "patch": full}  # patch_embed has no prefix token: all tokens are patches
        sets = {"all": full, "patch": full.minus(get((name, "prefix")))}
        if self.has_cls:
            sets["cls"] = get((name, "cls")) if (name, "cls") in self.moments else get((name, "prefix"))
        return sets

    def result(self) -> Spectra:
        """Covariances -> eigenvalues (and observables, smaller-probe spectra, block sums) of every
        (point, token set) seen so far."""
        out = Spectra()
        for name, _, _ in observation_points(self.model):  # depth order: the first non-finite point
            if (name, "all") in self.moments:
                self._check_finite(name)
        for name, _, _ in observation_points(self.model):
            for tset, mom in self._sets(name, self.moments.__getitem__).items():
                sums = mom.sums()
                cov, lam = _spectrum(mom, sums)
                out.eigenvalues[(name, tset)] = lam
                out.n_tokens[(name, tset)] = mom.n
                if self.covariances and tset == "all":
                    out.covariances[name] = cov.astype(np.float32)
                for metric, value in token_metrics(sums, lam).items():
                    out.scalars[(name, tset, metric)] = value
                if self.sampler is None:
                    continue
                key = (name, tset) if (name, tset) in self.sampler.parts else (name, "all")
                sample = self.sampler.get(key)
                out.n_subsample[(name, tset)] = int(sample.shape[0])
                for obs, value in compute_observables(cov, sample).items():
                    out.scalars[(name, tset, obs)] = value
            if self.matcher is not None:  # probe_sizes
                self._probe_sizes(name, out)
            if self.n_blocks > 1:
                self._blocks(name, out)
        return out

    def _probe_sizes(self, name: str, out: Spectra) -> None:
        """``Spectra.probe_sizes`` of one point: the probe's first 1/4 and 1/2 (summarised at the cut, or
        from the snapshots where block sums keep them), and the matched subsample."""
        for label, div in FRACTIONS.items():
            cut = self.n_images // div
            if cut < 2:
                continue
            if self.n_blocks > 1:
                for tset, mom in self._sets(name, lambda key, cut=cut: self.snapshots[key][cut]).items():
                    out.probe_sizes[(name, tset, label)] = _summary(mom)
                continue
            for key, summary in self.fractions.items():
                if key[0] == name and key[2] == label:
                    out.probe_sizes[key] = summary
        for tset in ("all", "patch"):
            matched = self.matched.get((name, tset) if (name, tset) in self.matched else (name, "all"))
            if matched is not None and out.n_tokens[(name, tset)] > matched.n >= 2:
                out.probe_sizes[(name, tset, MATCHED)] = _summary(matched)

    def _blocks(self, name: str, out: Spectra) -> None:
        """``Spectra.blocks`` of one point: block k's sums are the snapshots' differences at its edges."""
        edges = [round(self.n_images * k / self.n_blocks) for k in range(1, self.n_blocks)]
        empty = {key: _Moments(shift=m.shift) for key, m in self.moments.items() if key[0] == name}
        at = [lambda key: empty[key]] + [lambda key, c=c: self.snapshots[key][c] for c in edges]
        at.append(self.moments.__getitem__)
        per_block = [
            {
                t: m.minus(prev)
                for (t, m), prev in zip(
                    self._sets(name, hi).items(), self._sets(name, lo).values(), strict=True
                )
            }
            for lo, hi in zip(at[:-1], at[1:], strict=True)
        ]
        for tset in per_block[0]:
            sums = [blk[tset].sums() for blk in per_block]
            out.blocks[(name, tset)] = {k: np.stack([sm[k] for sm in sums]) for k in sums[0]}


def extract_spectra(
    model: torch.nn.Module,
    images: torch.Tensor,
    batch_size: int = 256,
    epoch: int | None = None,
    covariances: bool = False,
    subsample: int = SUBSAMPLE,
    subsample_seed: int = SUBSAMPLE_SEED,
    observables: bool = True,
    blocks: int = 0,
    probe_sizes: bool = True,
) -> Spectra:
    """Covariance spectra and observables at every observation point and token set over a probe set.

    Args:
        model: a timm VisionTransformer (put into eval mode here, restored afterwards).
        images: (N, 3, H, W) float tensor, already normalised; moved to the model's device per batch.
        batch_size: probe images per forward pass.
        epoch: the checkpoint epoch, only for error messages.
        covariances: also return the float32 ``(D, D)`` covariance of token set ``all`` per point.
        subsample: at most this many tokens per (point, token set) for cosine anisotropy and TwoNN.
        subsample_seed: seed of the subsample positions.
        observables: compute ``analysis.observables`` (off: eigenvalues only, e.g. for benchmarks).
        blocks: K >= 2: also the sums of K contiguous blocks of probe images (``Spectra.blocks``).
        probe_sizes: also the smaller-probe spectra (``Spectra.probe_sizes``).

    Raises:
        RunFailedError: an activation is NaN or Inf (names the layer and checkpoint).
    """
    observer = SpectralObserver(
        model,
        images.shape[0],
        epoch,
        covariances,
        subsample,
        subsample_seed,
        observables,
        blocks,
        probe_sizes,
    )
    with observer:
        for i in range(0, images.shape[0], batch_size):
            observer.observe(images[i : i + batch_size])
    return observer.result()
