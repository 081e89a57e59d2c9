"""Benchmark: streaming spectral extraction against a plain forward pass and against the naive approach.

    PYTHONPATH=. python bench/extract.py                        # ViT-Small width, >= 1e5 probe tokens
    PYTHONPATH=. python bench/extract.py --img-size 224 --patch-size 16   # ViT-S/16 as the papers run it
    PYTHONPATH=. python bench/extract.py --naive one-pass       # the fast, memory-hungry naive variant
    PYTHONPATH=. python bench/extract.py --images 512           # a quick smoke run (fewer tokens)
    PYTHONPATH=. python bench/extract.py --side-by-side         # with and without the probe-size extras
    PYTHONPATH=. python bench/extract.py --overhead             # operator calls, time and memory over a plain forward

Model: timm ``vit_small_patch16_224`` at ViT-Small width (D = 384, 12 blocks, 6 heads), by default on
16x16 images with patch 4 (16 patches + 1 class token = 17 tokens per image: attention is negligible, so
the forward pass is at its cheapest per token and the extraction's relative overhead at its largest),
random init, eval mode, float32 on CPU (or bf16 autocast on a GPU). ``--img-size``/``--patch-size`` set
another geometry; ``--images`` defaults to the fewest images that give 100,000 probe tokens, ``--batch-size``
to 64 images. ``--offset 60`` (default) adds 60 to the positional embedding, so every token from
``pos_embed`` on carries a mean of about 60 in each dimension through the residual stream: the regime
where raw float32 moments lose digits.

What is measured, side by side in one process, on the same probe tensor:

1. **overhead** = (time of the hooked streaming extraction, eigenvalues of all 15 points x 3 token sets
   included) / (time of a plain ``forward_features`` over the same probe). The two are interleaved batch
   by batch (plain forward of batch i, then the hooked forward of batch i), so a change in machine load
   hits both equally.
2. **naive**: layer by layer, a forward pass whose hook copies that layer's activations out, then the
   tokens of each token set are stacked into an ``(n, D)`` matrix, ``np.cov`` (float64, two-pass) and
   ``np.linalg.eigvalsh``; only one layer's stack is alive at a time (the default, ``--naive per-layer``:
   one forward pass per observation point). ``--naive one-pass`` instead keeps every layer's stack from a
   single forward pass (fast, but its memory holds all 15 layers at once). ``naive_speedup`` = naive
   time / streaming time; ``naive_memory`` = naive peak / streaming peak, where a peak is the largest
   resident-set size (sampled every 2 ms from ``/proc/self/statm``) above the resident size just before
   that phase started. Each of the two phases runs in its own fresh (spawned) process that first builds
   the same model and probe and runs one warm-up batch, so neither inherits the other's allocator state;
   both children run with ``MALLOC_MMAP_THRESHOLD_=1048576`` so that resident size tracks live memory
   (see ``_in_child``).
3. **max_rel_err**: every eigenvalue metric of ``analysis.spectral`` on our eigenvalues against the same
   metric on the naive float64 two-pass eigenvalues of the identical stacked activations, max over
   metrics, points and token sets of ``|ours - ref| / |ref|`` (``spectral_flatness``: ``|ours - ref|``,
   see ``ABSOLUTE_METRICS``); the per-metric table (``metric_errors``) is printed above it.

4. **operator calls** (every mode prints them first): torch.profiler's count of the torch operator calls
   that Python makes (``aten::`` events with no ``aten::`` event above them: views included, the kernels
   inside one call not) in one plain forward of a batch and in one hooked batch (``observer.observe``,
   a batch with no probe-size cut, after two warm-up batches), with the default observer (probe sizes
   and observables on), and ``per_point`` = (hooked - plain) / observation points. A count does not
   depend on the device or the load, so it says on a CPU how many small kernels a GPU would launch
   (``operator_counts``); the calls inside them (``aten::`` events at any depth) are printed beside it.

``--overhead`` prints, side by side, those operator calls, the CPU (or GPU) time of the hooked passes and
``result()`` over the plain forward's (interleaved batch by batch, with the default extras), and the peak
resident memory of the extraction above that of the plain forward alone (each phase's peak above its own
start, ``--stack-mib`` sets ``runners.extract.STACK_BYTES_CPU`` in the children: the float64 stack per
update, which trades memory for operator calls).

The last line printed is machine-readable:
``overhead=<x> naive_speedup=<x> naive_memory=<x> max_rel_err=<x>``
(``--overhead``: ``ops_per_point=<x> overhead=<x> peak_mib=<x> plain_peak_mib=<x>``).
"""

