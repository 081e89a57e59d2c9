"""DINO mechanics, each checked directly: loss, centring, EMA, schedules, head, crops, k-NN."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from runners.objectives import TrainerSetup
from runners.objectives.dino import (
    DINOHead,
    DINOLoss,
    DinoTrainer,
    cosine_schedule,
    ema_update,
    knn_accuracy,
    knn_subset,
    teacher_temp_schedule,
)
from runners.objectives.multicrop import JITTER_OPS, MultiCrop, colour_op


def _np_softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def test_loss_matches_hand_computation_and_centre_updates():
    """B=1, K=3, 2 global + 1 local crop; pairs (t0,s1), (t0,s2), (t1,s0), (t1,s2)."""
    s = np.array([[1.0, 0.0, -1.0], [0.5, 0.2, 0.1], [-0.3, 0.4, 0.0]])  # student logits per crop
    t = np.array([[0.2, 0.1, 0.0], [0.0, 0.3, 0.1]])  # teacher logits per global crop
    c = np.array([[0.05, -0.05, 0.0]])
    tau_s, tau_t = 0.1, 0.04
    q = _np_softmax((t - c) / tau_t)
    logp = np.log(_np_softmax(s / tau_s))
    pairs = [(0, 1), (0, 2), (1, 0), (1, 2)]
    expected = np.mean([-(q[i] * logp[j]).sum() for i, j in pairs])

    loss_fn = DINOLoss(out_dim=3, n_crops=3, student_temp=tau_s, center_momentum=0.9)
    loss_fn.center.copy_(torch.tensor(c))
    loss = loss_fn(torch.tensor(s, dtype=torch.float64), torch.tensor(t, dtype=torch.float64), tau_t)
    assert loss.item() == pytest.approx(expected, rel=1e-6)  # centre buffer is float32
    # centre: c <- 0.9 c + 0.1 mean_b teacher
    np.testing.assert_allclose(loss_fn.center.numpy(), 0.9 * c + 0.1 * t.mean(0, keepdims=True), rtol=1e-6)


def test_loss_excludes_same_view_pairs():
    """Identical student and teacher outputs on the same view contribute nothing: only cross pairs count."""
    loss_fn = DINOLoss(out_dim=4, n_crops=2, student_temp=1.0, center_momentum=0.0)
    t = torch.tensor([[5.0, 0, 0, 0], [0, 5.0, 0, 0]])
    s_same = t.clone()
    s_swapped = t.flip(0)
    assert loss_fn(s_swapped, t, 1.0) < loss_fn(s_same, t, 1.0)


def test_ema_update():
    student, teacher = torch.nn.Linear(3, 2), torch.nn.Linear(3, 2)
    with torch.no_grad():
        for p in student.parameters():
            p.fill_(1.0)
        for p in teacher.parameters():
            p.fill_(0.0)
    ema_update(student, teacher, 0.9)
    for p in teacher.parameters():
        torch.testing.assert_close(p, torch.full_like(p, 0.1))
    ema_update(student, teacher, 1.0)  # momentum 1: the teacher is frozen
    for p in teacher.parameters():
        torch.testing.assert_close(p, torch.full_like(p, 0.1))


def test_teacher_temperature_schedule():
    np.testing.assert_allclose(teacher_temp_schedule(0.04, 0.07, 3, 5), [0.04, 0.055, 0.07, 0.07, 0.07])
    np.testing.assert_allclose(teacher_temp_schedule(0.04, 0.07, 0, 2), [0.07, 0.07])


def test_cosine_schedules_for_weight_decay_momentum_and_lr():
    wd = cosine_schedule(0.04, 0.4, epochs=2, steps_per_epoch=5)
    assert len(wd) == 10 and wd[0] == pytest.approx(0.04) and wd[5] == pytest.approx(0.22)
    assert np.all(np.diff(wd) > 0) and wd[-1] < 0.4
    mom = cosine_schedule(0.996, 1.0, 3, 4)
    assert mom[0] == pytest.approx(0.996) and np.all(np.diff(mom) > 0) and mom[-1] <= 1.0
    lr = cosine_schedule(1e-3, 1e-6, 2, 5, warmup_epochs=1)
    np.testing.assert_allclose(lr[:5], [0, 2.5e-4, 5e-4, 7.5e-4, 1e-3])  # DINO's warmup ends at the peak
    assert lr[5] == pytest.approx(1e-3) and np.all(np.diff(lr[5:]) < 0)


def test_head_with_normed_last_layer_has_bounded_logits():
    head = DINOHead(8, 16, hidden_dim=12, bottleneck_dim=4, norm_last_layer=True)
    g = head.last_layer.parametrizations.weight.original0
    assert not g.requires_grad
    out = head(torch.randn(5, 8) * 100)
    assert out.shape == (5, 16) and out.abs().max() <= 1.0 + 1e-5  # unit vector . unit rows


def _crops(seed: int, x: torch.Tensor) -> list[torch.Tensor]:
    return MultiCrop(16, 8, 3, (0.4, 1.0), (0.05, 0.4), torch.Generator().manual_seed(seed))(x)


def test_crop_pipeline_shapes_range_and_determinism():
    x01 = torch.rand(6, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    x = (x01 - 0.5) / 0.25
    crops = _crops(1, x)
    assert [tuple(c.shape) for c in crops] == [(6, 3, 16, 16)] * 2 + [(6, 3, 8, 8)] * 3
    for c in crops:
        c01 = c * 0.25 + 0.5
        assert torch.isfinite(c).all() and c01.min() >= -1e-5 and c01.max() <= 1 + 1e-5
    again = _crops(1, x)
    assert all(torch.equal(a, b) for a, b in zip(crops, again, strict=True))
    other = _crops(2, x)
    assert not torch.equal(crops[0], other[0])
    assert not torch.equal(crops[0], crops[1])  # two global views differ


def test_crop_of_uniform_image_keeps_it_uniform_per_image():
    """Cropping and blurring a constant image cannot create structure; only colour ops change values."""
    x = torch.zeros(4, 3, 16, 16)
    for c in _crops(3, x):
        flat = c.reshape(4, 3, -1)
        assert (flat.std(-1) < 1e-4).all()


def test_knn_accuracy_on_separable_and_random_features():
    g = torch.Generator().manual_seed(0)
    centres = torch.randn(4, 16, generator=g) * 5
    ytr, yte = torch.arange(200) % 4, torch.arange(80) % 4
    ftr = centres[ytr] + torch.randn(200, 16, generator=g)
    fte = centres[yte] + torch.randn(80, 16, generator=g)
    assert knn_accuracy(ftr, ytr, fte, yte) == 1.0
    assert knn_accuracy(torch.randn(200, 16, generator=g), ytr, torch.randn(80, 16, generator=g), yte) < 0.5


RUN = {
    "seed": 0,
    "model": {"name": "vit_small_patch16_224", "patch_size": 4, "embed_dim": 16, "depth": 2, "num_heads": 2},
    "training": {"epochs": 2, "batch_size": 4, "lr": 1e-3, "weight_decay": 0.04, "warmup_epochs": 0},
    "objective": {
        "kind": "dino",
        "out_dim": 32,
        "hidden_dim": 16,
        "bottleneck_dim": 8,
        "norm_last_layer": True,
        "n_local_crops": 2,
        "local_crop_size": None,
        "global_crop_scale": (0.4, 1.0),
        "local_crop_scale": (0.05, 0.4),
        "student_temp": 0.1,
        "teacher_temp": 0.07,
        "warmup_teacher_temp": 0.04,
        "warmup_teacher_temp_epochs": 1,
        "center_momentum": 0.9,
        "momentum_teacher": 0.9,
        "weight_decay_end": 0.4,
        "freeze_last_layer_epochs": 1,
        "clip_grad": 3.0,
    },
}


def test_trainer_step_applies_ema_schedules_and_frozen_last_layer():
    torch.manual_seed(0)
    trainer = DinoTrainer(TrainerSetup.from_run(RUN, 2, 16, steps_per_epoch=1), torch.device("cpu"))
    assert trainer.local_size == 8 and trainer.measured is trainer.teacher["backbone"]
    for ps, pt in zip(trainer.student.parameters(), trainer.teacher.parameters(), strict=True):
        assert torch.equal(ps, pt)  # the teacher starts as a copy of the student
    teacher_before = [p.clone() for p in trainer.teacher.parameters()]
    last_before = [p.clone() for p in trainer.student["head"].last_layer.parameters()]
    x = torch.randint(0, 256, (4, 16, 16, 3), dtype=torch.uint8)
    stats = trainer.train_epoch(1, x, torch.zeros(4, dtype=torch.long), torch.arange(4), lambda *a: None)
    m = trainer.momentum[0]
    for before, ps, pt in zip(
        teacher_before, trainer.student.parameters(), trainer.teacher.parameters(), strict=True
    ):
        torch.testing.assert_close(pt, m * before + (1 - m) * ps.detach())
    for before, p in zip(last_before, trainer.student["head"].last_layer.parameters(), strict=True):
        assert torch.equal(before, p)  # frozen in the first epoch
    assert stats["teacher_temp"] == 0.04 and stats["weight_decay"] == pytest.approx(0.04)
    assert trainer.opt.param_groups[1]["weight_decay"] == 0.0  # biases and norms: no decay
    assert float(trainer.loss_fn.center.abs().sum()) > 0  # centring moved from its zero start
    stats = trainer.train_epoch(2, x, torch.zeros(4, dtype=torch.long), torch.arange(4), lambda *a: None)
    assert stats["teacher_temp"] == 0.07 and stats["weight_decay"] == pytest.approx(0.22)
    assert not all(
        torch.equal(b, p)
        for b, p in zip(last_before, trainer.student["head"].last_layer.parameters(), strict=True)
    )


class _LabelFromPixels(torch.nn.Module):
    """A stand-in backbone whose features identify the class written into pixel (0, 0) of each image."""

    def __init__(self, n_classes: int):
        super().__init__()
        self.n_classes = n_classes
        self.anchor = torch.nn.Parameter(torch.zeros(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: normalised (B, 3, H, W)
        level = (x[:, 0, 0, 0] * 0.25 + 0.5) * 255  # back to the uint8 value
        return F.one_hot((level / 10).round().long(), self.n_classes).float() + 0.01


def test_knn_monitor_samples_class_sorted_splits_at_random():
    """Disk datasets come class-sorted: the monitor must not take the first images (old: 2 of 10 classes)."""
    n_classes, per_train, per_test = 10, 50, 20
    ytr = torch.arange(n_classes).repeat_interleave(per_train)  # class-sorted, like Tiny ImageNet train
    yte = torch.arange(n_classes).repeat(per_test)  # interleaved, like a shuffled val split

    def images(y: torch.Tensor) -> torch.Tensor:
        return (y * 10).to(torch.uint8)[:, None, None, None].expand(-1, 4, 4, 3).contiguous()

    trainer = DinoTrainer(TrainerSetup.from_run(RUN, n_classes, 16, steps_per_epoch=1), torch.device("cpu"))
    trainer.measured = _LabelFromPixels(n_classes)
    trainer.knn_train, trainer.knn_test = 100, 40  # caps below the split sizes, as 5,000 / 2,000 at scale
    acc = trainer.evaluate(images(ytr), ytr, images(yte), yte)["knn_acc"]
    assert acc > 0.9  # first-100 neighbours (classes 0 and 1 only) would give 0.2

    sub = knn_subset(500, 100)
    assert len(sub) == 100 and len(set(ytr[sub].tolist())) == n_classes
    assert torch.equal(sub, knn_subset(500, 100))  # the same images at every epoch
    assert torch.equal(knn_subset(30, 100), torch.arange(30))  # small splits: every image


def test_head_last_layer_and_loss_stay_float32_under_bf16_autocast():
    torch.manual_seed(0)
    head = DINOHead(8, 64, hidden_dim=16, bottleneck_dim=8, norm_last_layer=False)
    x = torch.randn(6, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = head(x)
        h = head.mlp(x)
        assert h.dtype == torch.bfloat16  # the MLP does run in bf16 under autocast
    assert out.dtype == torch.float32
    expected = head.last_layer(F.normalize(h.float(), dim=-1))  # float32 last layer on the same input
    torch.testing.assert_close(out, expected, rtol=0, atol=0)

    loss_fn = DINOLoss(64, n_crops=3, student_temp=0.1, center_momentum=0.9)
    s, t = torch.randn(6, 64).bfloat16(), torch.randn(4, 64).bfloat16()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = loss_fn(s, t, 0.04)
    assert loss.dtype == torch.float32
    ref = DINOLoss(64, n_crops=3, student_temp=0.1, center_momentum=0.9)(s.float(), t.float(), 0.04)
    torch.testing.assert_close(loss, ref)


@pytest.mark.parametrize("name", JITTER_OPS)
def test_colour_ops_match_torchvision_per_image(name):
    """Each jitter op equals torchvision's ``adjust_*`` applied image by image with that image's factor."""
    import torchvision.transforms.functional as TF

    g = torch.Generator().manual_seed(0)
    x = torch.rand(5, 3, 12, 12, generator=g)
    x[0] = 0.5  # a gray image: hue undefined, saturation 0
    lo, hi = {"brightness": (0.6, 1.4), "contrast": (0.6, 1.4), "saturation": (0.8, 1.2), "hue": (-0.1, 0.1)}[
        name
    ]
    f = lo + (hi - lo) * torch.rand(5, generator=g)
    ours = colour_op(name, x, f)
    ref = torch.stack([getattr(TF, f"adjust_{name}")(x[i], float(f[i])) for i in range(5)])
    torch.testing.assert_close(ours, ref, rtol=0, atol=1e-5)


def test_crop_area_matches_torchvision_random_resized_crop():
    """Mean crop area fraction of our boxes equals torchvision's RandomResizedCrop.get_params."""
    import torchvision.transforms as T

    torch.manual_seed(0)
    img = torch.zeros(3, 32, 32)
    for scale in [(0.4, 1.0), (0.05, 0.4)]:
        ref = np.mean(
            [
                h * w / 1024
                for _, _, h, w in (
                    T.RandomResizedCrop.get_params(img, scale, (3 / 4, 4 / 3)) for _ in range(4000)
                )
            ]
        )
        boxes = MultiCrop(32, 16, 0, scale, scale, torch.Generator().manual_seed(1)).crop_boxes(
            4000, 32, 32, scale
        )
        ours = float(((boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])).mean() / 1024)
        assert abs(ours - ref) < 0.01, (scale, ours, ref)  # the old clamped draw gave 0.69 against 0.64
        assert (boxes[:, :2] >= 0).all() and (boxes[:, 2:] <= 32).all()


