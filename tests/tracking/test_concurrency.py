"""Two ``python -m study run`` of one file on one output folder at once (the embedded sqlite store).

Each run is trained once (a lock per run key), both invocations finish with the same verdicts, and the
store records each run key once. On a fresh folder this also races the creation of the store and of the
experiment (serialised by a lock file).
"""

from __future__ import annotations

from study.runspecs import plan_runs
from study.schema import load_hypothesis
from tests.studyproc import start, store_state, study_cmd, verdicts


def test_two_invocations_train_each_run_once(tiny_yaml, tmp_path):
    out = tmp_path / "out"
    procs = [start(study_cmd(tiny_yaml, out)) for _ in range(2)]
    done = [p.communicate(timeout=900) for p in procs]
    for p, (_, stderr) in zip(procs, done, strict=True):
        assert p.returncode == 0, stderr
        assert stderr.strip() == "", stderr  # no traceback, no library log lines
    specs = plan_runs(load_hypothesis(tiny_yaml))
    for spec in specs:  # the last epoch of each run is printed by whichever process trained it
        trained = sum(stdout.count(f"[{spec.label}] epoch 2/2") for stdout, _ in done)
        assert trained == 1, (spec.label, trained)
    assert store_state(out)["finished"] == {s.key: 1 for s in specs}
    assert verdicts(out)  # the verdicts file both wrote (atomically) is whole
    outputs = [stdout.split("claim", 1)[1].split("results:")[0] for stdout, _ in done]
    assert outputs[0] == outputs[1]  # both printed the same verdict table
