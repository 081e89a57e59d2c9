"""A sweep's optuna study as optuna-dashboard shows it (issues 25 and 27): the objective by name, each
trial completed when its own runs ended (not when its batch did), TPE's start-up trials asked as one
batch, and optuna-dashboard's own storage loader opening the sweep's journal. No training: the runs are
planted run folders (``tests.planted``)."""

from __future__ import annotations

import csv
import io
from wsgiref.util import setup_testing_defaults

import optuna
import pytest
import yaml

from study import stages, sweep
from study.schema import parse_hypothesis
from study.tracking import NullTracker
from tests.conftest import TINY_SWEEP
from tests.planted import PlantedSource


def _hyp(**over):
    doc = yaml.safe_load(TINY_SWEEP)
    doc["sweep"].update(over)
    return parse_hypothesis(doc)


def _plant(points, runs_dir) -> None:
    for p in points:
        for s in p.specs:
            PlantedSource(0.0).fill(s.model_dump(mode="json"), runs_dir / s.key, None)


def test_each_trial_is_told_when_its_own_runs_end(tmp_path, monkeypatch):
    hyp = _hyp()
    study = sweep.open_optuna_study(hyp, tmp_path, None, "s.yaml")
    points = sweep._ask(study, hyp, 3, tmp_path / "data")
    _plant(points, tmp_path / "runs")
    states: list[list[str]] = []

    def fill_runs(specs, out_dir, hyp, tracker, opts, log, *, on_triaged=None, on_ended=None, **kw):
        tri = stages.Triage(todo=[s for s in specs if s.key not in {x.key for x in points[2].specs}])
        on_triaged(specs, tri)  # trial 2's runs were finished before: it is told now
        states.append([t.state.name for t in study.get_trials()])
        for p in points[:2]:  # trial 0's runs end, then trial 1's
            for s in p.specs:
                on_ended(s, {"status": "finished"})
            states.append([t.state.name for t in study.get_trials()])
        return stages.Filled(list(specs), tri)

    monkeypatch.setattr(stages, "fill_runs", fill_runs)
    assert (
        sweep._run_batch(points, hyp, tmp_path, NullTracker(), stages.RunOptions(), print, stages.Filled())
        == 3
    )
    assert states == [
        ["RUNNING", "RUNNING", "COMPLETE"],
        ["COMPLETE", "RUNNING", "COMPLETE"],
        ["COMPLETE", "COMPLETE", "COMPLETE"],
    ]
    done = study.get_trials()
    assert done[0].datetime_complete < done[1].datetime_complete
    assert all(t.user_attrs["runs_finished_at"] > 0 for t in done)  # planted runs record their end only
    assert "runs_started_at" not in done[0].user_attrs


def test_tpe_asks_its_start_up_trials_as_one_batch():
    hyp = _hyp(sampler="tpe", space={"texture_reliance": {"low": 0.0, "high": 1.0}}, n_trials=14)
    assert sweep._batch_size(hyp, 14, 2, asked=0) == sweep.TPE_STARTUP == 10  # was 1: one trial a batch
    assert sweep._batch_size(hyp, 6, 2, asked=8) == 2  # the start-up trials left
    assert sweep._batch_size(hyp, 4, 2, asked=10) == 1  # then one at a time on 2 workers x 2 seeds
    assert sweep._batch_size(hyp, 4, 8, asked=10) == 4  # or enough to keep every worker busy
    assert sweep._batch_size(hyp, 3, 2, asked=0) == 3  # never more than the trials left
    assert sweep._sampler(hyp)._n_startup_trials == sweep.TPE_STARTUP


def _get(app, path: str) -> tuple[str, bytes]:
    env: dict = {"PATH_INFO": path}
    setup_testing_defaults(env)
    got = {}
    body = b"".join(app(env, lambda status, headers, exc=None: got.update(status=status)))
    return got["status"], body


def test_optuna_dashboard_opens_the_sweep_journal(tmp_path):
    dashboard = pytest.importorskip("optuna_dashboard")
    from optuna_dashboard._storage_url import get_storage

    hyp = _hyp()
    study = sweep.open_optuna_study(hyp, tmp_path, None, "s.yaml")
    points = sweep._ask(study, hyp, 2, tmp_path / "data")
    _plant(points, tmp_path / "runs")
    for p in points:
        sweep._tell_trial(p, hyp, tmp_path / "runs", print, None)
    journal = tmp_path / "sweeps" / "tiny_sweep" / "journal.log"
    # the loader `optuna-dashboard <journal>` uses, and the study as the dashboard reads it
    storage = get_storage(str(journal))
    seen = optuna.load_study(study_name="tiny_sweep", storage=storage)
    assert seen.metric_names == ["min of eed_pct"] and len(seen.trials) == 2
    app = dashboard.wsgi(storage)
    status, body = _get(app, "/api/studies/0")
    assert status.startswith("200") and b'"trials"' in body
    status, body = _get(app, "/csv/0")  # the trial table as the dashboard exports it
    rows = list(csv.reader(io.StringIO(body.decode())))
    assert rows[0][:3] == ["Number", "State", "min of eed_pct"] and len(rows) == 3, rows
