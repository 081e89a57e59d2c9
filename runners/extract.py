"""Layer-wise token covariance spectra of a ViT over a fixed probe set, in one hooked forward pass.

    sp = extract_spectra(model, probe_images, batch_size=256, epoch=8, covariances=True)

Observation points (timm ``VisionTransformer``), in depth order:

* ``patch_embed``: output of the patch embedding (patch tokens only, before any prefix token);
* ``pos_embed``: tokens after the positional embedding (the input of ``pos_drop``);
* ``block_01`` .. ``block_NN``: output of each transformer block;
* ``norm``: output of the final norm.

Token sets: ``all`` (every token of every probe image), ``cls`` (the class token only) and ``patch``
(patch tokens only). ``patch_embed`` has no class token, so its ``all`` equals its ``patch``.

A CNN of residual blocks (``runners.models.residual_blocks``) is observed at ``stem`` (the stem's output),
``block_01`` .. ``block_NN`` (each residual block's output) and ``pool`` (``forward_head(...,
pre_logits=True)``: the pooled feature, one token per image). A feature map ``(B, C, H, W)`` is read as
``B H W`` tokens of ``C`` columns (its spatial positions); a CNN has no prefix tokens, so ``all`` and
``patch`` are the same tokens and there is no ``cls``.

Per point the covariance is accumulated by streaming float64 sums of shifted activations ``y = x - k``
(``k``: the first batch's mean at that point, a shift that keeps float64 sums exact even for
activations with large means): ``n``, ``s = sum y``, ``Q = sum y y^T``; then
``C = (Q - s s^T / n) / (n - 1)``, symmetrised, ``eigh`` in float64, eigenvalues below the round-off
level ``(D + n) * eps64 * max_i Q_ii / (n - 1)`` (negative ones included) set to 0.
Only two Grams are formed per batch and point: ``all`` (every token) and the prefix (the class token,
one per image); ``patch = all - prefix`` exactly, because both share the point's shift.

One batched update per forward pass, not a handful of small operator calls per point and token set (on a
GPU each is a kernel launch, and the hooked pass was host-bound at 10x a plain forward): the hooks only
keep each point's activations ``(B, T, D)``; consecutive points of one shape form a *piece*
(``_Piece``: on a ViT ``patch_embed``, then every point after it), and when a piece's last point is
reached its K activations are stacked once into a float64 buffer ``(K, B T + 1, D + 2)`` of rows
``[y, 1, |y|^2]`` (``runners.token_moments._Stacked``; the extra row is all zero, the padding of a
gather). One broadcast subtraction shifts every point, one norm call fills ``|y|^2``, and each Gram block
is one ``baddbmm`` over the K points: the Gram of the augmented rows holds ``Q`` and, in its last two
rows, ``s``, ``n``, ``u = sum y |y|^2`` and ``w = sum |y|^4`` (``_MomentBank``). The small token sets of
all K points (prefix, the class token where registers exist, the two matched subsamples) are one gather
of their rows, each set padded to a common row count with the zero row (exactly nothing added), and one
``baddbmm`` per block over all of them; the observables' sampled rows are one gather before the shift. A
batch is split at the probe-size cuts only for the Gram updates (a cut image ends a segment). Every view
the updates use is made once per layout, so a batch costs about 20 operator calls per piece (2.2-2.6
per point on ViT-S: ``bench/extract.py`` counts them). A piece is also cut where its stack would pass
``STACK_BYTES_CPU`` (``STACK_BYTES_CUDA`` on a GPU): the stack and the activations it keeps are the
memory this costs (at 16 px, batch 64, ViT-S: a 47 MB stack, peak +140 MiB against +64 before; a
smaller budget means more pieces, more calls per point and less memory).

Each Gram is symmetric, so on CPU only its lower block triangle is multiplied (``gram_blocks``: at most
``CPU_BLOCKS`` = 4 blocks, 62.5% of the float64 work of a full ``Y^T Y`` at D = 384); on a GPU one full
GEMM. Memory is O(D^2) per point (its lower block triangle) plus the stacks of a pass and a fixed token
subsample, independent of the number of probe images. Sums live on the model's device.
``_Moments.add`` (one set alone) runs the same arithmetic on a one-set bank, in chunks of at most
``CHUNK_ROWS`` rows on CPU.

Besides eigenvalues, each (point, token set) gets every observable registered in
``analysis.observables.OBSERVABLES``: those computed on the covariance (``diagonality``) from its
covariance, those computed on the sample (``cosine_anisotropy``, ``twonn_id``) from a fixed, seeded
subsample of at most ``subsample`` tokens (the same token positions at every point, drawn with
``subsample_seed``, so identical across checkpoints and runs that share the probe set).

The streamed sums are in ``runners.token_moments``; what a checkpoint writes into the run folder is in
``runners.measurement_files``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import cast

import numpy as np
import torch

from analysis.observables import compute_observables
from runners.models import residual_blocks
from runners.token_moments import (
    AUG,
    _MomentBank,
    _Moments,
    _spectrum,
    _Stacked,
    _summary,
    token_metrics,
)
from vitstudy_core.errors import RunFailedError

SUBSAMPLE = 1024  # tokens per (point, token set) for cosine anisotropy / TwoNN: O(m^2) distances stay cheap
SUBSAMPLE_SEED = 0  # fixed: every checkpoint and run that shares a probe set sees the same token positions
# float64 rows stacked per update (a piece of points, _Piece): more points per stack mean fewer operator
# calls per point, each stack also keeps its points' activations alive until it is added. On CPU 64 MiB
# takes ViT-S at 16 px in batches of 64 (1,088 tokens) in two stacks (patch_embed; the 14 points after it,
# 47 MB); on a GPU the whole pass, whatever the batch, is one stack per shape up to 1 GiB
STACK_BYTES_CPU = 64 * 2**20
STACK_BYTES_CUDA = 2**30


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


def is_cnn(model: torch.nn.Module) -> bool:
    """Whether the extraction reads ``model`` as a CNN (no ViT ``blocks`` after a ``patch_embed``)."""
    return not (hasattr(model, "patch_embed") and hasattr(model, "blocks"))


def observation_points(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module, str]]:
    """(name, module, 'pre'|'post'|'head') for each observation point of a timm VisionTransformer, or of a
    CNN of residual blocks (``pool`` is 'head': read from ``forward_head`` by :meth:`SpectralObserver.observe`,
    not hooked)."""
    if is_cnn(model):
        found = residual_blocks(model)
        if found is None:
            raise ValueError(f"{type(model).__name__} has no residual blocks to observe")
        stem, residual = found
        points = [("stem", stem, "post")]
        points += [(f"block_{i + 1:02d}", blk, "post") for i, blk in enumerate(residual)]
        return [*points, ("pool", model, "head")]
    sub = model.get_submodule  # typed nn.Module, where torch types a submodule attribute Tensor | Module
    points = [("patch_embed", sub("patch_embed"), "post"), ("pos_embed", sub("pos_drop"), "pre")]
    blocks = cast(Iterable[torch.nn.Module], sub("blocks"))  # an nn.Sequential (nn.ModuleList in Eva)
    points += [(f"block_{i + 1:02d}", blk, "post") for i, blk in enumerate(blocks)]
    points.append(("norm", sub("norm"), "post"))
    return points


class _Subsampler:
    """Fixed seeded token positions per token count, and the rows of a batch they fall on.

    Positions index the flattened ``(image, token)`` grid of one token set: ``image * T + t``. They depend
    only on (number of images, tokens per image, m, seed), so every point with the same token count, every
    checkpoint and every run on the same probe set sees the same tokens.
    """

    def __init__(self, n_images: int, m: int, seed: int):
        self.n_images, self.m, self.seed = n_images, m, seed
        self._idx: dict[int, np.ndarray] = {}
        self.parts: dict[tuple[str, str], list[torch.Tensor]] = {}  # kept empty: rows are not stored here

    def positions(self, tokens_per_image: int) -> np.ndarray:
        if tokens_per_image not in self._idx:
            total = self.n_images * tokens_per_image
            rng = np.random.default_rng([self.seed, tokens_per_image])
            self._idx[tokens_per_image] = np.sort(rng.choice(total, size=min(self.m, total), replace=False))
        return self._idx[tokens_per_image]

    def rows(self, per_image: int, offset: int, tokens: int, first: int, last: int, base: int) -> np.ndarray:
        """Rows of the drawn tokens of images ``[first, last)`` among a point's stacked tokens.

        Args:
            per_image: tokens of the token set per image (its grid is ``image * per_image + t``).
            offset: the set's first token within an image of the point (1 for ``patch`` after a class
                token, 0 else).
            tokens: tokens of the point per image (T: a row is ``image * T + offset + t``).
            first, last: the images, as probe indices.
            base: the probe index of the image in row 0.

        Returns:
            (r,) int64 row indices, ascending (in probe order, as the positions are).
        """
        pos = self.positions(per_image)
        lo, hi = np.searchsorted(pos, [first * per_image, last * per_image])
        sel = pos[lo:hi]
        return (sel // per_image - base) * tokens + offset + sel % per_image


@dataclass
class _Piece:
    """Consecutive observation points of one activation shape ``(B, T, D)``, updated together.

    The points' activations of a forward pass are kept (not copied) as each point's hook sees them, and
    when the piece's last point is reached they are stacked into float64 once and every token set's sums
    updated by batched GEMMs (:meth:`SpectralObserver._flush`). The points are grouped on the first batch:
    a run of points of one shape, cut where its float64 stack would pass the device's ``STACK_BYTES``.

    Attributes:
        names: the points, in depth order.
        n_prefix: prefix tokens per image at these points (0: no prefix, e.g. ``patch_embed``).
        small: the small token sets per point whose rows are gathered: ``prefix`` (prefix tokens), ``cls``
            (only with register tokens besides it), ``match_all``/``match_patch`` (the matched subsample).
        samples: the sampled token sets, in the order their rows are gathered (``all``, ``patch``, ``cls``).
        pending: this pass's activations ``(B, T, D)`` of the points seen so far.
        main, minor: the sums of token set ``all`` (one set per point) and of the small sets (``len(small)``
            per point, point-major); None until the first batch is added.
        capacity: rows per small set in a gather (the most any batch needed; fewer are padded with the
            zero row).
    """

    names: list[str]
    n_prefix: int
    small: list[str]
    samples: list[str]
    pending: list[torch.Tensor] = field(default_factory=list)
    shift: torch.Tensor | None = None  # (K, 1, D) float64
    main: _MomentBank | None = None
    minor: _MomentBank | None = None
    capacity: int = 0
    gathered: torch.Tensor | None = None  # (K, len(small) * capacity, D + AUG) float64: the small sets' rows
    minor_views: tuple[list[torch.Tensor], list[torch.Tensor]] | None = None


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
        model: a timm VisionTransformer, or a CNN of residual blocks.
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
        self.cnn = is_cnn(model)
        self.n_prefix = 0 if self.cnn else int(getattr(model, "num_prefix_tokens", 1))
        self.has_cls = not self.cnn and bool(getattr(model, "cls_token", None) is not None)
        self.moments: dict[tuple[str, str], _Moments] = {}
        self.sampler = _Subsampler(n_images, subsample, subsample_seed) if observables else None
        self.first_image = 0
        self.stack_bytes = STACK_BYTES_CUDA if self.device.type == "cuda" else STACK_BYTES_CPU
        self.pieces: list[_Piece] = []  # in depth order, grouped on the first batch
        self._piece_of: dict[str, tuple[_Piece, int]] = {}  # point -> (its piece, its index there)
        self._open: _Piece | None = None  # first batch: the piece still growing
        # (B T, D, device) -> (float64 buffer, piece size -> its layout): kept while the batch size stays
        self._stacks: dict[tuple[int, int, str], tuple[torch.Tensor, dict[int, _Stacked]]] = {}
        self._indices: dict[tuple, torch.Tensor] = {}  # this batch's row indices, shared by its pieces
        self._samples: list[tuple[_Piece, list[int], torch.Tensor]] = []  # (piece, rows per set, rows)
        self._batch_size = 0
        self._handles: list = []
        self._was_training = model.training

    def _record(self, name: str, x: torch.Tensor) -> None:
        """A point's hook: keep ``x: (B, T, D)`` for its piece's update (no arithmetic of its own), and
        update the piece once its last point is reached. A CNN's ``(B, C, H, W)`` is kept as the view
        ``(B, H W, C)``, its pooled ``(B, C)`` as ``(B, 1, C)``."""
        if x.dim() == 4:
            x = x.flatten(2).transpose(1, 2)
        elif x.dim() == 2:
            x = x.unsqueeze(1)
        if name in self._piece_of:  # after the first batch the pieces are fixed
            piece, j = self._piece_of[name]
            piece.pending.append(x)
            if j == len(piece.names) - 1:
                self._flush(piece)
            return
        # first batch: grow the open piece while the shape (and prefix) is the same and the stack fits
        n_prefix = self.n_prefix if name != "patch_embed" else 0
        open_ = self._open
        if open_ is not None:
            fits = self._stack_bytes(len(open_.names) + 1, x.shape) <= self.stack_bytes
            if open_.pending[0].shape != x.shape or open_.n_prefix != n_prefix or not fits:
                self._close()
        if self._open is None:
            self._open = self._new_piece(n_prefix)
            self.pieces.append(self._open)
        self._open.names.append(name)
        self._open.pending.append(x)

    @staticmethod
    def _stack_bytes(k: int, shape: torch.Size) -> int:
        """Bytes of the float64 stack of ``k`` points of activations ``shape = (B, T, D)``."""
        b, t, d = shape
        return k * (b * t + 1) * (d + AUG) * 8

    def _new_piece(self, n_prefix: int) -> _Piece:
        small = (["prefix"] + (["cls"] if self.has_cls and n_prefix > 1 else [])) if n_prefix else []
        if self.matcher is not None:  # a seeded subsample of as many tokens as images, per token set
            small += ["match_all"] + (["match_patch"] if n_prefix else [])
        samples = []
        if self.sampler is not None:
            samples = ["all"] + ((["patch"] + (["cls"] if self.has_cls else [])) if n_prefix else [])
        return _Piece(names=[], n_prefix=n_prefix, small=small, samples=samples)

    def _close(self) -> None:
        """First batch: the open piece is complete; add its points."""
        piece, self._open = self._open, None
        if piece is not None:
            for j, name in enumerate(piece.names):
                self._piece_of[name] = (piece, j)
            self._flush(piece)

    def _stacked(self, k: int, shape: torch.Size, device: torch.device) -> _Stacked:
        """The float64 stack of ``k`` points of activations ``(B, T, D)``: one buffer per ``(B T, D)``,
        sized by its largest piece, with each piece size's views made once."""
        b, t, d = shape
        key = (b * t, d, str(device))
        work, layouts = self._stacks.get(key, (None, {}))
        need = self._stack_bytes(k, shape) // 8
        if work is None or work.numel() < need:
            work, layouts = torch.empty(need, dtype=torch.float64, device=device), {}
            self._stacks[key] = (work, layouts)
        if k not in layouts:
            layouts[k] = _Stacked(k, b * t, d, work[:need])
        return layouts[k]

    def _flush(self, piece: _Piece) -> None:
        """Add this pass's activations of a piece's points to their sums, in one stacked update.

        One float64 stack ``(K, B T + 1, D + AUG)`` (:class:`_Stacked`) for the piece's K points; the
        sampled rows gathered from it (unshifted, kept as float32); then the shift and ``|y|^2`` of every
        row at once; then per segment of the batch (split at the cut images) one batched GEMM per Gram
        block for token set ``all`` and one gather plus one batched GEMM per block for all small sets
        (prefix, class token, matched subsample) of every point together."""
        xs, piece.pending = piece.pending, []
        k, shape, device = len(xs), xs[0].shape, xs[0].device
        b, t, _ = shape
        stack = self._stacked(k, shape, device)
        stack.load(xs)
        del xs  # the activations are free for the rest of the forward pass
        first = self.first_image
        if piece.main is None:
            self._start(piece, stack)
        assert piece.main is not None and piece.shift is not None  # set by _start
        if piece.samples:
            self._sample(piece, stack, t, b)
        stack.shift_and_square(piece.shift)
        edges = [first] + [c for c in self.cuts if first < c < first + b] + [first + b]
        for lo, hi in zip(edges[:-1], edges[1:], strict=True):
            whole = (lo, hi) == (first, first + b)
            lhs, rhs = (
                (stack.lhs, stack.rhs) if whole else stack.block_views((lo - first) * t, (hi - first) * t)
            )
            piece.main.update(lhs, rhs)
            for mom in piece.main.sets:
                mom.n += (hi - lo) * t
            if piece.small:
                self._gather(piece, stack, t, lo, hi)
            if hi in self.cuts:
                self._cut(piece, hi)
        # a NaN/Inf activation makes the float64 running sums non-finite: one sum over the piece's s; on
        # a GPU the check would stall the device every batch, so it waits for result()
        if device.type != "cuda" and not math.isfinite(piece.main.s.sum().item()):
            for name in piece.names:  # depth order: the first non-finite point
                self._check_finite(name)

    def _start(self, piece: _Piece, stack: _Stacked) -> None:
        """First batch of a piece: each point's shift (its first batch's mean, shared by its token sets)
        and the sums of all its token sets, entered in :attr:`moments` and :attr:`matched`."""
        shifts = stack.y.mean(1)  # (K, D) float64
        piece.shift = shifts.unsqueeze(1)
        piece.main = _MomentBank(shifts)
        n_small = len(piece.small)
        if n_small:
            piece.minor = _MomentBank(shifts.repeat_interleave(n_small, 0))
        for j, name in enumerate(piece.names):
            self.moments[(name, "all")] = piece.main.sets[j]
            for i, small in enumerate(piece.small):
                assert piece.minor is not None  # made above where there are small sets
                mom = piece.minor.sets[j * n_small + i]
                if small.startswith("match_"):
                    self.matched[(name, small.removeprefix("match_"))] = mom
                else:
                    self.moments[(name, small)] = mom

    def _sample(self, piece: _Piece, stack: _Stacked, t: int, b: int) -> None:
        """Keep the sampled rows of this batch (every point's, one gather) before they are shifted."""
        assert self.sampler is not None  # a piece has sampled sets only with observables
        first, p = self.first_image, piece.n_prefix
        layout = {"all": (t, 0), "patch": (t - p, p), "cls": (1, 0)}
        parts = [self.sampler.rows(*layout[name], t, first, first + b, first) for name in piece.samples]
        counts = [len(r) for r in parts]
        if sum(counts):
            index = self._index(
                ("sample", t, p, tuple(piece.samples), first, b), lambda: np.concatenate(parts)
            )
            rows = torch.index_select(stack.work, 1, index).float()  # exact: the rows are unshifted
            self._samples.append((piece, counts, rows))

    def _gather(self, piece: _Piece, stack: _Stacked, t: int, lo: int, hi: int) -> None:
        """Add images ``[lo, hi)`` of the batch to every small set of the piece: one gather of each set's
        rows (padded to ``piece.capacity`` with the stack's zero row), then batched GEMMs over all sets."""
        first, p = self.first_image, piece.n_prefix
        images = np.arange(lo - first, hi - first)
        parts = []
        for small in piece.small:
            if small == "prefix":
                parts.append((images[:, None] * t + np.arange(p)).ravel())
            elif small == "cls":
                parts.append(images * t)
            else:
                assert self.matcher is not None  # matched sets exist only with probe sizes
                per, off = (t, 0) if small == "match_all" else (t - p, p)
                parts.append(self.matcher.rows(per, off, t, lo, hi, first))
        need = max(len(r) for r in parts)
        if not need:  # no row of any small set in these images (a matched set alone, at patch_embed)
            return
        if need > piece.capacity or piece.gathered is None:
            piece.capacity = max(need, piece.capacity)
            n_small = len(piece.small)
            piece.gathered = torch.empty(
                stack.k,
                n_small * piece.capacity,
                stack.d + AUG,
                dtype=torch.float64,
                device=stack.work.device,
            )
            piece.minor_views = _Stacked.operands(
                piece.gathered.view(-1, piece.capacity, stack.d + AUG), stack.d
            )

        def padded() -> np.ndarray:
            index = np.full((len(parts), piece.capacity), stack.n, dtype=np.int64)  # row n: all zero
            for i, r in enumerate(parts):
                index[i, : len(r)] = r
            return index.ravel()

        key = ("small", t, p, tuple(piece.small), first, lo, hi, piece.capacity, stack.n)
        torch.index_select(stack.work, 1, self._index(key, padded), out=piece.gathered)
        assert piece.minor is not None and piece.minor_views is not None  # made with the small sets
        piece.minor.update(*piece.minor_views)
        for j in range(stack.k):
            for i, r in enumerate(parts):
                piece.minor.sets[j * len(parts) + i].n += len(r)

    def _index(self, key: tuple, make: Callable[[], np.ndarray]) -> torch.Tensor:
        """A row index of this batch on the model's device, made once for every piece that shares it."""
        if key not in self._indices:
            index = torch.from_numpy(make())
            # from pageable memory, staged at once: no wait for the device
            self._indices[key] = (
                index if self.device.type == "cpu" else index.to(self.device, non_blocking=True)
            )
        return self._indices[key]

    def _cut(self, piece: _Piece, image: int) -> None:
        """The running sums of a piece's points reached cut ``image``: with block sums, snapshot them (the
        blocks and probe fractions are read from the copies in :meth:`result`); else summarise the probe
        fractions that end here at once, so no copy of the sums lives on."""
        names = set(piece.names)
        if self.n_blocks > 1:
            for key, m in self.moments.items():
                if key[0] in names:
                    self.snapshots.setdefault(key, {})[image] = m.copy()
            return
        labels = [label for label, div in FRACTIONS.items() if self.n_images // div == image >= 2]
        if not labels:
            return
        for name in piece.names:
            # non-finite sums are not summarised (eigh of NaN): result() raises for them
            if not torch.isfinite(self.moments[(name, "all")].filled()[0]).all():
                continue
            for tset, mom in self._sets(name, self.moments.__getitem__).items():
                summary = _summary(mom)
                for label in labels:
                    self.fractions[(name, tset, label)] = summary

    def _check_finite(self, name: str) -> None:
        """RunFailedError if the running sum of point ``name`` is not finite (a NaN/Inf activation)."""
        if not torch.isfinite(self.moments[(name, "all")].filled()[0]).all():
            raise RunFailedError(
                f"non-finite activation at layer {name} (checkpoint epoch {self.epoch})", self.epoch
            )

    def _sample_of(self, name: str, tset: str) -> np.ndarray:
        """The sampled tokens ``(m, D)`` float32 of (point, token set), in probe order (a set without a
        sample of its own, ``patch`` of ``patch_embed``, has that of ``all``)."""
        piece, j = self._piece_of[name]
        i = piece.samples.index(tset if tset in piece.samples else "all")
        d = self.moments[(name, "all")].shift.shape[0]
        chunks = [
            rows[j, sum(counts[:i]) : sum(counts[: i + 1]), :d]
            for owner, counts, rows in self._samples
            if owner is piece and counts[i]
        ]
        return torch.cat(chunks).cpu().numpy() if chunks else np.zeros((0, 0), np.float32)

    def __enter__(self) -> SpectralObserver:
        for name, module, kind in observation_points(self.model):
            if kind == "head":  # fed by observe()
                continue
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
        if batch.shape[0] != self._batch_size:  # another geometry: the stacks of the last one are freed
            self._stacks, self._batch_size = {}, batch.shape[0]
        self._indices = {}
        # timm's method, which torch's typing of a Module attribute sees as Tensor | Module
        forward_features = cast(Callable[[torch.Tensor], torch.Tensor], self.model.forward_features)
        if self.device.type == "cuda":
            with torch.autocast("cuda", dtype=torch.bfloat16):
                self._forward(forward_features, batch)
        else:
            self._forward(forward_features, batch)
        self._close()  # first batch: the last piece ends with the pass
        self.first_image += batch.shape[0]

    def _forward(self, forward_features: Callable[[torch.Tensor], torch.Tensor], batch: torch.Tensor) -> None:
        features = forward_features(batch)
        if self.cnn:  # the pooled feature, as the classifier reads it
            forward_head = cast(Callable[..., torch.Tensor], self.model.forward_head)
            self._record("pool", forward_head(features, pre_logits=True))

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
                sample = self._sample_of(name, tset)
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
        model: a timm VisionTransformer or a CNN of residual blocks (put into eval mode here, restored
            afterwards).
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
