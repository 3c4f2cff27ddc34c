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
(`test_lab_learning_hidden.py`) trains with real-backend rollouts, whose gain resolves on 7 of 9 seeds.

What the margin does not cover: GRPO samples at temperature 1, so a machine whose kernels round differently
(another torch build, AVX-512 instead of AVX2) plays another random draw, not a small perturbation of this one.
Three draws are measured (seed 0 twice with the same result, seed 1); if this fails on new hardware, run it
with `GRPO_SEED = 1` before blaming the code, and report both.
"""

from __future__ import annotations

import dataclasses
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


@pytest.fixture
def two_threads():
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(2)  # the measured runs' setting, whatever the machine's core count
    yield
    torch.set_num_threads(before)


def test_role_wise_grpo_solves_more_test_tasks_than_its_warm_start(tmp_path, two_threads):
    from agents.config import load_dataclass, replace_fields
    from agents.models import default_store
    from agents.pipeline import PipelineConfig, StageRunner, grpo_stage, latest_model, sft_stage
    from agents.training.run_folder import read_jsonl

    recipe = load_dataclass(PipelineConfig, str(RECIPE), run_dir=str(tmp_path), threads=2)
    recipe = dataclasses.replace(recipe, eval=dataclasses.replace(recipe.eval, limit=TASKS_PER_FAMILY))
    models = default_store()
    stages = StageRunner(tmp_path)
    stages.stage("sft", lambda folder: sft_stage(recipe, folder, models))
    warm = latest_model(tmp_path / "sft")
    config = replace_fields(
        recipe.grpo_config(tmp_path / "grpo", warm),
        {"num_steps": GRPO_STEPS, "run.save_every": GRPO_STEPS, "seed": GRPO_SEED},
    )
    trained_info = stages.stage("grpo", lambda _: grpo_stage(config, models))
    trained = latest_model(tmp_path / "grpo")
    assert sum(trained_info["groups_with_reward_variance"]) > 0  # some step had advantages to learn from

    before = stages.evaluate("eval_sft", recipe.eval_config(tmp_path / "eval_sft", warm), models)
    after = stages.evaluate("eval_grpo", recipe.eval_config(tmp_path / "eval_grpo", trained), models)
    assert before["n_tasks"] == after["n_tasks"] == 6 * TASKS_PER_FAMILY

    def rewards(stage: str) -> dict[str, float]:
        return {e["task_id"]: e["reward"] for e in read_jsonl(tmp_path / stage / "episodes.jsonl")}

    sft, grpo = rewards("eval_sft"), rewards("eval_grpo")
    gained = sorted(t for t in sft if grpo[t] > sft[t])
    lost = sorted(t for t in sft if grpo[t] < sft[t])
    report = (
        f"warm start {before['accuracy']:.3f} -> GRPO {after['accuracy']:.3f} on {len(sft)} test tasks; "
        f"gained {gained}, lost {lost}"
    )
    print(report)
    assert len(gained) - len(lost) >= MIN_GAINED_MINUS_LOST, report
