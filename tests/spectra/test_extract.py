"""Streaming covariance spectra: exact against float64 references, hooks equal timm's intermediates."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from runners.extract import extract_spectra, observation_points
from runners.models import build_model
from runners.token_moments import _Moments, eigenvalues, gram_blocks
from vitstudy_core.errors import RunFailedError

TINY = {
    "name": "vit_small_patch16_224",
    "patch_size": 4,
    "embed_dim": 16,
    "depth": 3,
    "num_heads": 2,
    "drop_path_rate": 0.0,
}


def _reference_eigs(x: np.ndarray) -> np.ndarray:
    """Two-pass float64 covariance of x: (n, D) -> descending clipped eigenvalues."""
    x = np.asarray(x, dtype=np.float64)
    xc = x - x.mean(0)
    return eigenvalues(xc.T @ xc / (x.shape[0] - 1))


@pytest.mark.parametrize("mean", [0.0, 60.0, 1e4])
@pytest.mark.parametrize("d", [24, 97, 200])  # 1, 2 and 4 Gram blocks (gram_blocks), uneven widths
def test_streaming_moments_match_two_pass(mean, d):
    rng = np.random.default_rng(0)
    a = rng.normal(size=(d, d)) * np.linspace(0.05, 2.0, d)  # planted anisotropic covariance
    x = (rng.normal(size=(5000, d)) @ a.T + mean).astype(np.float32)
    xt = torch.from_numpy(x)
    mom = _Moments(shift=xt[:256].double().mean(0))
    for i in range(0, 5000, 256):
        mom.add(xt[i : i + 256])
    lam = eigenvalues(mom.covariance())
    ref = _reference_eigs(x)
    np.testing.assert_allclose(lam, ref, rtol=1e-8, atol=1e-10 * ref[0])


def test_block_triangle_gram_is_the_full_gram():
    """Only the lower block triangle is multiplied; mirrored, it equals the full float64 Gram."""
    cpu = torch.device("cpu")
    assert gram_blocks(24, cpu) == [(0, 24)]
    assert gram_blocks(384, cpu) == [(96 * i, 96 * (i + 1)) for i in range(4)]  # CPU_BLOCKS
    assert gram_blocks(384, torch.device("cuda")) == [(0, 384)]  # one full GEMM on a GPU
    x = torch.randn(300, 200, dtype=torch.float64)
    mom = _Moments(shift=torch.zeros(200, dtype=torch.float64))
    mom.add(x[:100])
    mom.add(x[100:])
    assert [tuple(r.shape) for r in mom.rows] == [(50, 50), (50, 100), (50, 150), (50, 200)]  # 62.5% of D^2
    torch.testing.assert_close(mom.full_q(), x.T @ x, rtol=1e-12, atol=1e-10)
    # the sums read from the augmented Gram's last rows: s, u = sum y |y|^2, w = sum |y|^4
    sq = (x * x).sum(1)
    torch.testing.assert_close(mom.s, x.sum(0), rtol=1e-12, atol=1e-10)
    torch.testing.assert_close(mom.u, x.T @ sq, rtol=1e-12, atol=1e-9)
    torch.testing.assert_close(mom.w, (sq * sq).sum(), rtol=1e-12, atol=0.0)


def test_covariance_is_the_textbook_formula_bit_for_bit():
    """The in-place covariance (only the Gram's diagonal blocks averaged with their transposes) equals
    ``0.5 (C + C^T)`` of ``C = (q - s s^T / n) / (n - 1)`` exactly, and is exactly symmetric."""
    rng = np.random.default_rng(1)
    x = torch.from_numpy((rng.normal(size=(700, 200)) * np.linspace(0.01, 3, 200) + 60).astype(np.float32))
    mom = _Moments(shift=x[:50].double().mean(0))
    mom.add(x)
    sums = mom.sums()
    c = (sums["q"] - np.outer(sums["s"], sums["s"]) / mom.n) / (mom.n - 1)
    cov = mom.covariance(sums)
    assert np.array_equal(cov, 0.5 * (c + c.T))
    assert np.array_equal(cov, cov.T)
    assert np.array_equal(mom.covariance(), cov)  # from its own sums, the same


def test_a_large_batch_is_added_in_chunks_with_a_bounded_workspace():
    """On CPU at most CHUNK_ROWS tokens are converted to float64 at a time, in equal chunks; the sums
    equal those of the tokens added in one piece to float64 accuracy."""
    from runners.token_moments import AUG, CHUNK_ROWS, _Workspace

    d, n = 64, 2 * CHUNK_ROWS + 77
    x = torch.randn(n, d) * 3 + 60
    work = _Workspace()
    mom = _Moments(shift=x[:10].double().mean(0))
    mom.add(x, work)
    assert mom.n == n
    # 3 equal chunks, not n rows (each with the zero row and the AUG columns of runners.token_moments)
    assert work._buf is not None and work._buf.numel() == (-(-n // 3) + 1) * (d + AUG)
    mom.add(x[:0], work)  # no rows: nothing added
    assert mom.n == n
    ref = x.double() - mom.shift
    torch.testing.assert_close(mom.full_q(), ref.T @ ref, rtol=1e-12, atol=1e-9)
    torch.testing.assert_close(mom.filled()[0], ref.sum(0), rtol=1e-12, atol=1e-9)
    torch.testing.assert_close(mom.filled()[3], ref.T @ (ref * ref).sum(1), rtol=1e-12, atol=1e-6)


def _model(seed=0):
    torch.manual_seed(seed)
    return build_model(TINY, img_size=8, num_classes=5).eval()


def test_hooked_points_equal_forward_intermediates():
    model = _model()
    x = torch.randn(12, 3, 8, 8)
    sp = extract_spectra(model, x, batch_size=5)  # batches of 5: streaming across uneven batches
    with torch.no_grad():
        blocks = model.forward_intermediates(
            x, indices=3, return_prefix_tokens=True, norm=False, output_fmt="NLC", intermediates_only=True
        )
        final = model.forward_features(x)
    for i, (patch, prefix) in enumerate(blocks):
        name = f"block_{i + 1:02d}"
        full = torch.cat([prefix, patch], 1)
        np.testing.assert_allclose(
            sp.eigenvalues[(name, "all")], _reference_eigs(full.reshape(-1, 16).numpy()), rtol=1e-5, atol=1e-7
        )
        np.testing.assert_allclose(
            sp.eigenvalues[(name, "cls")], _reference_eigs(prefix[:, 0].numpy()), rtol=1e-5, atol=1e-7
        )
        np.testing.assert_allclose(
            sp.eigenvalues[(name, "patch")],
            _reference_eigs(patch.reshape(-1, 16).numpy()),
            rtol=1e-5,
            atol=1e-7,
        )
    np.testing.assert_allclose(
        sp.eigenvalues[("norm", "all")], _reference_eigs(final.reshape(-1, 16).numpy()), rtol=1e-5, atol=1e-7
    )
    assert sp.n_tokens[("block_01", "all")] == 12 * 5 and sp.n_tokens[("block_01", "cls")] == 12
    assert sp.n_tokens[("patch_embed", "all")] == 12 * 4  # no class token before pos_embed
    assert [p[0] for p in observation_points(model)] == [
        "patch_embed",
        "pos_embed",
        "block_01",
        "block_02",
        "block_03",
        "norm",
    ]


def test_nan_activation_names_layer_and_checkpoint():
    model = _model()
    with torch.no_grad():
        model.blocks[1].mlp.fc2.bias.fill_(float("nan"))
    with pytest.raises(RunFailedError, match="block_02.*epoch 4"):
        extract_spectra(model, torch.randn(4, 3, 8, 8), epoch=4)


def test_observables_match_numpy_on_the_same_tokens():
    """Scalars from extraction equal analysis.observables on the stacked activations' subsample."""
    from analysis.observables import cosine_anisotropy, diagonality, twonn_id
    from runners.extract import _Subsampler

    model = _model()
    x = torch.randn(20, 3, 8, 8)
    sp = extract_spectra(model, x, batch_size=7, covariances=True, subsample=50, subsample_seed=3)
    with torch.no_grad():
        blocks = model.forward_intermediates(
            x, indices=3, return_prefix_tokens=True, norm=False, output_fmt="NLC", intermediates_only=True
        )
    patch, prefix = blocks[1]
    full = torch.cat([prefix, patch], 1).numpy()  # (20, 5, 16)
    sampler = _Subsampler(20, 50, 3)
    for tset, tokens in (("all", full), ("patch", full[:, 1:]), ("cls", full[:, :1])):
        flat = tokens.reshape(-1, 16).astype(np.float64)
        sample = flat[sampler.positions(tokens.shape[1])]
        assert sp.n_subsample[("block_02", tset)] == min(50, flat.shape[0])
        assert sp.scalars[("block_02", tset, "cosine_anisotropy")] == pytest.approx(cosine_anisotropy(sample))
        assert sp.scalars[("block_02", tset, "twonn_id")] == pytest.approx(twonn_id(sample), rel=1e-6)
        ref_cov = np.cov(flat, rowvar=False)
        assert sp.scalars[("block_02", tset, "diagonality")] == pytest.approx(diagonality(ref_cov), rel=1e-8)
    np.testing.assert_allclose(
        sp.covariances["block_02"], np.cov(full.reshape(-1, 16), rowvar=False), rtol=1e-5, atol=1e-7
    )
    assert set(sp.covariances) == {p[0] for p in observation_points(model)}
    assert sp.covariances["norm"].dtype == np.float32


def test_subsample_fixed_across_calls_and_bounded():
    model = _model()
    x = torch.randn(30, 3, 8, 8)
    a = extract_spectra(model, x, batch_size=30, subsample=40)
    b = extract_spectra(model, x, batch_size=8, subsample=40)  # other batching, same tokens
    for key, v in a.scalars.items():
        assert b.scalars[key] == pytest.approx(v, rel=1e-6, nan_ok=True), key
    assert max(a.n_subsample.values()) == 40 and a.n_subsample[("block_01", "cls")] == 30


def test_constant_token_set_gives_zero_spectrum():
    """The class token before block 1 is identical for every image: every eigenvalue is exactly 0."""
    model = _model()
    with torch.no_grad():
        model.pos_embed += 60.0  # large means: round-off must not leave a spurious eigenvalue
    sp = extract_spectra(model, torch.randn(40, 3, 8, 8), batch_size=16)
    assert not sp.eigenvalues[("pos_embed", "cls")].any()
    assert np.isnan(sp.scalars[("pos_embed", "cls", "diagonality")])
    assert sp.eigenvalues[("pos_embed", "all")].max() > 0


def _bench_extract():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "bench" / "extract.py"
    spec = importlib.util.spec_from_file_location("bench_extract", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_rank_deficient_streaming_agrees_with_two_pass_under_the_stated_rule():
    """48 nonzero eigenvalues of 384 (patch_embed at 16 px, patch 4): the float64 two-pass reference of
    ``x`` against the streaming sums of ``x`` perturbed by ~1e-7 relative (the size of float32 rounding)
    in batches of another size: every metric within 1e-6 relative, spectral_flatness (a value near
    1e-9, set by its floor) within 1e-6 absolute, as ``bench/extract.py``'s rule states."""
    from runners.token_moments import _spectrum

    bx = _bench_extract()
    rng = np.random.default_rng(3)
    w = rng.normal(size=(48, 384)) * np.linspace(0.2, 2.0, 48)[:, None]
    x = rng.normal(size=(3000, 48)) @ w + 5.0  # rank 48
    y = x * (1 + 1e-7 * rng.standard_normal(x.shape))
    mom = _Moments(shift=torch.from_numpy(y[:700].mean(0)))
    for i in range(0, len(y), 700):
        mom.add(torch.from_numpy(y[i : i + 700]))
    ours = {("patch_embed", "all"): _spectrum(mom)[1]}
    ref = {("patch_embed", "all"): _reference_eigs(x)}
    assert (ref[("patch_embed", "all")] > 0).sum() >= 48
    table, degenerate = bx.metric_errors(ours, ref)
    assert not degenerate and set(table) >= {"spectral_flatness", "effective_rank", "powerlaw_alpha"}
    flat = table["spectral_flatness"]
    assert flat["kind"] == "absolute" and flat["ref"] < 1e-6  # floor-dominated
    for name, row in table.items():
        assert row["err"] <= 1e-6, (name, row)
        assert row["kind"] == ("absolute" if name == "spectral_flatness" else "relative")
    assert "spectral_flatness" in bx.format_errors(table)


def _captured(model, x, batch_size, **kw):
    """One extraction of ``x`` and every observation point's activations ``(N, T, D)`` as it saw them."""
    from runners.extract import SpectralObserver

    store = {name: [] for name, _, _ in observation_points(model)}
    observer = SpectralObserver(model, x.shape[0], **kw)
    with observer:
        handles = []
        for name, module, kind in observation_points(model):
            if kind == "pre":
                fn = lambda m, a, name=name: store[name].append(a[0].detach().clone())  # noqa: E731
                handles.append(module.register_forward_pre_hook(fn))
            else:
                fn = lambda m, a, o, name=name: store[name].append(o.detach().clone())  # noqa: E731
                handles.append(module.register_forward_hook(fn))
        for i in range(0, x.shape[0], batch_size):
            observer.observe(x[i : i + batch_size])
        for h in handles:
            h.remove()
    return observer, observer.result(), {k: torch.cat(v).double().numpy() for k, v in store.items()}


def _assert_summary_close(got, ref, key):
    lam, n, values = got
    lam_ref, n_ref, values_ref = ref
    assert n == n_ref, key
    np.testing.assert_allclose(lam, lam_ref, rtol=1e-9, atol=1e-12 * lam_ref[0], err_msg=str(key))
    assert values.keys() == values_ref.keys(), key
    for name, v in values.items():
        assert v == pytest.approx(values_ref[name], rel=1e-9, abs=1e-12, nan_ok=True), (key, name)


def test_probe_sizes_are_the_sums_of_their_tokens():
    """The matched subsample's streamed sums give the summary of the stacked sample (the seeded
    positions, ``_Moments.of_sample``), nothing of it kept; the first 1/4 and 1/2, taken at the cut, give
    the summary of sums over exactly those images' tokens (in the same segments): bitwise for ``all``,
    whose batched GEMMs see the same rows; within round-off for the sets from the prefix sums (``cls``,
    ``patch = all - prefix``), whose rows the observer gathers padded with zero rows, so its GEMM sums
    over more (zero) terms (measured 1e-13 of the largest eigenvalue, 4e-14 relative for diagonality);
    and bitwise the one from snapshot copies."""
    from runners.extract import MATCH_SEED, _Subsampler
    from runners.token_moments import _summary

    model = _model()
    x = torch.randn(22, 3, 8, 8)  # cuts after images 5 and 11, both inside batches of 4
    observer, sp, acts = _captured(model, x, batch_size=4)
    assert not observer.snapshots and observer.matcher is not None and not observer.matcher.parts
    positions = _Subsampler(22, 22, MATCH_SEED).positions
    for name, a in acts.items():
        sets = {"all": a} if name == "patch_embed" else {"all": a, "patch": a[:, 1:]}
        for tset, tokens in sets.items():
            flat = tokens.reshape(-1, tokens.shape[-1])
            ref = _summary(_Moments.of_sample(flat[positions(tokens.shape[1])]))
            _assert_summary_close(sp.probe_sizes[(name, tset, "tokens_matched")], ref, (name, tset))
            assert ref[1] == 22
        for label, segments in (("images_1_4", (4, 5)), ("images_1_2", (4, 5, 8, 11))):
            # exactly those images, in the segments the observer added (batches of 4 split at the cuts)
            ref = {t: _Moments(shift=observer.moments[(name, "all")].shift) for t in ("all", "prefix")}
            for lo, hi in zip((0, *segments[:-1]), segments, strict=True):
                ref["all"].add(torch.from_numpy(a[lo:hi].reshape(-1, a.shape[-1])))
                ref["prefix"].add(torch.from_numpy(a[lo:hi, :1].reshape(-1, a.shape[-1])))
            moms = {"all": ref["all"], "patch": ref["all"]}
            if name != "patch_embed":
                moms.update(patch=ref["all"].minus(ref["prefix"]), cls=ref["prefix"])
            for tset, mom in moms.items():
                (lam, n, values), (lam_r, n_r, values_r) = sp.probe_sizes[(name, tset, label)], _summary(mom)
                assert n == n_r == segments[-1] * (a.shape[1] if tset == "all" else 1 if tset == "cls" else 4)
                assert values.keys() == values_r.keys(), (name, tset, label)
                if tset == "all":
                    assert np.array_equal(lam, lam_r), (name, tset, label)
                    for k, v in values.items():
                        assert v == values_r[k] or (np.isnan(v) and np.isnan(values_r[k])), (name, label, k)
                    continue
                np.testing.assert_allclose(
                    lam, lam_r, rtol=0, atol=1e-12 * lam_r[0], err_msg=f"{name} {tset} {label}"
                )
                for k, v in values.items():  # the bias-corrected PR of 5 near-constant class tokens: 6e-8
                    assert v == pytest.approx(values_r[k], rel=1e-7, nan_ok=True), (name, tset, label, k)
    # with block sums the fractions come from snapshot copies of the same running sums: the same bits
    with_blocks = extract_spectra(model, x, batch_size=4, blocks=2)  # block edge 11: the same cuts
    for key, (lam, n, values) in sp.probe_sizes.items():
        lam_b, n_b, values_b = with_blocks.probe_sizes[key]
        if key[2] != "tokens_matched":
            assert n == n_b and np.array_equal(lam, lam_b), key
            assert all(v == values_b[k] or (np.isnan(v) and np.isnan(values_b[k])) for k, v in values.items())
    assert with_blocks.probe_sizes.keys() == sp.probe_sizes.keys()
    assert list(with_blocks.probe_sizes) == list(sp.probe_sizes)  # same order


def test_the_side_by_side_benchmark_times_both_extractions_on_a_tiny_model():
    """``bench/extract.py --side-by-side``'s phase, small: a plain forward and both extractions timed."""
    import argparse

    bx = _bench_extract()
    args = argparse.Namespace(
        threads=0, offset=60.0, img_size=8, patch_size=4, images=12, batch_size=4, blocks=0,
        arch={"embed_dim": 32, "depth": 2, "num_heads": 2},
    )  # fmt: skip
    got = bx.phase_side_by_side(args)
    assert set(got) == {"t_plain", "t_without", "t_with"} and min(got.values()) > 0
