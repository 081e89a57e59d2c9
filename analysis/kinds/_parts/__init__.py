"""The claim kinds' shared parts, one job each; ``analysis.kinds.base`` (the plug-in API) and
``analysis.kinds`` re-export what the rest of the tree may use. Nothing outside ``analysis.kinds`` imports
these modules.
"""

from __future__ import annotations
