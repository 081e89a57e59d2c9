"""A dataset logged by two processes at once: the loser's duplicate-key error is retried, others are not."""

from __future__ import annotations

import pytest
from mlflow.exceptions import MlflowException

from study.tracking._write import log_inputs_once


class _Client:
    def __init__(self, errors: list[str]):
        self.errors, self.logged = list(errors), []

    def log_inputs(self, run_id, datasets):
        if self.errors:
            raise MlflowException(self.errors.pop(0))
        self.logged.append((run_id, datasets))


def test_a_duplicate_dataset_key_is_retried_and_the_input_logged():
    dup = '(psycopg.errors.UniqueViolation) duplicate key value violates unique constraint "dataset_pk"'
    client = _Client([dup])
    log_inputs_once(client, "r1", ["d"])
    assert client.logged == [("r1", ["d"])]


def test_other_errors_and_a_persistent_duplicate_are_raised():
    with pytest.raises(MlflowException, match="disk full"):
        log_inputs_once(_Client(["disk full"]), "r1", ["d"])
    dup = "UNIQUE constraint failed: datasets.experiment_id"
    with pytest.raises(MlflowException, match="UNIQUE"):
        log_inputs_once(_Client([dup] * 3), "r1", ["d"], tries=3)
