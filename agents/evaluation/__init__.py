"""Evaluation: playing a policy against real backends and reporting what it did.

* `agents.evaluation.evaluate`: `evaluate` and `EvalConfig`: accuracy on real backends, optionally with
  test-time rehearsal, and the rehearsal fidelity of the policy's world model.
* `agents.evaluation.plots`: the plots of a run folder or of evaluation outputs (``envace report``).

Nothing is imported here: ``import agents.evaluation.plots`` loads that module alone.
"""