from __future__ import annotations

import argparse
import os
import threading
import time

import numpy as np
import timm
import torch

from analysis.spectral import METRICS, compute_metrics
from runners.extract import SpectralObserver, observation_points
from runners.token_moments import eigenvalues

PAGE = os.sysconf("SC_PAGE_SIZE")


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


class PeakRSS:
    """Largest resident-set size above the value at entry, sampled every ``interval`` seconds."""

    def __init__(self, interval: float = 0.002):
        self.interval, self.peak, self._stop = interval, 0, threading.Event()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, rss_bytes() - self.base)
            time.sleep(self.interval)

    def __enter__(self) -> PeakRSS:
        self.base = rss_bytes()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss_bytes() - self.base)


def build(
    offset: float, device: torch.device, img_size: int, patch_size: int, **arch: int
) -> torch.nn.Module:
    """ViT-Small (or ``arch`` overrides: embed_dim, depth, num_heads), random init, pos_embed + offset."""
    torch.manual_seed(0)
    model = timm.create_model(
        "vit_small_patch16_224",
        pretrained=False,
        img_size=img_size,
        patch_size=patch_size,
        num_classes=0,
        **arch,
    )
    with torch.no_grad():
        model.pos_embed += offset
    return model.to(device).eval()


def naive_spectra(
    model: torch.nn.Module, images: torch.Tensor, batch_size: int, per_layer: bool
) -> dict[tuple[str, str], np.ndarray]:
    """Stack activations, then np.cov + eigvalsh per (layer, token set), layer by layer."""
    points = observation_points(model)
    out: dict[tuple[str, str], np.ndarray] = {}

    def collect(selected: list[tuple[str, torch.nn.Module, str]]) -> dict[str, list[np.ndarray]]:
        store: dict[str, list[np.ndarray]] = {name: [] for name, _, _ in selected}
        handles = []
        for name, module, kind in selected:
            if kind == "pre":
                fn = lambda m, a, name=name: store[name].append(a[0].float().cpu().numpy().copy())  # noqa: E731
                handles.append(module.register_forward_pre_hook(fn))
            else:
                fn = lambda m, a, o, name=name: store[name].append(o.float().cpu().numpy().copy())  # noqa: E731
                handles.append(module.register_forward_hook(fn))
        with torch.inference_mode():
            for i in range(0, images.shape[0], batch_size):
                model.forward_features(images[i : i + batch_size])
        for h in handles:
            h.remove()
        return store

    def decompose(name: str, acts: list[np.ndarray]) -> None:
        x = np.concatenate(acts)  # (N, T, D)
        sets = {"all": x.reshape(-1, x.shape[-1])}
        if name == "patch_embed":
            sets["patch"] = sets["all"]
        else:
            sets["cls"], sets["patch"] = x[:, 0], x[:, 1:].reshape(-1, x.shape[-1])
        for tset, mat in sets.items():
            out[(name, tset)] = eigenvalues(np.cov(mat, rowvar=False))

    if per_layer:
        for point in points:
            store = collect([point])
            decompose(point[0], store.pop(point[0]))
    else:
        store = collect(points)
        for name, _, _ in points:
            decompose(name, store.pop(name))  # pop: each layer's stack is freed once decomposed
    return out


def _setup(args: argparse.Namespace) -> tuple[torch.nn.Module, torch.Tensor, torch.device]:
    if getattr(args, "stack_mib", 0):  # in the child that runs the phase: the observer reads it when built
        import runners.extract

        runners.extract.STACK_BYTES_CPU = int(args.stack_mib * 2**20)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = build(args.offset, device, args.img_size, args.patch_size, **getattr(args, "arch", {}))
    shape = (args.images, 3, args.img_size, args.img_size)
    images = torch.randn(*shape, generator=torch.Generator().manual_seed(1)).to(device)
    with torch.inference_mode():  # warm-up: allocator, kernels, BLAS threads (before any memory baseline)
        model.forward_features(images[: args.batch_size])
    return model, images, device


