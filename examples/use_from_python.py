"""Use from Python: the README's snippet, run by tests/test_api.py in a folder where ``study_results``
holds the finished default study (``python -m study run hypotheses/u_shape.yaml`` leaves it there) and
another (``hypotheses/controls.yaml``, the README's next step), so the study is named."""

import study

result = study.load("study_results", name="u_shape")  # or: study.run("hypotheses/u_shape.yaml")
print(result.verdicts[["verdict", "effect", "ci_low", "ci_high", "p_adjusted"]])
claim = result.hypothesis.claims[0]
print(result.profile(claim.metric, dataset=claim.subset.dataset, condition=claim.subset.condition))
result.figure(claim.name).savefig("claim.png")  # the report's figure of that claim
print(study.analyze(result.hypothesis, result.table))  # re-tested on the saved table
