"""The data-complexity knobs a sweep can vary: fields of a procedural dataset spec.

``texture_reliance``, ``object_scale``, ``clutter`` and ``noise`` shape the generated images; ``n_classes``
and ``image_size`` set the task's size. A claim over a knob (``over: texture_reliance``) tests the
per-seed curve of a metric against the knob's values across a sweep's trials.
"""

from __future__ import annotations

from typing import Literal, get_args

Knob = Literal["texture_reliance", "object_scale", "clutter", "noise", "n_classes", "image_size"]
KNOBS: tuple[str, ...] = get_args(Knob)
INTEGER_KNOBS = ("n_classes", "image_size")
