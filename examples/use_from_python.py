"""Use from Python: the README's snippet, run by tests/test_api.py in a folder where ``study_results``
holds a finished study (``python -m study run hypotheses/u_shape.yaml`` leaves one there)."""

import study

result = study.load("study_results")  # or: study.run("hypotheses/u_shape.yaml", out="study_results")
print(result.verdicts[["verdict", "effect", "ci_low", "ci_high", "p_adjusted"]])
claim = result.hypothesis.claims[0]
print(result.profile(claim.metric, dataset=claim.subset.dataset))  # per seed, mean and 95% t CI, by layer
result.figure(claim.name).savefig("claim.png")  # the report's figure of that claim
print(study.analyze(result.hypothesis, result.table))  # the claims re-tested on the saved table
