"""Imported checkpoints: a seed's weights per epoch read without running code and measured.

Public modules: ``importer`` (:func:`import_checkpoints`: load each epoch into the design's timm ViT and
measure it), ``files`` (which file holds which epoch; reading one safely).
"""

from __future__ import annotations
