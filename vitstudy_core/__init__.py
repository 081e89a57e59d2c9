"""The bottom layer: what ``study``, ``runners`` and ``analysis`` all need, importing none of them.

* :mod:`vitstudy_core.errors`: the one-line user error (:class:`~vitstudy_core.errors.StudyError`) and a failed run;
* :mod:`vitstudy_core.layers`: observation-point names, their depth order, and the token sets;
* :mod:`vitstudy_core.hashing`: canonical JSON and the sha256 digests built on it;
* :mod:`vitstudy_core.io`: atomic writes (text, JSON, ``.npz``) and the load-from-cache-or-build pattern;
* :mod:`vitstudy_core.provenance`: git commit, dirty flag and package versions;
* :mod:`vitstudy_core.fmt`: how numbers and p-values are printed, in the terminal and in reports;
* :mod:`vitstudy_core.runfolder`: the run-folder contract every run source fills and every reader reads.

Only numpy (and the standard library) is imported here.
"""
