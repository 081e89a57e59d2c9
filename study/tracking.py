"""The one module that talks to MLflow.

Layout: an experiment per hypothesis name; a parent run per invocation (params of the design, the
hypothesis file, the tidy table and the verdicts as artifacts, a tag per claim verdict); a nested child
run per trained model (its spec as params, per-epoch training metrics, per-layer spectral metrics with
step = epoch, named ``{metric}/{layer}/{token_set}``).

The default store is embedded and local: ``sqlite:///<out>/mlflow.db`` with artifacts under
``<out>/mlartifacts`` (no server). ``MLFLOW_TRACKING_URI`` overrides it. Telemetry is off.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pandas as pd

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("DO_NOT_TRACK", "true")
os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")

_BATCH = 1000  # MLflow's log_batch limit on metrics per call


def default_tracking_uri(out_dir: Path) -> str:
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{Path(out_dir).resolve() / 'mlflow.db'}"


def _flatten(prefix: str, obj, out: dict) -> dict:
    if isinstance(obj, dict):
        for k, v in obj.items():
            _flatten(f"{prefix}.{k}" if prefix else str(k), v, out)
    else:
        out[prefix] = obj
    return out


class Tracker:
    """Logs one study invocation to MLflow. Use as a context manager around the whole invocation."""

    def __init__(self, out_dir: Path, experiment: str):
        import mlflow
        from mlflow.tracking import MlflowClient

        self.mlflow = mlflow
        self.out_dir = Path(out_dir)
        self.uri = default_tracking_uri(self.out_dir)
        mlflow.set_tracking_uri(self.uri)
        self.client = MlflowClient(self.uri)
        exp = self.client.get_experiment_by_name(experiment)
        if exp is None:
            artifacts = (self.out_dir / "mlartifacts" / experiment).resolve().as_uri()
            exp_id = self.client.create_experiment(experiment, artifact_location=artifacts)
        else:
            exp_id = exp.experiment_id
        self.experiment_id = exp_id
        self.parent_id: str | None = None

    def __enter__(self) -> Tracker:
        run = self.client.create_run(
            self.experiment_id,
            run_name=time.strftime("study %Y-%m-%d %H:%M:%S"),
            tags={"study.role": "study"},
        )
        self.parent_id = run.info.run_id
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.client.set_terminated(self.parent_id, "FAILED" if exc_type else "FINISHED")

    def log_study(self, hyp, hyp_path: Path, plan) -> None:
        params = {
            "hypothesis": hyp.name,
            "n_runs": len(plan),
            "seeds": ",".join(map(str, hyp.design.seeds)),
            "datasets": ",".join(d.name for d in hyp.design.datasets),
            "objective": hyp.design.objective,
        }
        self._log_params(self.parent_id, params)
        self.client.log_artifact(self.parent_id, str(hyp_path))

    def log_training_run(self, spec, result: dict, rows: pd.DataFrame, reused: bool) -> None:
        """A nested child run for one trained model: params, per-epoch metrics, per-layer spectra."""
        status = "FINISHED" if result.get("status") == "finished" else "FAILED"
        tags = {
            "mlflow.parentRunId": self.parent_id,
            "run_key": spec.key,
            "dataset": spec.dataset["name"],
            "seed": str(spec.seed),
            "reused": str(reused).lower(),
            "study.role": "training",
        }
        if result.get("environment"):
            tags.update({f"env.{k}": str(v) for k, v in result["environment"].items()})
        run = self.client.create_run(self.experiment_id, run_name=spec.label, tags=tags)
        rid = run.info.run_id
        params = _flatten("", {k: v for k, v in spec.model_dump().items() if k != "key"}, {})
        self._log_params(rid, params)
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = []
        for h in result.get("history", []):
            for k, v in h.items():
                if k != "epoch" and v is not None:
                    metrics.append(Metric(f"train/{k}", float(v), now, int(h["epoch"])))
        for r in rows.itertuples(index=False):
            if pd.notna(r.value):
                metrics.append(
                    Metric(f"{r.metric}/{r.layer}/{r.token_set}", float(r.value), now, int(r.epoch))
                )
        for i in range(0, len(metrics), _BATCH):
            self.client.log_batch(rid, metrics=metrics[i : i + _BATCH])
        if status == "FAILED":
            self.client.set_tag(rid, "failed_epoch", str(result.get("failed_epoch")))
        self.client.set_terminated(rid, status)

    def log_results(self, artifacts: list[Path], results) -> None:
        for path in artifacts:
            self.client.log_artifact(self.parent_id, str(path))
        for i, r in enumerate(results):
            self.client.set_tag(self.parent_id, f"verdict.{i}", f"{r.verdict}: {r.name}"[:5000])

    def _log_params(self, run_id: str, params: dict) -> None:
        from mlflow.entities import Param

        items = [Param(k, str(v)[:6000]) for k, v in params.items()]
        for i in range(0, len(items), 100):
            self.client.log_batch(run_id, params=items[i : i + 100])
