"""Learning regression: role-wise GRPO on EnvACE-Lab must beat its warm start on the test split.

The stated-rules lab recipe (`configs/recipes/lab-stated.yaml`) end to end with `smollm2-lab` and nothing replaced: its
SFT warm start (seed 0), then its role-wise GRPO stage (rehearsed rollouts, B=6 x K=4, lr 5e-6) for `GRPO_STEPS` steps,
both scored greedily on the same 48 test tasks (8 per family) against the real backend. The margin comes from the
measured spread (measured 2026-12-03): from this warm start, 8 steps gave 0.583 -> 0.646 (+3 of 48 tasks, none
lost) with GRPO seed 0 and with seed 1; 4 and 6 steps gave +1 to +2. `MIN_GAINED_MINUS_LOST` asks for one task
more than the warm start solves, net of any lost, two less than either seed gained; a trainer that stops updating (the
gain is then exactly 0) or follows the wrong sign (lr 2e-5 already lost 10 tasks) fails it.

Why the stated-rules world and not the default hidden-rules one: there role-wise GRPO's gain over its warm start is
not large enough for one run to resolve. At the recipe's 20 steps it was resolved (exact McNemar p < 0.05 on 600 test
tasks) on 2 of 10 seeds (`benchmarks.experiments.lab_ablations`), and from a weaker warm start (300 SFT steps,
success 0.297 on 300 test tasks) 20 steps gave +15/-11 tasks (p = 0.56, measured 2026-12-05). A test that passes on
one chosen seed of such a spread would be a seed tuned toward the result. The hidden world's own learning test
(`test_lab_learning_hidden.py`) trains with real-backend rollouts, whose gain at 120 steps resolves on 9 of 9 seeds.

What the margin does not cover: GRPO samples at temperature 1, so a machine whose kernels round differently
(another torch build, AVX-512 instead of AVX2) plays another random draw, not a small perturbation of this one.
Three draws are measured (seed 0 twice with the same result, seed 1); if this fails on new hardware, run it
with `GRPO_SEED = 1` before blaming the code, and report both.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = (
    pytest.mark.slow
)  # 26 minutes on 2 cores: SFT 4.3 min, 8 GRPO steps 16 min, 2 evaluations of 48 tasks 4.6 min

RECIPE = Path(__file__).resolve().parents[3] / "configs" / "recipes" / "lab-stated.yaml"
GRPO_STEPS = 8
TASKS_PER_FAMILY = 8
GRPO_SEED = 0
MIN_GAINED_MINUS_LOST = 1
"""Test tasks GRPO must solve that the warm start did not, net of those it lost (paired, task by task)."""


def test_role_wise_grpo_solves_more_test_tasks_than_its_warm_start(grpo_against_warm_start):
    changes = {"num_steps": GRPO_STEPS, "run.save_every": GRPO_STEPS, "seed": GRPO_SEED}
    result = grpo_against_warm_start(RECIPE, threads=2, limit=TASKS_PER_FAMILY, grpo_changes=changes)
    assert sum(result["groups_with_reward_variance"]) > 0  # some step had advantages to learn from
    assert result["n_tasks"] == 6 * TASKS_PER_FAMILY
    gained, lost = result["gained"], result["lost"]
    report = (
        f"warm start {result['accuracy_before']:.3f} -> GRPO {result['accuracy_after']:.3f} on {result['n_tasks']} "
        f"test tasks; gained {gained}, lost {lost}"
    )
    print(report)
    assert len(gained) - len(lost) >= MIN_GAINED_MINUS_LOST, report