# ---- the crops' statistics against DINO's reference augmentation (DataAugmentationDINO) ---------------
N_STAT = 3000  # images per crop: a binomial rate to +-0.025 (3 standard errors at p = 0.5)
P_MIN = 1e-4  # the draws are seeded, so each check is deterministic; a real bias of the size that
# matters (a rate off by 0.05, a factor range off by 10 %) gives p-values far below this


def test_crop_draws_have_the_reference_rates_and_distributions():
    """Per crop: flip 0.5, jitter 0.8 (factors uniform on ColorJitter(0.4, 0.4, 0.2, 0.1)'s ranges, the 4
    ops in a uniformly random order), grayscale 0.2, blur 1.0 / 0.1 / 0.5 with sigma U(0.1, 2) x size / 224,
    solarisation 0.2 on global 2 only; and the jitter's per-(position, op) image groups match the order."""
    from scipy import stats

    size = 32
    draws = MultiCrop(size, 16, 2, (0.4, 1.0), (0.05, 0.4), torch.Generator().manual_seed(5)).draw(
        N_STAT, size, size
    )
    blur_p = [1.0, 0.1, 0.5, 0.5]
    assert [("solarize" in d) for d in draws] == [False, True, False, False]
    for c, d in enumerate(draws):
        rates = {
            "flip": 0.5,
            "jitter": 0.8,
            "gray": 0.2,
            "blur": blur_p[c],
            **({"solarize": 0.2} if c == 1 else {}),
        }
        for key, p in rates.items():
            hits = int(d[key].sum())
            if p == 1.0:
                assert hits == N_STAT, (c, key)
            else:
                assert stats.binomtest(hits, N_STAT, p).pvalue > P_MIN, (c, key, hits / N_STAT, p)
        for j, (lo, hi) in enumerate([(0.6, 1.4), (0.6, 1.4), (0.8, 1.2), (-0.1, 0.1)]):
            assert stats.kstest(d["factors"][:, j].numpy(), stats.uniform(lo, hi - lo).cdf).pvalue > P_MIN
        s_lo, s_hi = 0.1 * size / 224, 2.0 * size / 224
        assert stats.kstest(d["sigma"].numpy(), stats.uniform(s_lo, s_hi - s_lo).cdf).pvalue > P_MIN
        perm = d["order"] @ torch.tensor([64, 16, 4, 1])  # each of the 24 orders a code
        counts = torch.bincount(perm, minlength=256)[torch.unique(perm)]
        assert len(counts) == 24 and stats.chisquare(counts.numpy()).pvalue > P_MIN
        groups = iter(d["jitter_idx"].split(d["jitter_sizes"]))
        for step in range(4):
            for k in range(4):
                assert torch.equal(next(groups), torch.nonzero(d["order"][:, step] == k).squeeze(1))


