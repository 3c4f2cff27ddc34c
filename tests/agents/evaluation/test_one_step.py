"""`agents.evaluation.one_step.one_step_fidelity`: each real tool output of demonstrations (error demonstrations
included) scored as predicted from the real history."""

from __future__ import annotations

from agents.evaluation.one_step import one_step_fidelity


def test_one_step_fidelity_scores_each_real_output_given_the_real_history():
    """A stand-in model that predicts every demonstration token scores 1 on ordinary and error outputs; one that
    predicts every token but the first of each error output scores 0 on errors and still 1 on the rest."""
    import torch

    from agents.training.demonstrations import build_demonstrations
    from benchmarks.lab.lab_tiny import build_lab_tokenizer
    from envace_gym.types import Role
    from wrappers.fidelity import is_error_output

    tokenizer = build_lab_tokenizer()
    ids = [f"{c}_test{i}" for c in ("ship_two", "make_room") for i in range(4)]
    demos, stats = build_demonstrations(tokenizer, "lab", None, "test", task_ids=ids, max_tokens=None, mutations=1)
    assert stats.error_demos >= 4
    error_starts = set()  # (sequence, position) of the first token of each error output
    for d in demos:
        t = 0
        while t < len(d.token_ids):
            if d.role_mask[t] == int(Role.REHEARSE):
                end = next((e for e in range(t, len(d.token_ids)) if d.role_mask[e] != int(Role.REHEARSE)), None)
                if is_error_output(tokenizer.decode(d.token_ids[t:end], skip_special_tokens=True)):
                    error_starts.add((tuple(d.token_ids), t))
                t = end if end is not None else len(d.token_ids)
            else:
                t += 1
    assert error_starts

    class Oracle(torch.nn.Module):
        def __init__(self, wrong_on_errors: bool):
            super().__init__()
            self.wrong_on_errors = wrong_on_errors

        def forward(self, input_ids):
            seq = input_ids[0].tolist()
            logits = torch.zeros(1, len(seq), len(tokenizer))
            for t in range(len(seq)):
                target = seq[min(t + 1, len(seq) - 1)]
                if self.wrong_on_errors and (tuple(seq), t + 1) in error_starts:
                    target = (target + 1) % len(tokenizer)
                logits[0, t, target] = 1.0
            return type("Out", (), {"logits": logits})()

    from envace_gym.suites import make_suite

    perfect = one_step_fidelity(Oracle(False), tokenizer, demos, make_suite("lab").error_kind)
    assert perfect["ordinary"]["exact_match"] == perfect["error"]["exact_match"] == 1.0
    assert perfect["error"]["outputs"] == len(error_starts)
    assert sum(v["outputs"] for k, v in perfect.items() if k not in ("ordinary", "error")) == len(error_starts)
    kinds = set(perfect) - {"ordinary", "error"}  # the lab's mistakes, split by its error_kind
    assert len(kinds) >= 2 and kinds <= {"breaks", "repeat", "no_box", "no_item"}
    blind = one_step_fidelity(Oracle(True), tokenizer, demos)  # no error_kind: no split by kind
    assert blind["error"]["exact_match"] == 0.0 and blind["ordinary"]["exact_match"] == 1.0
    assert set(blind) == {"error", "ordinary"}
