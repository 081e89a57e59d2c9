"""One observation point's token moments: streamed float64 sums of shifted activations (:class:`_Moments`,
its Grams by lower block triangle, :func:`gram_blocks`), and what is read from them: the covariance, its
spectrum with round-off set to 0 (:func:`eigenvalues`, :func:`_spectrum`) and the token-count metrics.
The method (shift, sums, round-off floor) is described in ``runners.extract``'s docstring.
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


def gram_blocks(d: int, device: torch.device) -> list[tuple[int, int]]:
    """Row-block edges ``(a, b)`` of the lower block triangle that ``_Moments`` accumulates.

    The Gram ``Y^T Y`` is symmetric, so only block row ``[a, b)`` times columns ``[0, b)`` is formed: with
    ``k`` blocks that is ``(k + 1) / 2k`` of a full GEMM. On CPU ``k = min(8, D // 48)`` blocks (at least
    48 columns each; narrower blocks made MKL's float64 GEMM slower, measured at D = 384); on a GPU a
    single full GEMM (``k = 1``) is already fast and one kernel launch is cheaper than eight.
    """
    k = 1 if device.type == "cuda" else max(1, min(8, d // 48))
    edges = [round(d * i / k) for i in range(k + 1)]
    return list(zip(edges[:-1], edges[1:], strict=True))


class _Workspace:
    """One reusable float64 buffer for the shifted activations, grown to the largest chunk seen.

    Every point of a forward pass converts its activations into the same memory in turn (a ``(tokens, D)``
    view of its front), instead of allocating a fresh float64 copy per point and batch: a fresh 13 MiB
    tensor costs its page faults every time (measured 7 ms against 0.8 ms for the conversion into a
    reused buffer, D = 384, 4,352 tokens).
    """

    def __init__(self) -> None:
        self._buf: torch.Tensor | None = None

    def get(self, rows: int, d: int, device: torch.device) -> torch.Tensor:
        need = rows * d
        if self._buf is None or self._buf.numel() < need or self._buf.device != device:
            self._buf = torch.empty(need, dtype=torch.float64, device=device)
        return self._buf[:need].view(rows, d)


@dataclass
class _Moments:
    """Streaming shifted float64 moments ``n``, ``s = sum (x - shift)``, ``q = sum (x - shift)(x - shift)^T``.

    ``q`` is stored as its lower block triangle: ``rows[i]`` is block row ``[a, b)`` of ``gram_blocks``
    over columns ``[0, b)`` (56% of ``D^2`` at D = 384); ``full_q`` mirrors it into the whole matrix.
    Everything runs in torch on the activations' device (one thread pool on CPU: mixing in a second BLAS
    pool, e.g. scipy's ``dsyrk``, made both pools spin against each other on a loaded 2-core machine, and
    scipy's ``dsyrk`` alone measured 11.9 ms against 10 ms for the block triangle, D = 384).
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

    def add(self, x: torch.Tensor, work: _Workspace | None = None) -> None:
        """x: (n_tokens, D) in any float dtype; ``work``: a shared buffer (else a fresh one)."""
        n_rows, d = x.shape
        if self.rows is None:
            self.blocks = gram_blocks(d, x.device)
            self.s = torch.zeros(d, dtype=torch.float64, device=x.device)
            self.rows = [torch.zeros(b - a, b, dtype=torch.float64, device=x.device) for a, b in self.blocks]
            self.u = torch.zeros(d, dtype=torch.float64, device=x.device)
            self.w = torch.zeros((), dtype=torch.float64, device=x.device)
        work = work or _Workspace()
        # on CPU, at most CHUNK_ROWS tokens at a time (equal chunks): the float64 workspace stays a few MB
        # whatever the batch (256 images of 197 tokens at D = 384 would need 155 MB at once)
        chunks = 1 if x.device.type == "cuda" else max(1, -(-n_rows // CHUNK_ROWS))
        step = max(1, -(-n_rows // chunks))
        for lo in range(0, n_rows, step):
            self._add_rows(x[lo : lo + step], work)

    def _add_rows(self, x: torch.Tensor, work: _Workspace) -> None:
        """:meth:`add` of one chunk of rows ``x: (n, D)``, converted into ``work`` at once."""
        n_rows, d = x.shape
        s, rows, blocks, u, w = self.filled()
        y = work.get(n_rows, d, x.device)
        # float64, no float32 rounding of the shifted values, and no temporary: ``torch.sub(x, shift,
        # out=y)`` would first convert x into a fresh float64 tensor (aten::_to_copy, 3.3 MB a point and
        # batch of 1,088 tokens at D = 384: page faults each time where large buffers go back to the OS)
        y.copy_(x)
        y -= self.shift
        s += y.sum(0)  # every sum in place: the fields hold these same tensors
        sq = torch.linalg.vector_norm(y, dim=1).square_()
        u.addmv_(y.T, sq)
        w += sq.square().sum()
        for (a, b), row in zip(blocks, rows, strict=True):
            row.addmm_(y[:, a:b].T, y[:, :b])  # in place, no temporary
        self.n += n_rows

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