def test_crop_boxes_have_torchvision_random_resized_crop_distribution():
    """Area fraction and aspect ratio of our boxes against torchvision's RandomResizedCrop.get_params on
    the same image size (two-sample KS), for DINO's global and local scales; offsets uniform in the slack."""
    import torchvision.transforms as T
    from scipy import stats

    torch.manual_seed(0)
    size, img = 32, torch.zeros(3, 32, 32)
    for scale in [(0.4, 1.0), (0.05, 0.4)]:
        ref = np.array(
            [T.RandomResizedCrop.get_params(img, scale, (3 / 4, 4 / 3))[2:] for _ in range(N_STAT)]
        )
        b = MultiCrop(size, 16, 0, scale, scale, torch.Generator().manual_seed(2)).crop_boxes(
            N_STAT, size, size, scale
        )
        w, h = (b[:, 2] - b[:, 0]).numpy(), (b[:, 3] - b[:, 1]).numpy()
        assert stats.ks_2samp(w * h, ref[:, 0] * ref[:, 1]).pvalue > P_MIN, scale
        assert stats.ks_2samp(w / h, ref[:, 1] / ref[:, 0]).pvalue > P_MIN, scale
        slack = size - w > 0
        rel = b[:, 0].numpy()[slack] / (size - w[slack])
        assert stats.kstest(rel, "uniform").pvalue > P_MIN, scale


