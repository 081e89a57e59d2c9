"""The batched extraction (one stacked float64 update per piece of equal-shaped points) against float64
two-pass references of the very activations it saw, its operator calls per batch, and its NaN check."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import runners.extract as extract
from analysis.observables import diagonality
from runners.extract import MATCH_SEED, _Subsampler, extract_spectra, observation_points
from runners.models import build_model
from runners.token_moments import token_metrics
from tests.spectra.test_extract import TINY, _bench_extract, _captured, _reference_eigs
from vitstudy_core.errors import RunFailedError

N_IMAGES = 26  # cuts after images 6 (1/4), 13 (1/2) and, with 3 blocks, 9 and 17: all inside batches of 7


def _model(depth: int = 3, dim: int = 24, img: int = 12, seed: int = 0) -> torch.nn.Module:
    """A tiny ViT (patch 4: 9 patches + a class token at 12 px) whose activations have means of ~60."""
    torch.manual_seed(seed)
    model = build_model({**TINY, "embed_dim": dim, "depth": depth}, img_size=img, num_classes=5).eval()
    with torch.no_grad():
        model.pos_embed += 60.0  # large means: the shifted float64 sums must keep every digit
    return model


def _sets(name: str, acts: np.ndarray) -> dict[str, np.ndarray]:
    """Token set -> its tokens ``(N, T_set, D)`` of one point's activations ``acts: (N, T, D)``."""
    if name == "patch_embed":
        return {"all": acts, "patch": acts}
    return {"all": acts, "patch": acts[:, 1:], "cls": acts[:, :1]}


def _flat(tokens: np.ndarray) -> np.ndarray:
    return tokens.reshape(-1, tokens.shape[-1])


def _assert_eigs(lam: np.ndarray, tokens: np.ndarray, scale: float, what: object) -> None:
    """Streamed eigenvalues against the float64 two-pass ones of ``tokens: (n, D)``, to 1e-9 relative and
    1e-11 of ``scale`` (the point's largest eigenvalue) absolute: a constant set's round-off."""
    np.testing.assert_allclose(lam, _reference_eigs(tokens), rtol=1e-9, atol=1e-11 * scale, err_msg=str(what))