def phase_streaming(args: argparse.Namespace) -> dict:
    """Plain forward and hooked streaming extraction, interleaved batch by batch (in a fresh process).

    ``t_stream`` is the hooked forward passes plus ``observer.result()`` (covariances, eigenvalues, and
    with ``args.observables`` the subsampled observables), ``t_result`` that last part alone: a fixed
    cost per extraction, which a larger probe amortises, where ``t_stream - t_result`` grows with it.
    """
    model, images, device = _setup(args)

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()

    t_plain = t_stream = 0.0
    observer = SpectralObserver(
        model,
        args.images,
        observables=getattr(args, "observables", False),
        blocks=args.blocks,
        probe_sizes=not args.no_probe_sizes,
    )
    with PeakRSS() as mem:
        for i in range(0, args.images, args.batch_size):
            batch = images[i : i + args.batch_size]
            sync()
            t0 = time.perf_counter()
            with torch.inference_mode():
                model.forward_features(batch)
            sync()
            t1 = time.perf_counter()
            with observer:
                observer.observe(batch)
            sync()
            t_plain += t1 - t0
            t_stream += time.perf_counter() - t1
        t0 = time.perf_counter()
        eig = observer.result().eigenvalues
        t_result = time.perf_counter() - t0
        t_stream += t_result
    return {
        "t_plain": t_plain,
        "t_stream": t_stream,
        "t_result": t_result,
        "peak": mem.peak,
        "eig": eig,
        "device": str(device),
    }