def test_crops_apply_their_draws_image_by_image():
    """The device-side crops use the drawn masks: an image comes out horizontally flipped exactly when its
    flip was drawn, gray exactly when grayscale was, and solarised (global 2 only) when solarisation was."""
    n, size = 600, 16
    crops = MultiCrop(size, 8, 1, (0.4, 1.0), (0.05, 0.4), torch.Generator().manual_seed(7))
    # a gray left-to-right ramp: crop, brightness, contrast and blur keep it increasing, a flip reverses it
    ramp = torch.linspace(0.05, 0.3, size).expand(n, 3, size, size)
    draws = crops.draw(n, size, size)
    for c, (out, d) in enumerate(zip(crops.apply((ramp - 0.5) / 0.25, draws), draws, strict=True)):
        half = out.shape[-1] // 2
        rising = out[..., half:].mean((1, 2, 3)) > out[..., :half].mean((1, 2, 3))
        keep = ~d["solarize"] if c == 1 else torch.ones(n, dtype=torch.bool)  # 1 - x can reverse it
        assert torch.equal(rising[keep], ~d["flip"][keep]), c
    colours = torch.rand(n, 3, size, size, generator=torch.Generator().manual_seed(8)) * 0.6 + 0.2
    draws = crops.draw(n, size, size)
    for out, d in zip(crops.apply((colours - 0.5) / 0.25, draws), draws, strict=True):
        gray = (out - out[:, :1]).abs().amax((1, 2, 3)) < 1e-5
        assert torch.equal(gray, d["gray"])
    # nothing but solarisation on a constant 0.7 image: global 2 becomes 0.3 where drawn, else stays
    for d in draws:
        for key in ("flip", "jitter", "gray", "blur"):
            d[key] = torch.zeros(n, dtype=torch.bool)
    out = crops.apply(torch.full((n, 3, size, size), (0.7 - 0.5) / 0.25), draws)
    for c, o in enumerate(out):
        level = (o * 0.25 + 0.5).mean((1, 2, 3))
        want = torch.where(draws[c]["solarize"], 0.3, 0.7) if c == 1 else torch.full((n,), 0.7)
        torch.testing.assert_close(level, want, rtol=0, atol=1e-5)


