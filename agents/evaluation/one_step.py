"""One-step rehearsal fidelity: does the REHEARSE role predict a real tool output from the real history?

`agents.evaluation.evaluate`'s fidelity (``fidelity=True``) plays rehearsed rollouts and compares each rehearsed
output with a shadow real backend's: there an error output usually follows from an earlier rehearsed output that
the real world contradicts (a label the rehearsal made up, then shipped), which no world model could foresee
from the rehearsed history it was given. One-step fidelity asks what a world model is for instead: given the
true state so far (the demonstration's own prefix: every earlier call answered by the real backend), does it
predict what this call returns, a failure included? Demonstrations with one mistaken call
(`agents.training.demonstrations.build_demonstrations` with ``mutations``) give the error outputs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["one_step_fidelity"]


def one_step_fidelity(
    model: Any, tokenizer: Any, demos: list[Any], error_kind: Callable[[str], str] | None = None
) -> dict[str, dict[str, float | int | None]]:
    """One-step rehearsal fidelity: for every real tool output of `demos` (each REHEARSE span: the output's
    tokens and its end token), whether greedy decoding from the demonstration's own prefix, the real history up
    to that call, reproduces it exactly. Under teacher forcing that is every target token of the span being
    the argmax, so one forward pass per demonstration decides every span.

    Unlike the rehearsed-rollout fidelity of `agents.evaluation.evaluate` (``fidelity=True``), where an error
    follows from earlier rehearsed outputs that the real world contradicted (a label the rehearsal invented,
    then shipped), this asks what a world model is for: given the true state so far, does it foresee what this
    call returns, a failure included?

    Args:
        model: a causal LM on the CPU: ``model(input_ids=ids).logits`` for ids of shape (1, T) gives (1, T, V).
        tokenizer: its tokenizer (decodes each output to tell errors from ordinary outputs).
        demos: SFT-relabelled demonstrations (`agents.training.demonstrations.build_demonstrations`), each with
            ``token_ids`` and ``role_mask`` of length T; every maximal run of ``Role.REHEARSE`` is one output.
        error_kind: the suite's ``Suite.error_kind(output)`` (`envace_gym.suites`), naming the mistake an error
            output shows (the lab's ``breaks``, ``repeat``, ``no_box``, ``no_item``); None: no split by kind.

    Returns:
        ``{"ordinary" | "error" | <error kind>: {"outputs": n >= 1, "exact_match": fraction in [0, 1]}}``, only
        the groups with an output (``{}`` for no demonstrations); an error output counts in ``"error"`` and, with
        `error_kind`, in its kind's group too.
    """
    import torch

    from envace_gym.types import Role
    from wrappers.fidelity import is_error_output

    def groups(text: str) -> set[str]:
        if not is_error_output(text):
            return {"ordinary"}
        return {"error"} | ({error_kind(text)} if error_kind is not None else set())

    tally: dict[str, list[int]] = {}
    rehearse = int(Role.REHEARSE)
    model.eval()
    with torch.no_grad():
        for demo in demos:
            ids = torch.tensor([demo.token_ids])  # (1, T)
            predicted = model(input_ids=ids).logits[0].argmax(-1).tolist()  # (T,): the token after each position
            t, n = 0, len(demo.token_ids)
            while t < n:
                if demo.role_mask[t] != rehearse or t == 0:
                    t += 1
                    continue
                end = t
                while end < n and demo.role_mask[end] == rehearse:
                    end += 1
                exact = all(predicted[i - 1] == demo.token_ids[i] for i in range(t, end))
                text = tokenizer.decode(demo.token_ids[t:end], skip_special_tokens=True)
                for group in groups(text):
                    counts = tally.setdefault(group, [0, 0])
                    counts[0] += exact
                    counts[1] += 1
                t = end
    return {g: {"outputs": n, "exact_match": right / n if n else None} for g, (right, n) in sorted(tally.items())}