def _python_calls(fn) -> tuple[int, int, dict[str, int]]:
    """Run ``fn()`` under torch.profiler: (operator calls made by Python, ``aten::`` calls at any depth,
    the first per operator name). A call made by Python is an ``aten::`` event with no ``aten::`` event
    above it (views count; the calls one operator makes inside itself do not)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    top: dict[str, int] = {}
    every = 0
    for event in prof.events():
        if not event.name.startswith("aten::"):
            continue
        every += 1
        parent = event.cpu_parent
        while parent is not None and not parent.name.startswith("aten::"):
            parent = parent.cpu_parent
        if parent is None:
            top[event.name] = top.get(event.name, 0) + 1
    return sum(top.values()), every, top


def operator_counts(
    model: torch.nn.Module, images: torch.Tensor, batch_size: int, **observer_kw: object
) -> dict:
    """Torch operator calls of one plain forward of a batch and of one hooked batch (module docstring, 4).

    The observer sees a probe of 8 batches (its cuts after batches 2 and 4); batches 0 and 1 warm it up
    (its first batch lays out the stacks, the second ends at a cut), batch 2 is counted: a batch that no
    cut splits or ends, as most batches of a probe are.

    Args:
        images: (>= batch_size, 3, H, W); the first batch_size images are reused for every batch.

    Returns:
        ``{"plain", "hooked", "points", "per_point", "plain_all", "hooked_all", "extra_by_op"}``: calls
        made by Python, per batch; ``per_point`` = (hooked - plain) / points; ``*_all``: ``aten::`` calls
        at any depth; ``extra_by_op``: the hooked batch's calls beyond the plain forward's, per operator.
    """
    batch = images[:batch_size]
    with torch.inference_mode():
        model.forward_features(batch)  # warm-up
        plain, plain_all, plain_ops = _python_calls(lambda: model.forward_features(batch))
    observer = SpectralObserver(model, 8 * batch_size, **observer_kw)
    with observer:
        observer.observe(batch)
        observer.observe(batch)
        hooked, hooked_all, hooked_ops = _python_calls(lambda: observer.observe(batch))
    points = len(observation_points(model))
    extra = {k: v - plain_ops.get(k, 0) for k, v in hooked_ops.items() if v != plain_ops.get(k, 0)}
    return {
        "plain": plain,
        "hooked": hooked,
        "points": points,
        "per_point": (hooked - plain) / points,
        "plain_all": plain_all,
        "hooked_all": hooked_all,
        "extra_by_op": dict(sorted(extra.items(), key=lambda kv: -kv[1])),
    }


def phase_ops(args: argparse.Namespace) -> dict:
    """:func:`operator_counts` of the benchmark's model (in a fresh process): with the observer as the
    benchmark times it (``"timed"``: no observables, probe sizes unless ``--no-probe-sizes``) and as
    ``extract_spectra`` runs it by default (``"default"``: observables and probe sizes on)."""
    model, images, _ = _setup(args)
    timed = {"observables": False, "probe_sizes": not args.no_probe_sizes, "blocks": args.blocks}
    return {
        "timed": operator_counts(model, images, args.batch_size, **timed),
        "default": operator_counts(model, images, args.batch_size),
    }


def format_ops(ops: dict) -> str:
    """:func:`operator_counts` as two lines of text."""
    by_op = ", ".join(f"{name.removeprefix('aten::')} {n}" for name, n in ops["extra_by_op"].items())
    return (
        f"operator calls per batch: plain forward {ops['plain']}, hooked {ops['hooked']} "
        f"(+{ops['hooked'] - ops['plain']}), per point {ops['per_point']:.2f} over {ops['points']} points; "
        f"at any depth {ops['plain_all']} vs {ops['hooked_all']}\n  extra calls by operator: {by_op}"
    )


def phase_overhead(args: argparse.Namespace) -> dict:
    """The plain forward's own peak over the probe, then :func:`phase_streaming` with the default extras,
    in one fresh process (each peak above the resident size at its own start)."""
    model, images, device = _setup(args)
    with PeakRSS() as plain_mem, torch.inference_mode():
        for i in range(0, args.images, args.batch_size):
            model.forward_features(images[i : i + args.batch_size])
    del model, images
    return {**phase_streaming(args), "plain_peak": plain_mem.peak}


def phase_side_by_side(args: argparse.Namespace) -> dict:
    """A plain forward and two hooked streaming extractions, without and with the probe-size extras,
    interleaved batch by batch in one fresh process (the two extractions' order alternates between
    batches), so that a change in machine speed, which moved the plain forward by 20% between separate
    runs on the 2-core machine, hits all three alike. Times only: the two observers' memory is held at
    once, so peaks come from separate runs."""
    model, images, _ = _setup(args)
    observers = {
        extras: SpectralObserver(
            model, args.images, observables=False, blocks=args.blocks, probe_sizes=extras
        )
        for extras in (False, True)
    }
    t = {"plain": 0.0, False: 0.0, True: 0.0}
    for k, i in enumerate(range(0, args.images, args.batch_size)):
        batch = images[i : i + args.batch_size]
        t0 = time.perf_counter()
        with torch.inference_mode():
            model.forward_features(batch)
        t["plain"] += time.perf_counter() - t0
        for extras in (False, True) if k % 2 == 0 else (True, False):
            t0 = time.perf_counter()
            with observers[extras]:
                observers[extras].observe(batch)
            t[extras] += time.perf_counter() - t0
    for extras, observer in observers.items():
        t0 = time.perf_counter()
        observer.result()
        t[extras] += time.perf_counter() - t0
    return {"t_plain": t["plain"], "t_without": t[False], "t_with": t[True]}


def _two_pass(x: torch.Tensor) -> np.ndarray:
    """Eigenvalues of the float64 two-pass covariance of ``x: (n, D)`` (centred on its mean, then the
    Gram), on ``x``'s device; a token set whose rows are all identical has none (all zero)."""
    if bool((x == x[0]).all()):
        return np.zeros(x.shape[-1])
    x = x.to(torch.float64)
    xc = x - x.mean(0)
    return eigenvalues(((xc.T @ xc) / (x.shape[0] - 1)).cpu().numpy())