def test_packed_copy_round_trips_every_draw():
    """The one host-to-device copy of a step's draws keeps every value, dtype and shape (here CPU -> CPU)."""
    from runners.objectives.multicrop import packed_copy

    draws = MultiCrop(16, 8, 2, (0.4, 1.0), (0.05, 0.4), torch.Generator().manual_seed(0)).draw(9, 16, 16)
    back = packed_copy(draws, torch.device("cpu"))
    for d, e in zip(draws, back, strict=True):
        assert d.keys() == e.keys()
        for k in d:
            if isinstance(d[k], torch.Tensor):
                assert e[k].dtype == d[k].dtype and torch.equal(e[k], d[k]), k
            else:
                assert e[k] == d[k], k


@pytest.mark.filterwarnings("ignore:Seems like `optimizer.step\\(\\)` has been overridden")
@pytest.mark.parametrize("objective", ["dino", "supervised"])
def test_training_steps_never_read_device_values(objective, monkeypatch):
    """A step reads nothing back from the device (no ``.item()``, ``bool(tensor)``, ``nonzero``): each such
    read stalls the host on a GPU. Seen on the CPU with the profiler, on the device code path (the meter
    checking as on CUDA), outside the two parts that run on the host by design: the crop draws (CPU
    tensors) and torch's CPU AdamW (which reads its step counts; the fused CUDA AdamW does not).
    Allowed: the epoch's end, which reads the sums once (dino: flag, loss; supervised: also accuracy)."""
    import runners.objectives.meter as meter
    from runners.objectives import make_objective

    monkeypatch.setattr(meter, "CPU_CHECK_EVERY", meter.CUDA_CHECK_EVERY)
    run = RUN if objective == "dino" else {**RUN, "objective": "supervised"}
    torch.manual_seed(0)
    trainer = make_objective(run, 2, 16, 3, torch.device("cpu"))

    def ranged(name, fn):
        def wrapped(*a, **k):
            with torch.profiler.record_function(name):
                return fn(*a, **k)

        return wrapped

    if objective == "dino":
        trainer.crops.draw = ranged("host", trainer.crops.draw)
    trainer.opt.step = ranged("host", trainer.opt.step)
    x = torch.randint(0, 256, (12, 16, 16, 3), dtype=torch.uint8)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        trainer.train_epoch(1, x, torch.zeros(12, dtype=torch.long), torch.arange(12), lambda *a: None)
    reads = []
    for ev in prof.events():
        if ev.name in ("aten::_local_scalar_dense", "aten::nonzero"):
            parent = ev.cpu_parent
            while parent is not None and parent.name != "host":
                parent = parent.cpu_parent
            if parent is None:
                reads.append(ev.name)
    assert len(reads) == (2 if objective == "dino" else 3), reads
