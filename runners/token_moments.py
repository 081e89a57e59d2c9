"""Token moments of observation points: streamed float64 sums of shifted activations, many sets at once
(:class:`_MomentBank`: one batched GEMM per Gram block for every set of a forward pass, :class:`_Stacked`:
the float64 rows they are read from), one set's view of them (:class:`_Moments`, its Grams by lower block
triangle, :func:`gram_blocks`), and what is read from them: the covariance, its spectrum with round-off
set to 0 (:func:`eigenvalues`, :func:`_spectrum`) and the token-count metrics. The method (shift, sums,
round-off floor) is described in ``runners.extract``'s docstring.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import torch
from threadpoolctl import ThreadpoolController

from analysis.observables import OBSERVABLES
from analysis.spectral import TOKEN_METRICS

CHUNK_ROWS = 512  # CPU: tokens per float64 conversion and Gram update (the workspace: 1.5 MB at D = 384)
# columns appended to the shifted rows y: a 1 and |y|^2, so that the Gram's last rows hold s = sum y and
# n (the 1's row), u = sum y |y|^2 and w = sum |y|^4 (the |y|^2 row): the sums come out of the Gram's GEMM
# instead of four more operator calls per update
AUG = 2
# CPU Gram blocks (at most): each is one batched GEMM call per update; 4 blocks multiply 62.5% of D^2 (8:
# 56%), and the stacked (points, rows, 96) x (points, rows, b) GEMMs ran as fast as 8 blocks of 48 (one
# thread, D = 384, 15 points x 363 rows: 79 ms against 81, loaded machine), with half the calls
CPU_BLOCKS = 4


def gram_blocks(d: int, device: torch.device) -> list[tuple[int, int]]:
    """Row-block edges ``(a, b)`` of the lower block triangle that ``_Moments`` accumulates.

    The Gram ``Y^T Y`` is symmetric, so only block row ``[a, b)`` times columns ``[0, b)`` is formed: with
    ``k`` blocks that is ``(k + 1) / 2k`` of a full GEMM. On CPU ``k = min(CPU_BLOCKS, D // 48)`` blocks
    (at least 48 columns each; narrower blocks made MKL's float64 GEMM slower, measured at D = 384); on a
    GPU a single full GEMM (``k = 1``) is already fast and one kernel launch is cheaper than several.
    """
    k = 1 if device.type == "cuda" else max(1, min(CPU_BLOCKS, d // 48))
    edges = [round(d * i / k) for i in range(k + 1)]
    return list(zip(edges[:-1], edges[1:], strict=True))


class _Workspace:
    """One reusable float64 buffer for the shifted activations, grown to the largest chunk seen.

    Every point of a forward pass converts its activations into the same memory in turn (a view of its
    front), instead of allocating a fresh float64 copy per point and batch: a fresh 13 MiB tensor costs its
    page faults every time (measured 7 ms against 0.8 ms for the conversion into a reused buffer, D = 384,
    4,352 tokens).
    """

    def __init__(self) -> None:
        self._buf: torch.Tensor | None = None

    def get(self, numel: int, device: torch.device) -> torch.Tensor:
        """The buffer's first ``numel`` float64 elements, (numel,) (reallocated where it is too small)."""
        if self._buf is None or self._buf.numel() < numel or self._buf.device != device:
            self._buf = torch.empty(numel, dtype=torch.float64, device=device)
        return self._buf[:numel]


def augmented_blocks(d: int, device: torch.device) -> list[tuple[int, int]]:
    """:func:`gram_blocks` of the rows widened by the :data:`AUG` columns: the last block row also takes
    rows and columns ``[D, D + AUG)``, where the sums ``s, n, u, w`` land."""
    return [(a, b + AUG if b == d else b) for a, b in gram_blocks(d, device)]


class _Stacked:
    """K sets of ``n`` shifted float64 rows ``(K, n + 1, D + AUG)``, with the views the updates read.

    Row ``i < n`` of set ``k`` is ``[y, 1, |y|^2]`` with ``y = x - shift_k``; row ``n`` is all zero, the
    row that a gather pads with (it adds exactly nothing to any sum, the 1 included). The constant cells
    (the 1s and the zero row) are written once, when the buffer is laid out, so each update only loads,
    shifts and squares. Every view is made here once per layout: a view is an operator call too.
    """

    def __init__(self, k: int, n: int, d: int, buf: torch.Tensor):
        self.k, self.n, self.d = k, n, d
        self.work = buf.view(k, n + 1, d + AUG)
        self.work[:, n].zero_()
        self.work[:, :n, d].fill_(1.0)
        self.y = self.work[:, :n, :d]  # (K, n, D), strided: the load and the shift write into it
        self.sq = self.work[:, :n, d + 1]  # (K, n): |y|^2 of each row
        self._loads: dict[torch.Size, torch.Tensor] = {}  # activation shape -> the (K, *shape) view of y
        self.lhs, self.rhs = self.block_views(0, n)

    def block_views(self, lo: int, hi: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """:meth:`operands` of rows ``[lo, hi)`` of every set."""
        return self.operands(self.work[:, lo:hi], self.d)

    @staticmethod
    def operands(rows: torch.Tensor, d: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Per Gram block ``(a, b)`` (:func:`augmented_blocks`) the batched GEMM operands of augmented
        rows ``rows: (K, n, D + AUG)``: ``(K, b - a, n)`` and ``(K, n, b)``."""
        blocks = augmented_blocks(d, rows.device)
        return [rows[:, :, a:b].transpose(1, 2) for a, b in blocks], [rows[:, :, :b] for _, b in blocks]

    def load(self, xs: list[torch.Tensor] | torch.Tensor) -> None:
        """Convert ``xs`` (K tensors of n rows of D in any float dtype, or one ``(K, n, D)`` tensor) into
        float64 in place (no float32 rounding, no temporary: one stacking call for all K)."""
        if isinstance(xs, torch.Tensor):
            self.y.copy_(xs)
            return
        shape = xs[0].shape
        if shape not in self._loads:
            self._loads[shape] = self.y.view(self.k, *shape)
        torch.stack(xs, out=self._loads[shape])

    def shift_and_square(self, shift: torch.Tensor) -> None:
        """``y -= shift`` (``shift: (K, 1, D)``), then the |y|^2 column."""
        self.y.sub_(shift)
        torch.linalg.vector_norm(self.y, dim=-1, out=self.sq).square_()


class _MomentBank:
    """K sets of streaming shifted float64 moments, updated together: one batched GEMM per Gram block.

    The moments of set ``k`` are ``n``, ``s = sum y``, ``q = sum y y^T``, ``u = sum y |y|^2`` and
    ``w = sum |y|^4`` of its rows ``y = x - shift_k``. They are all read from one Gram of the augmented
    rows ``[y, 1, |y|^2]`` (:class:`_Stacked`), stored as its lower block triangle (:func:`augmented_blocks`;
    ``grams[i]``: ``(K, b - a, b)``): ``q`` is its ``(D, D)`` part, ``s`` and ``n`` the 1's row, ``u`` and
    ``w`` the ``|y|^2`` row. :attr:`sets` are one :class:`_Moments` per set whose fields are views of
    these buffers, so everything read from a set's sums (covariance, snapshots, differences) is unchanged.
    """

    def __init__(self, shifts: torch.Tensor):
        k, d = shifts.shape
        dev = shifts.device
        self.d, self.blocks = d, gram_blocks(d, dev)
        self.grams = [
            torch.zeros(k, b - a, b, dtype=torch.float64, device=dev) for a, b in augmented_blocks(d, dev)
        ]
        a_last, last = self.blocks[-1][0], self.grams[-1]
        self.s = last[:, d - a_last, :d]  # (K, D): the 1's row
        self.u, self.w = last[:, d - a_last + 1, :d], last[:, d - a_last + 1, d + 1]  # (K, D), (K,)
        q_rows = [[g[j] for g in self.grams[:-1]] + [last[j, : d - a_last, :d]] for j in range(k)]
        self.sets = [
            _Moments(shifts[j], 0, self.s[j], q_rows[j], self.blocks, self.u[j], self.w[j]) for j in range(k)
        ]

    def update(self, lhs: list[torch.Tensor], rhs: list[torch.Tensor]) -> None:
        """Add the rows behind the block operands of :meth:`_Stacked.block_views` (``lhs[i]: (K, b - a,
        rows)``, ``rhs[i]: (K, rows, b)``) to the sums; ``n`` is counted by the caller."""
        for g, left, right in zip(self.grams, lhs, rhs, strict=True):
            g.baddbmm_(left, right)  # in place, no temporary


@dataclass
class _Moments:
    """Streaming shifted float64 moments ``n``, ``s = sum (x - shift)``, ``q = sum (x - shift)(x - shift)^T``.

    ``q`` is stored as its lower block triangle: ``rows[i]`` is block row ``[a, b)`` of ``gram_blocks``
    over columns ``[0, b)`` (62.5% of ``D^2`` at D = 384); ``full_q`` mirrors it into the whole matrix.
    The fields are views of a :class:`_MomentBank` (a one-set bank where :meth:`add` streams into this
    set alone, the very arithmetic of the observer's batched updates) or, for a difference or a copy,
    tensors of their own. Everything runs in torch on the activations' device (one thread pool on CPU:
    mixing in a second BLAS pool, e.g. scipy's ``dsyrk``, made both pools spin against each other on a
    loaded 2-core machine, and scipy's ``dsyrk`` alone measured 11.9 ms against 10 ms for the block
    triangle, D = 384).
    """

    shift: torch.Tensor  # (D,) float64
    n: int = 0
    s: torch.Tensor | None = None  # (D,) float64
    rows: list[torch.Tensor] | None = None  # block rows of the lower triangle of q, float64
    blocks: list[tuple[int, int]] | None = None
    # fourth-order sums for the bias-corrected participation ratio (analysis.spectral.TOKEN_METRICS):
    # u = sum y |y|^2 (D,) and w = sum |y|^4 (scalar); O(n D) per batch against the Gram's O(n D^2)
    u: torch.Tensor | None = None
    w: torch.Tensor | None = None
    _bank: _MomentBank | None = None

    def add(self, x: torch.Tensor, work: _Workspace | None = None) -> None:
        """x: (n_tokens, D) in any float dtype; ``work``: a shared buffer (else a fresh one)."""
        n_rows, d = x.shape
        if self.rows is None:
            self._bank = _MomentBank(self.shift.reshape(1, d).to(torch.float64))
            bank_set = self._bank.sets[0]
            self.s, self.rows, self.blocks = bank_set.s, bank_set.rows, bank_set.blocks
            self.u, self.w = bank_set.u, bank_set.w
        assert self._bank is not None, "add() streams into its own sums, not into a copy or a difference"
        work = work or _Workspace()
        # on CPU, at most CHUNK_ROWS tokens at a time (equal chunks): the float64 workspace stays a few MB
        # whatever the batch (256 images of 197 tokens at D = 384 would need 155 MB at once)
        chunks = 1 if x.device.type == "cuda" else max(1, -(-n_rows // CHUNK_ROWS))
        step = max(1, -(-n_rows // chunks))
        shift = self.shift.reshape(1, 1, d)
        for lo in range(0, n_rows, step):
            rows = x[lo : lo + step]
            stacked = _Stacked(1, rows.shape[0], d, work.get((rows.shape[0] + 1) * (d + AUG), x.device))
            stacked.load(rows.unsqueeze(0))
            stacked.shift_and_square(shift)
            self._bank.update(stacked.lhs, stacked.rhs)
            self.n += rows.shape[0]

    def filled(
        self,
    ) -> tuple[torch.Tensor, list[torch.Tensor], list[tuple[int, int]], torch.Tensor, torch.Tensor]:
        """``(s, rows, blocks, u, w)`` of moments that hold sums (the first ``add`` sets all five)."""
        s, rows, blocks, u, w = self.s, self.rows, self.blocks, self.u, self.w
        # set together: by the first add, or all given by minus/copy of moments that had them
        assert s is not None and rows is not None and blocks is not None, "no tokens added yet"
        assert u is not None and w is not None, "no tokens added yet"
        return s, rows, blocks, u, w

    def full_q(self) -> torch.Tensor:
        """The whole symmetric ``(D, D)`` ``q``: the lower block triangle mirrored above it."""
        s, rows, blocks, _, _ = self.filled()
        d = s.shape[0]
        # every entry is written below (block row i fills rows [a, b) up to column b, and its transpose the
        # rows above it in columns [a, b)), so no zero fill first
        q = torch.empty(d, d, dtype=torch.float64, device=s.device)
        for (a, b), row in zip(blocks, rows, strict=True):
            q[a:b, :b] = row
            q[:a, a:b] = row[:, :a].T
        return q

    def minus(self, other: _Moments) -> _Moments:
        """Moments of the tokens in ``self`` but not in ``other`` (same shift): exact in float64."""
        if other.rows is None:  # nothing added to ``other`` yet
            return self.copy()
        (s, rows, blocks, u, w), (s2, rows2, _, u2, w2) = self.filled(), other.filled()
        diff = [r - o for r, o in zip(rows, rows2, strict=True)]
        return _Moments(self.shift, self.n - other.n, s - s2, diff, blocks, u - u2, w - w2)

    @classmethod
    def of_sample(cls, x: np.ndarray) -> _Moments:
        """The sums of a gathered ``(m, D)`` float64 sample (shift: its first row), on the CPU."""
        t = torch.from_numpy(np.ascontiguousarray(x))
        mom = cls(shift=t[0].clone())
        mom.add(t)
        return mom

    def copy(self) -> _Moments:
        """An independent copy (a snapshot of the running sums at an image boundary)."""
        if self.rows is None:
            return _Moments(self.shift)
        s, rows, blocks, u, w = self.filled()
        copied = [r.clone() for r in rows]
        return _Moments(self.shift, self.n, s.clone(), copied, blocks, u.clone(), w.clone())

    def sums(self) -> dict[str, np.ndarray]:
        """The raw shifted sums as float64 numpy: ``n`` (), ``s`` (D,), ``q`` (D, D), ``u`` (D,), ``w`` ()."""
        s, _, _, u, w = self.filled()
        return {
            "n": np.asarray(self.n, dtype=np.float64),
            "s": s.cpu().numpy(),
            "q": self.full_q().cpu().numpy(),
            "u": u.cpu().numpy(),
            "w": np.asarray(w.item(), dtype=np.float64),
        }

    def covariance(self, sums: dict[str, np.ndarray] | None = None) -> np.ndarray:
        """(D, D) float64 numpy: ``(Q - s s^T / n) / (n - 1)``, symmetrised (from ``sums``, this object's
        :meth:`sums`, where the caller has them: the Gram is then mirrored once, not twice)."""
        sm = self.sums() if sums is None else sums
        s, blocks = sm["s"], self.filled()[2]
        # (q - outer(s, s) / n) / (n - 1), then 0.5 (C + C^T), bit for bit, in place (two (D, D) arrays, not
        # six): q is mirrored from its lower block triangle and outer(s, s) is symmetric, so C is already
        # symmetric outside the diagonal blocks of the Gram (each a full GEMM block, which may differ from
        # its transpose in the last bit), where 0.5 (c + c) = c exactly: only those blocks are averaged
        outer = np.outer(s, s)
        outer /= self.n
        cov = np.subtract(sm["q"], outer, out=outer)
        cov /= self.n - 1
        for a, b in blocks:
            diag = cov[a:b, a:b]
            diag[...] = 0.5 * (diag + diag.T)
        return cov

    def roundoff(self) -> float:
        """Absolute round-off level of ``covariance()`` entries: ``(D + n) eps64 max_i Q_ii / (n - 1)``.

        ``Q - s s^T / n`` cancels terms of size ``Q_ii``, each a sum of ``n`` products (worst-case relative
        summation error ~ ``n eps64``); eigenvalues below this level are noise, e.g. of a token set whose
        tokens are all identical, such as the class token before the first block (measured: with
        ``D eps64`` alone, 5,900 identical class tokens at mean 60 left a spurious eigenvalue).
        """
        s, rows, blocks, _, _ = self.filled()
        d = s.shape[0]
        eps = np.finfo(np.float64).eps
        q_max = max(row[:, a:b].diagonal().max().item() for (a, b), row in zip(blocks, rows, strict=True))
        return float((d + self.n) * eps * q_max / max(self.n - 1, 1))


def eigenvalues(cov: np.ndarray) -> np.ndarray:
    """Descending, clipped eigenvalues of a symmetric matrix, computed in float64.

    numpy's LAPACK on one BLAS thread: a D ~ 384 ``eigvalsh`` is too small to split (two threads took ~10x
    longer than one on a loaded 2-core machine), and numpy's one-thread ``syevd`` took 5.3 ms against 7.2
    ms for torch's MKL one (D = 384, 40 matrices, idle 2-core machine). Limiting numpy's pool, not torch's,
    leaves the forward pass's thread pool alone (changing torch's thread count per call cost 0.45 ms a
    switch). Summaries on two Python threads at once were no faster here (eigvalsh of numpy, scipy and
    torch alike), so they run one after another.
    """
    with _blas().limit(limits=1, user_api="blas"):
        lam = np.linalg.eigvalsh(np.asarray(cov, dtype=np.float64))
    return np.clip(lam[::-1], 0.0, None).copy()


@functools.cache
def _blas() -> ThreadpoolController:
    """The process's thread pools, found once (a lookup scans the loaded libraries)."""
    return ThreadpoolController()


def token_metrics(sums: dict[str, np.ndarray], lam: np.ndarray) -> dict[str, float]:
    """Every ``analysis.spectral.TOKEN_METRICS`` entry of one covariance's streamed sums; NaN where its
    spectrum ``lam`` is all zero (no variance above round-off, like every eigenvalue metric there)."""
    return {name: fn(sums) if lam.any() else float("nan") for name, fn in TOKEN_METRICS.items()}


def _spectrum(mom: _Moments, sums: dict[str, np.ndarray] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(covariance (D, D), eigenvalues (D,)) of a token set's sums (``sums``: its :meth:`_Moments.sums`,
    where the caller has them), round-off dimensions and eigenvalues set to 0 (see the module docstring)."""
    cov, floor = mom.covariance(sums), mom.roundoff()
    dead = np.diag(cov) <= floor  # variance at round-off level: a constant dimension
    cov[dead, :] = 0.0
    cov[:, dead] = 0.0
    lam = eigenvalues(cov)
    lam[lam <= floor] = 0.0
    return cov, lam


def _summary(mom: _Moments) -> tuple[np.ndarray, int, dict[str, float]]:
    """(eigenvalues, tokens, covariance observables and token-count metrics) of one smaller probe.

    In numpy from one copy of the sums (the Gram mirrored once); ``eigenvalues`` on one BLAS thread."""
    sums = mom.sums()
    cov, lam = _spectrum(mom, sums)
    values = {n: e.fn(cov) for n, e in OBSERVABLES.items() if e.on == "covariance"}
    return lam, mom.n, {**values, **token_metrics(sums, lam)}