def captured_pass(
    model: torch.nn.Module, images: torch.Tensor, batch_size: int, **observer_kw: object
) -> tuple[dict[tuple[str, str], np.ndarray], dict[tuple[str, str], np.ndarray]]:
    """One streaming extraction whose forward passes also keep every observation point's activations.

    The capture hooks sit on the same modules as the observer's, registered after them, so they receive
    the very tensors the observer streamed (bf16 where autocast made them bf16): the reference sees the
    same numbers, and only the accumulation differs.

    Returns:
        (streaming eigenvalues, float64 two-pass reference eigenvalues of the captured activations), each
        ``(point, token set) -> (D,)``.
    """
    store: dict[str, list[torch.Tensor]] = {name: [] for name, _, _ in observation_points(model)}
    observer = SpectralObserver(model, images.shape[0], **observer_kw)
    with observer:
        handles = []
        for name, module, kind in observation_points(model):
            if kind == "pre":
                fn = lambda m, a, name=name: store[name].append(a[0].detach())  # noqa: E731
                handles.append(module.register_forward_pre_hook(fn))
            else:
                fn = lambda m, a, o, name=name: store[name].append(o.detach())  # noqa: E731
                handles.append(module.register_forward_hook(fn))
        try:
            for i in range(0, images.shape[0], batch_size):
                observer.observe(images[i : i + batch_size])
        finally:
            for h in handles:
                h.remove()
    ours = observer.result().eigenvalues
    ref: dict[tuple[str, str], np.ndarray] = {}
    for name, acts in store.items():
        x = torch.cat(acts)  # (N, T, D)
        d = x.shape[-1]
        ref[(name, "all")] = _two_pass(x.reshape(-1, d))
        if name == "patch_embed":
            ref[(name, "patch")] = ref[(name, "all")]
        else:
            ref[(name, "cls")] = _two_pass(x[:, 0])
            ref[(name, "patch")] = _two_pass(x[:, 1:].reshape(-1, d))
        store[name] = []  # free each point's activations once its reference is computed
    return ours, ref


def profile_extraction(
    model: torch.nn.Module, images: torch.Tensor, batch_size: int, rows: int = 20, **observer_kw: object
) -> str:
    """torch.profiler's table of the ``rows`` ops with the most self time (device time on CUDA, else
    CPU) over one streaming extraction of ``images`` (hooked forward passes and ``result()``)."""
    from torch.profiler import ProfilerActivity, profile

    cuda = images.device.type == "cuda"
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    observer = SpectralObserver(model, images.shape[0], **observer_kw)
    with profile(activities=acts) as prof:
        with observer:
            for i in range(0, images.shape[0], batch_size):
                observer.observe(images[i : i + batch_size])
        observer.result()
        if cuda:
            torch.cuda.synchronize()
    key = "self_cuda_time_total" if cuda else "self_cpu_time_total"
    return prof.key_averages().table(sort_by=key, row_limit=rows, max_name_column_width=48)


def phase_naive(args: argparse.Namespace) -> dict:
    """The naive approach (in a fresh process, so its memory peak starts from the same state)."""
    model, images, _ = _setup(args)
    with PeakRSS() as mem:
        t0 = time.perf_counter()
        eig = naive_spectra(model, images, args.batch_size, per_layer=args.naive == "per-layer")
        t_naive = time.perf_counter() - t0
    return {"t_naive": t_naive, "peak": mem.peak, "eig": eig}


def _in_child(fn, args: argparse.Namespace) -> dict:
    import multiprocessing as mp

    # glibc keeps freed buffers below its (dynamic, up to 32 MiB) mmap threshold in the heap, so resident
    # size grew with the number of batches (measured: +92 MiB at 1,024 images, +244 at 3,000, +453 at
    # 5,900) although live memory does not; with a fixed 1 MiB threshold every large buffer is returned on
    # free and the streaming peak stayed at +112 MiB for both 1,024 and 3,000 images. Same for both phases.
    os.environ.setdefault("MALLOC_MMAP_THRESHOLD_", str(2**20))

    with mp.get_context("spawn").Pool(1) as pool:
        return pool.apply(fn, (args,))


# Agreement rule of every comparison of two computations of the same spectra: relative error, except for
# spectral_flatness, compared by absolute error. Its values lie in (0, 1]; near 0 (a rank-deficient
# spectrum, e.g. patch_embed with 48 input values per token in D = 384, ~1e-9) they are set by the
# eigenvalues at the floor (analysis.spectral.FLATNESS_FLOOR), whose relative accuracy is that of the
# smallest eigenvalues, not of the metric: a relative error there says nothing about the extraction.
ABSOLUTE_METRICS = frozenset({"spectral_flatness"})
TOLERANCE = 1e-6  # relative (absolute for ABSOLUTE_METRICS)