@pytest.mark.parametrize("batch_size", [7, 10])  # neither divides the 26 images; both put cuts inside batches
@pytest.mark.parametrize("stack_bytes", [None, 1])  # the default pieces, and one point per piece
def test_every_output_equals_the_float64_two_pass_reference(batch_size, stack_bytes, monkeypatch):
    """Eigenvalues, covariances, token-count metrics, diagonality, the probe-size spectra (first 1/4 and
    1/2, matched subsample) and the block sums of every (point, token set) equal the float64 two-pass
    values of the activations the pass streamed, however the points are grouped into pieces."""
    if stack_bytes is not None:
        monkeypatch.setattr(extract, "STACK_BYTES_CPU", stack_bytes)
    model = _model()
    x = torch.randn(N_IMAGES, 3, 12, 12, generator=torch.Generator().manual_seed(2))
    observer, sp, acts = _captured(model, x, batch_size, blocks=3, covariances=True)
    names = [p[0] for p in observation_points(model)]
    pieces = [piece.names for piece in observer.pieces]
    assert pieces == ([names[:1], names[1:]] if stack_bytes is None else [[n] for n in names])
    positions = _Subsampler(N_IMAGES, N_IMAGES, MATCH_SEED).positions
    edges = [round(N_IMAGES * k / 3) for k in range(4)]
    for name, a in acts.items():
        scale = float(_reference_eigs(_flat(a))[0])
        shift = observer.moments[(name, "all")].shift.numpy()
        for tset, tokens in _sets(name, a).items():
            flat, key = _flat(tokens), (name, tset)
            _assert_eigs(sp.eigenvalues[key], flat, scale, key)
            assert sp.n_tokens[key] == flat.shape[0]
            y = flat - shift  # the reference sums, around the same shift, in numpy's own order
            sq = (y * y).sum(1)
            sums = {"n": flat.shape[0], "s": y.sum(0), "q": y.T @ y, "u": y.T @ sq, "w": (sq * sq).sum()}
            lam_ref = _reference_eigs(flat)
            lam_ref[lam_ref <= 1e-11 * scale] = 0.0  # a constant set (pos_embed's class token): no spectrum
            for metric, value in token_metrics(sums, lam_ref).items():
                assert sp.scalars[(*key, metric)] == pytest.approx(value, rel=1e-7, nan_ok=True), (
                    key,
                    metric,
                )
            if lam_ref.any():
                ref_diag = diagonality(np.cov(flat, rowvar=False))
                assert sp.scalars[(*key, "diagonality")] == pytest.approx(ref_diag, rel=1e-8), key
            for label, cut in (("images_1_4", N_IMAGES // 4), ("images_1_2", N_IMAGES // 2)):
                lam, n, _ = sp.probe_sizes[(name, tset, label)]
                assert n == cut * tokens.shape[1]
                _assert_eigs(lam, _flat(tokens[:cut]), scale, (key, label))
            if tset != "cls":
                lam, n, _ = sp.probe_sizes[(name, tset, "tokens_matched")]
                assert n == N_IMAGES
                _assert_eigs(lam, flat[positions(tokens.shape[1])], scale, (key, "tokens_matched"))
            block = sp.blocks[key]
            for k, (lo, hi) in enumerate(zip(edges[:-1], edges[1:], strict=True)):
                n, s = block["n"][k], block["s"][k]
                assert n == (hi - lo) * tokens.shape[1]
                cov = (block["q"][k] - np.outer(s, s) / n) / (n - 1)
                lam = np.clip(np.linalg.eigvalsh(cov)[::-1], 0.0, None)
                ref = _reference_eigs(_flat(tokens[lo:hi]))
                np.testing.assert_allclose(lam, ref, rtol=1e-8, atol=1e-10 * scale, err_msg=str((key, k)))
        np.testing.assert_allclose(
            sp.covariances[name], np.cov(_flat(a), rowvar=False), rtol=1e-5, atol=1e-6 * scale
        )


def test_pieces_follow_the_stack_budget():
    """Points of one shape share a piece while their float64 stack fits ``STACK_BYTES_CPU``; the
    observer's results do not depend on the grouping to within float64 round-off."""
    model, x = _model(depth=4), torch.randn(12, 3, 12, 12)
    one = extract_spectra(model, x, batch_size=5)
    budget = extract.SpectralObserver._stack_bytes(2, torch.Size((5, 10, 24)))  # two points of a batch
    try:
        extract.STACK_BYTES_CPU, default = budget, extract.STACK_BYTES_CPU
        observer = extract.SpectralObserver(model, 12)
        with observer:
            for i in range(0, 12, 5):
                observer.observe(x[i : i + 5])
        split = observer.result()
    finally:
        extract.STACK_BYTES_CPU = default
    assert [len(p.names) for p in observer.pieces] == [1, 2, 2, 2]  # patch_embed; pos_embed .. norm
    for key, lam in one.eigenvalues.items():
        np.testing.assert_allclose(split.eigenvalues[key], lam, rtol=1e-12, atol=1e-12 * lam.max(initial=1.0))


@pytest.mark.parametrize("observables", [True, False])
def test_a_hooked_batch_makes_at_most_three_operator_calls_per_point(observables):
    """torch.profiler's count of the operator calls Python makes in one hooked batch beyond a plain
    forward's, per observation point (``bench/extract.py``'s ``operator_counts``), at ViT-S depth (15
    points) with the default extras: at most 3. The per-point updates before this counted 89 at this
    width (81 without observables) and 286 for ViT-S at 16 px."""
    bx = _bench_extract()
    model = _model(depth=12, dim=16, img=8)
    images = torch.randn(4, 3, 8, 8)
    ops = bx.operator_counts(model, images, 4, observables=observables)
    assert ops["points"] == 15
    assert ops["hooked"] > ops["plain"] > 0
    assert ops["per_point"] <= 3.0, bx.format_ops(ops)
    assert "baddbmm_" in bx.format_ops(ops)


@pytest.mark.parametrize(
    ("layer", "poison", "value"),
    [
        ("patch_embed", lambda m: m.patch_embed.proj.bias, float("nan")),
        ("block_01", lambda m: m.blocks[0].mlp.fc2.bias, float("inf")),
        ("block_03", lambda m: m.blocks[2].attn.proj.bias, float("nan")),
        ("norm", lambda m: m.norm.bias, float("nan")),
    ],
)
@pytest.mark.parametrize("stack_bytes", [None, 1])
def test_a_non_finite_activation_names_the_first_such_layer(layer, poison, value, stack_bytes, monkeypatch):
    """RunFailedError names the first non-finite point in depth order (every later point is non-finite
    too), in whichever piece it is, with cuts inside the batches and the observables on."""
    if stack_bytes is not None:
        monkeypatch.setattr(extract, "STACK_BYTES_CPU", stack_bytes)
    model = _model(depth=3)
    with torch.no_grad():
        poison(model).fill_(value)
    with pytest.raises(RunFailedError, match=rf"layer {layer} \(checkpoint epoch 7\)"):
        extract_spectra(model, torch.randn(10, 3, 12, 12), batch_size=4, epoch=7, blocks=2)
