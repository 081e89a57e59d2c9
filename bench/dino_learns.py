"""Does DINO learn at CPU scale? Its teacher's k-NN curve beside the supervised test accuracy, same data.

    PYTHONPATH=. python bench/dino_learns.py [--epochs 10] [--n-train 10000] [--threads 2] [--json out.json]
    PYTHONPATH=. python bench/dino_learns.py --objective '{"kind": "dino", "preset": "dino_small", "teacher_temp": 0.07}'

Both runs go through ``runners.train.train_run``, the code every study trains with: the shipped CPU model
(``vit_cpu12``: timm ViT, patch 4, D=64, 12 blocks) on generated ``objects`` at 16 px (label = the
object's shape), one seed, first DINO (``--objective``, default ``{"kind": "dino", "preset": "dino_small"}``)
then the supervised objective on the same images with the same epochs and batch size. Printed per epoch
(0 = initialisation): DINO's loss, teacher k-NN accuracy (k=20, on up to 5,000 train / 2,000 test
images), teacher entropy against ln K, the KL of the teacher's targets to their mean, the spread of the
normalised features, and the supervised test accuracy; then the wall time of each run, DINO's
images/s against the supervised run's, the k-NN rise over initialisation and the learning check
(``runners.objectives.learning_status``). The criterion of the DINO issue: a rise of at least 0.15 within
10 minutes of DINO training on 2 cores (``--threads 2``, nothing else running).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from runners.objectives import learning_status  # noqa: E402
from runners.train import train_run  # noqa: E402
from study.runspecs import plan_runs  # noqa: E402
from study.schema import parse_hypothesis  # noqa: E402

RISE = 0.15  # the criterion: the teacher's k-NN at least this far above its value at initialisation


def design(objective: dict | str, epochs: int, n_train: int, batch: int, lr: float | None) -> dict:
    """A one-seed hypothesis on generated objects with ``objective`` (its claim is never evaluated)."""
    training: dict = {"epochs": epochs, "batch_size": batch}
    if lr is not None:
        training["lr"] = lr
    return {
        "name": "dino_learns",
        "design": {
            "datasets": [{"name": "objects", "variant": "objects", "n_train": n_train, "image_size": 16}],
            "model": {"preset": "vit_cpu12"},
            "objective": objective,
            "training": training,
            "seeds": [0],
            "checkpoints": [epochs],
            "probe": {"size": 64},
        },
        "claims": [
            {
                "name": "x",
                "kind": "u_shape",
                "metric": "eed_pct",
                "subset": {"dataset": "objects"},
                "regions": {"early": ["block_01"], "bottleneck": ["block_06"], "late": ["block_12"]},
            }  # fmt: skip
        ],
    }


def train(hyp: dict, work: Path) -> tuple[dict, float]:
    """Train the hypothesis's one run in ``work``; -> (result.json, wall seconds)."""
    (spec,) = plan_runs(parse_hypothesis(hyp))
    t0 = time.perf_counter()
    result = train_run(spec.model_dump(), work / spec.key, work / "data", progress=print)
    return result, time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--objective", default='{"kind": "dino", "preset": "dino_small"}', help="DINO's objective (JSON)"
    )
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--n-train", type=int, default=10_000)
    ap.add_argument("--batch-size", type=int, default=None, help="default: the preset's (else 128)")
    ap.add_argument("--lr", type=float, default=None, help="DINO's lr; default: the preset's")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-supervised", action="store_true", help="DINO only")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    objective = json.loads(args.objective)
    batch = args.batch_size or 128
    if args.batch_size is None and isinstance(objective, dict) and objective.get("preset"):
        from runners.objectives.base import find_preset

        found = find_preset(objective["preset"])
        batch = int(found[1].training.get("batch_size", 128)) if found else 128
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        dino, dino_s = train(design(objective, args.epochs, args.n_train, batch, args.lr), work)
        sup, sup_s = (
            (None, None)
            if args.no_supervised
            else train(design("supervised", args.epochs, args.n_train, batch, None), work)
        )
    rows = [dino["initial"], *dino["history"]]
    sup_acc = [sup["initial"]["test_acc"], *(h["test_acc"] for h in sup["history"])] if sup else None
    ln_k = math.log(dino["run"]["objective"]["out_dim"])
    print(f"\nDINO {args.objective}, batch {batch}, {args.epochs} epochs of {args.n_train} objects, "
          f"{args.threads} threads; ln K = {ln_k:.2f}")  # fmt: skip
    print("epoch  loss    knn_acc  teacher_entropy  kl_to_mean  feature_spread  supervised_test_acc")
    for i, h in enumerate(rows):
        loss = f"{h['loss']:.3f}" if "loss" in h else "  -  "
        sa = f"{sup_acc[i]:.3f}" if sup_acc else "-"
        print(f"{h['epoch']:>5}  {loss:6}  {h['knn_acc']:.3f}    {h['teacher_entropy']:6.3f}"
              f"           {h['teacher_kl_mean']:6.3f}      {h['feature_spread']:.3f}           {sa}")  # fmt: skip
    rise = dino["history"][-1]["knn_acc"] - dino["initial"]["knn_acc"]
    dino_ips = sum(h["images_per_s"] for h in dino["history"]) / len(dino["history"])
    out = {
        "objective": objective,
        "epochs": args.epochs,
        "n_train": args.n_train,
        "batch_size": batch,
        "threads": args.threads,
        "dino_wall_s": dino_s,
        "dino_images_per_s": dino_ips,
        "knn_init": dino["initial"]["knn_acc"],
        "knn_per_epoch": [h["knn_acc"] for h in dino["history"]],
        "knn_rise": rise,
        "criterion_met": rise >= RISE,
        "learning_status": learning_status(dino),
        "dino_history": rows,
        "supervised_wall_s": sup_s,
        "supervised_test_acc": sup_acc,
    }
    print(f"DINO: {dino_s:.0f} s ({dino_ips:.0f} img/s); k-NN {out['knn_init']:.3f} -> "
          f"{out['knn_per_epoch'][-1]:.3f}, rise {rise:+.3f} (criterion >= {RISE}: "
          f"{'met' if out['criterion_met'] else 'NOT met'}); learning check: {out['learning_status'] or 'learned'}")  # fmt: skip
    if sup:
        sup_ips = sum(h["images_per_s"] for h in sup["history"]) / len(sup["history"])
        print(
            f"supervised: {sup_s:.0f} s ({sup_ips:.0f} img/s); DINO images/s / supervised: {dino_ips / sup_ips:.2f}"
        )
    if args.json:
        args.json.write_text(json.dumps(out, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
