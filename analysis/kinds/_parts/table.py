"""Table access: :class:`TableView`, the tidy table grouped once so many claims slice it cheaply, and the
errors of a table that cannot test a claim (:class:`NotTestable`, :class:`OneLevel`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from vitstudy_core.errors import StudyError

if TYPE_CHECKING:
    import pandas as pd


class NotTestable(StudyError):
    """The table has no rows of the claim's metric: a source that does not measure it (an imported metric
    log, a metric undefined everywhere). The claim is reported as not testable; the others go on.
    ``why`` leads the verdict's reason."""

    why = "not testable on this source"


class OneLevel(NotTestable):
    """A claim over a knob whose table holds one value of it (a one-level sweep, or one complete trial):
    no curve, so no slope to test; reported as not testable, never as a test that found nothing."""

    why = "not testable"


class TableView:
    """The tidy table grouped once by (metric, dataset, token_set), so many claims slice it cheaply.

    Every lookup of a value the table lacks raises a one-line StudyError naming the claim field; a metric it
    lacks raises :class:`NotTestable` (the claim cannot be tested on this table, which is no input error).

    A table with a ``condition`` column (a design with conditions) holding more than one condition is
    read one condition at a time: :meth:`in_condition` gives the view of one (built once, cached), and
    slicing the whole table's view instead is a one-line error asking the claim to name one. A table with
    one condition reads as today's.
    """

    def __init__(
        self, table: pd.DataFrame, condition: str | None = None, root: TableView | None = None
    ) -> None:
        self.table = table
        self.condition = condition
        self.root: TableView = root or self
        has = "condition" in table.columns
        self.conditions: list[str] = sorted(map(str, table["condition"].unique())) if has else []
        self.has_conditions = has if root is None else True
        self._views: dict[str, TableView] = {}
        # several conditions in one view: slices must come from one condition's view
        self._mixed = len(self.conditions) > 1
        self._groups = (
            {}
            if self._mixed
            else {k: g for k, g in table.groupby(["metric", "dataset", "token_set"], sort=False)}
        )
        self._present = {
            col: sorted(map(str, table[col].unique())) for col in ("metric", "dataset", "token_set")
        }

    @classmethod
    def of(cls, table: pd.DataFrame | TableView) -> TableView:
        """``table`` itself if it is a view, else a view of it."""
        return table if isinstance(table, TableView) else cls(table)

    def in_condition(self, name: str | None, where: str, fld: str) -> TableView:
        """The view of condition ``name`` (None: this view, which must then hold at most one condition
        when it is sliced); a name the table lacks, or any name when it has no conditions, is one line."""
        if name is None:
            return self
        root = self.root
        if not root.has_conditions:
            raise StudyError(
                f"condition {name!r} is named, but the design has no conditions (the table has no "
                "condition column)",
                where,
                fld,
            )
        if name not in root.conditions:
            raise StudyError(f"condition {name!r} is not in the table (it has {root.conditions})", where, fld)
        if len(root.conditions) == 1:
            return root
        if name not in root._views:
            rows = root.table[root.table["condition"].astype(str) == name]
            root._views[name] = TableView(rows, name, root)
        return root._views[name]

    def check_one_condition(self, where: str, fld: str) -> None:
        """One-line error when this view mixes conditions (the claim must name one in ``fld``)."""
        if self._mixed:
            raise StudyError(
                f"the table holds conditions {self.conditions}: name the one this claim is tested in",
                where,
                fld,
            )

    def slice(self, metric: str, dataset: str, token_set: str, where: str, fld: str = "") -> pd.DataFrame:
        """Rows of one (metric, dataset, token_set); ``fld`` prefixes the field named in errors."""
        self.check_one_condition(where, "subset.condition")
        for col, value, name in (
            ("metric", metric, "metric"),
            ("dataset", dataset, f"{fld}dataset" if fld else "subset.dataset"),
            ("token_set", token_set, f"{fld}token_set" if fld else "subset.token_set"),
        ):
            if value not in self._present[col]:
                if col == "metric":
                    raise NotTestable(
                        f"metric {value!r} is not in the table (it has {self._present[col]})", where, name
                    )
                raise StudyError(f"{value!r} is not in the table (it has {self._present[col]})", where, name)
        df = self._groups.get((metric, dataset, token_set))
        if df is None:
            raise StudyError(
                f"no rows for metric {metric!r}, dataset {dataset!r}, token set {token_set!r}",
                where,
                fld or "subset",
            )
        return df

    @staticmethod
    def at_epoch(df: pd.DataFrame, epoch: int | str, where: str, fld: str) -> tuple[pd.DataFrame, int]:
        """Rows at one epoch (``last`` = the largest epoch in the slice) and that epoch."""
        epochs = sorted(int(e) for e in df.epoch.unique())
        ep = epochs[-1] if epoch == "last" else int(epoch)
        if ep not in epochs:
            raise StudyError(f"epoch {ep} is not in the table (it has {epochs})", where, fld)
        return df[df.epoch == ep], ep

    @staticmethod
    def wide(df: pd.DataFrame, layers: list[str], where: str, fld: str) -> pd.DataFrame:
        """(seeds x layers) means of ``value``; every listed layer must be in the table."""
        have = set(df.layer.unique())
        missing = [layer for layer in layers if layer not in have]
        if missing:
            raise StudyError(f"layers {missing} are not in the table (it has {sorted(have)})", where, fld)
        wide = df[df.layer.isin(layers)].pivot_table(
            index="seed", columns="layer", values="value", aggfunc="mean", dropna=False
        )
        # a seed whose values are all NaN in these layers must stay visible, so it is reported as excluded
        return wide.reindex(index=sorted(df.seed.unique()), columns=layers)
