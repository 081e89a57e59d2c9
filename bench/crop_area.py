"""Mean area fraction of DINO's random resized crops: ours (``MultiCrop.crop_boxes``) against torchvision's.

    PYTHONPATH=. python bench/crop_area.py                 # 32 px and 224 px images, 20,000 draws each

torchvision's ``RandomResizedCrop.get_params`` (what DINO's reference augmentation uses) draws up to 10
(area, aspect ratio) pairs and takes the first that fits, else the whole image; a draw that is clamped
to the image instead of redrawn makes crops larger. Last line: ``max_abs_diff=<x>`` over the rows.
"""

from __future__ import annotations

import argparse

import numpy as np
import torch
import torchvision.transforms as T

from runners.objectives.multicrop import MultiCrop


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--draws", type=int, default=20000)
    args = ap.parse_args()
    torch.manual_seed(0)
    worst = 0.0
    print(f"{'size':>5} {'scale':>12} {'torchvision':>12} {'ours':>8}")
    for size in (32, 224):
        img = torch.zeros(3, size, size)
        for scale in [(0.4, 1.0), (0.05, 0.4)]:
            params = (T.RandomResizedCrop.get_params(img, scale, (3 / 4, 4 / 3)) for _ in range(args.draws))
            ref = np.mean([h * w for _, _, h, w in params]) / size**2
            crops = MultiCrop(size, size, 0, scale, scale, torch.Generator().manual_seed(1))
            b = crops.crop_boxes(args.draws, size, size, scale)
            ours = float(((b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1])).mean()) / size**2
            worst = max(worst, abs(ours - ref))
            print(f"{size:>5} {str(scale):>12} {ref:>12.4f} {ours:>8.4f}")
    print(f"max_abs_diff={worst:.4f}")


if __name__ == "__main__":
    main()
