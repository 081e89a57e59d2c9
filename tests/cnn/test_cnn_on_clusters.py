"""A CNN study on Ray and on Slurm gives the local executor's table (the run spec carries the CNN)."""

from __future__ import annotations

import pandas as pd

from tests.cnn.test_cnn_study import CNN

COLS = ["run_key", "epoch", "layer", "token_set", "metric"]
ONE_RUN = CNN.replace("seeds: [0, 1, 2]", "seeds: [0]")
TWO_RUNS = CNN.replace("seeds: [0, 1, 2]", "seeds: [0, 1]")


def _table(outcome) -> pd.DataFrame:
    return outcome.table.sort_values(COLS).reset_index(drop=True)


def _study(tmp_path, text: str, folder: str, **options):
    from study.pipeline.orchestrate import run_study
    from study.pipeline.stages import RunOptions
    from study.schema import load_hypothesis

    path = tmp_path / f"{folder}.yaml"
    path.write_text(text)
    return run_study(
        load_hypothesis(path), path, tmp_path / folder, RunOptions(track=False, report=False, **options)
    )


def test_a_cnn_study_on_ray_matches_the_local_executor(tmp_path, ray_address):
    from study.pipeline.stages import Placement

    on_ray = _study(tmp_path, TWO_RUNS, "ray", placement=Placement("ray", ray_address))
    local = _study(tmp_path, TWO_RUNS, "local", workers=2)
    assert len(on_ray.trained) == 2 and not on_ray.failed
    assert set(on_ray.table.layer) == {"stem", "block_01", "block_02", "block_03", "block_04", "pool"}
    pd.testing.assert_frame_equal(_table(on_ray), _table(local), rtol=1e-4)  # one thread per run on both
    assert [r.verdict for r in on_ray.results] == [r.verdict for r in local.results]


def test_a_cnn_study_on_slurm_gives_the_local_table_bit_for_bit(tmp_path, slurm_cluster):
    from study.pipeline.stages import Placement

    place = Placement("slurm", options=(("partition", "debug"),))  # one CPU, so one torch thread
    on_slurm = _study(tmp_path, ONE_RUN, "slurm", placement=place)
    local = _study(tmp_path, ONE_RUN, "local")
    assert len(on_slurm.trained) == 1 and not on_slurm.failed
    pd.testing.assert_frame_equal(_table(on_slurm), _table(local), check_exact=True)