def metric_errors(
    ours: dict[tuple[str, str], np.ndarray], ref: dict[tuple[str, str], np.ndarray]
) -> tuple[dict[str, dict], list[str]]:
    """Every eigenvalue metric of ``analysis.spectral`` on ``ours`` against the same metric on ``ref``.

    Args:
        ours, ref: eigenvalues (D,) per (point, token set); ``ref`` from the float64 two-pass path.

    Returns:
        ``{metric: {"err", "kind" ("relative" | "absolute"), "tol", "at", "ours", "ref"}}``: per metric
        its largest error over points and token sets (relative ``|ours - ref| / |ref|``, absolute for
        :data:`ABSOLUTE_METRICS`) and where; and the token sets skipped because their reference spectrum
        is all zero (no variance at all).
    """
    table = {
        name: {"err": 0.0, "kind": "absolute" if name in ABSOLUTE_METRICS else "relative", "tol": TOLERANCE}
        for name in METRICS
    }
    degenerate = []
    for key, lam_ref in ref.items():
        if not lam_ref.any():  # a constant token set (the class token before block 1): no spectrum at all
            degenerate.append(
                f"{key[0]}/{key[1]} (ours: {'all zero' if not ours[key].any() else 'NOT zero'})"
            )
            continue
        m_ours, m_ref = compute_metrics(ours[key]), compute_metrics(lam_ref)
        for name, row in table.items():
            a, b = m_ours[name], m_ref[name]
            err = abs(a - b) if (b == 0 or name in ABSOLUTE_METRICS) else abs(a - b) / abs(b)
            if not np.isfinite(err):
                err = 0.0 if (np.isnan(a) and np.isnan(b)) else float("inf")
            if err > row["err"] or "at" not in row:
                row.update(err=err, at=f"{key[0]}/{key[1]}", ours=a, ref=b)
    return table, degenerate


def metric_agreement(
    ours: dict[tuple[str, str], np.ndarray], ref: dict[tuple[str, str], np.ndarray]
) -> tuple[float, str, list[str]]:
    """The worst entry of :func:`metric_errors` relative to its tolerance: (its error, where, the skipped
    token sets)."""
    table, degenerate = metric_errors(ours, ref)
    name = max(table, key=lambda n: table[n]["err"] / table[n]["tol"])
    row = table[name]
    where = f"{name} ({row['kind']}) at {row.get('at')} ({row.get('ours')!r} vs {row.get('ref')!r})"
    return row["err"], where, degenerate


def format_errors(table: dict[str, dict]) -> str:
    """The per-metric table of :func:`metric_errors` as text, one metric a line."""
    lines = [f"{'metric':<22} {'error':>9} {'kind':<8} {'tol':>7}  ok  worst at"]
    for name, row in table.items():
        ok = "yes" if row["err"] <= row["tol"] else "NO"
        lines.append(
            f"{name:<22} {row['err']:>9.2e} {row['kind']:<8} {row['tol']:>7.0e}  {ok:<3} {row.get('at', '-')}"
        )
    return "\n".join(lines)


def _print_overhead(args: argparse.Namespace, ops: dict) -> None:
    """--overhead: the default extraction's calls, time and peak memory beside a plain forward's."""
    res = _in_child(phase_overhead, args)
    t_plain, t_stream = res["t_plain"], res["t_stream"]
    peak, plain_peak = res["peak"] / 2**20, res["plain_peak"] / 2**20
    print(f"plain forward:        {t_plain:8.2f} s  peak +{plain_peak:.0f} MiB")
    print(f"hooked extraction:    {t_stream:8.2f} s  peak +{peak:.0f} MiB (result() {res['t_result']:.2f} s)")
    print(
        f"side by side: operator calls {ops['hooked']} vs {ops['plain']} per batch "
        f"({ops['per_point']:.2f} per point); time {t_stream / t_plain:.3f}x; "
        f"peak memory +{peak:.0f} vs +{plain_peak:.0f} MiB (+{peak - plain_peak:.0f} MiB)"
    )
    print(
        f"ops_per_point={ops['per_point']:.2f} overhead={t_stream / t_plain:.3f} "
        f"peak_mib={peak:.0f} plain_peak_mib={plain_peak:.0f}"
    )


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--img-size", type=int, default=16)
    ap.add_argument("--patch-size", type=int, default=4)
    ap.add_argument("--images", type=int, default=0, help="probe images (0: the fewest for 1e5 tokens)")
    ap.add_argument("--batch-size", type=int, default=64, help="probe images per forward pass")
    ap.add_argument("--offset", type=float, default=60.0, help="added to pos_embed: large activation means")
    ap.add_argument("--naive", choices=["per-layer", "one-pass"], default="per-layer")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch default)")
    ap.add_argument(
        "--embed-dim", type=int, default=0, help="width D (0: ViT-Small's 384; heads D // 64 or 4)"
    )
    ap.add_argument("--blocks", type=int, default=0, help="also keep K image-block sums (probe.blocks)")
    ap.add_argument("--no-probe-sizes", action="store_true", help="extraction as before probe sizes existed")
    ap.add_argument("--extract-only", action="store_true", help="skip the naive comparison")
    ap.add_argument(
        "--overhead",
        action="store_true",
        help="operator calls, time and peak memory of the default extraction over a plain forward",
    )
    ap.add_argument(
        "--stack-mib", type=float, default=0, help="runners.extract.STACK_BYTES_CPU in MiB (0: its default)"
    )
    ap.add_argument(
        "--side-by-side",
        action="store_true",
        help="time the extraction without and with the probe-size extras in one process (times only)",
    )
    return ap


