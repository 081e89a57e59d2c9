"""The bottom layer: what ``study``, ``runners`` and ``analysis`` all need, importing none of them.

* :mod:`core.errors`: the one-line user error (:class:`~core.errors.StudyError`) and a failed run;
* :mod:`core.layers`: observation-point names, their depth order, and the token sets;
* :mod:`core.hashing`: canonical JSON and the sha256 digests built on it;
* :mod:`core.io`: atomic writes (text, JSON, ``.npz``) and the load-from-cache-or-build pattern;
* :mod:`core.provenance`: git commit, dirty flag and package versions;
* :mod:`core.fmt`: how numbers and p-values are printed, in the terminal and in reports;
* :mod:`core.runfolder`: the run-folder contract every run source fills and every reader reads.

Only numpy (and the standard library) is imported here.
"""