def main() -> None:
    args = _parser().parse_args()
    if args.embed_dim:
        args.arch = {
            "embed_dim": args.embed_dim,
            "num_heads": max(1, args.embed_dim // 64) if args.embed_dim >= 64 else 1,
        }
    tokens = (args.img_size // args.patch_size) ** 2 + 1
    args.images = args.images or -(-100_000 // tokens)
    print(
        f"probe: {args.images} images x {tokens} tokens = {args.images * tokens} tokens; "
        f"batch {args.batch_size} images; pos_embed offset {args.offset}"
    )
    counted = _in_child(phase_ops, args)
    print(f"as timed here: {format_ops(counted['timed'])}")
    print(f"extract_spectra's defaults (observables too): {format_ops(counted['default'])}")
    ops = counted["timed"]
    if args.overhead:
        _print_overhead(args, ops)
        return
    if args.side_by_side:
        both = _in_child(phase_side_by_side, args)
        print(f"plain forward:                 {both['t_plain']:8.2f} s")
        print(f"extraction without the extras: {both['t_without']:8.2f} s")
        print(f"extraction with the extras:    {both['t_with']:8.2f} s")
        print(
            f"overhead={both['t_with'] / both['t_plain']:.3f} "
            f"overhead_without_extras={both['t_without'] / both['t_plain']:.3f} t_plain={both['t_plain']:.3f}"
        )
        return
    stream = _in_child(phase_streaming, args)
    print(
        f"model: ViT-Small width D=384, 12 blocks, {args.img_size}x{args.img_size} px, patch "
        f"{args.patch_size}; device {stream['device']}; "
        f"torch threads {args.threads or torch.get_num_threads()}"
    )
    t_plain, t_stream, ours = stream["t_plain"], stream["t_stream"], stream["eig"]
    print(f"plain forward:        {t_plain:8.2f} s")
    print(f"streaming extraction: {t_stream:8.2f} s  (45 spectra; peak +{stream['peak'] / 2**20:.0f} MiB)")
    if args.extract_only:
        print(f"overhead={t_stream / t_plain:.3f} t_stream={t_stream:.3f} t_plain={t_plain:.3f}")
        return
    naive = _in_child(phase_naive, args)
    t_naive, ref = naive["t_naive"], naive["eig"]
    print(f"naive ({args.naive}):     {t_naive:8.2f} s  (peak +{naive['peak'] / 2**20:.0f} MiB)")

    table, _ = metric_errors(ours, ref)
    print(format_errors(table))
    worst, where, degenerate = metric_agreement(ours, ref)
    print(f"max metric error: {worst:.3g} ({where})")
    print(f"zero-variance token sets, skipped: {', '.join(degenerate) or 'none'}")
    print(
        f"overhead={t_stream / t_plain:.3f} naive_speedup={t_naive / t_stream:.2f} "
        f"naive_memory={naive['peak'] / max(stream['peak'], 1):.1f} max_rel_err={worst:.2e}"
    )


if __name__ == "__main__":
    main()
