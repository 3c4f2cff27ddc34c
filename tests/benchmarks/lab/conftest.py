"""Shared by the lab's learning regression tests (`test_lab_learning.py`, `test_lab_learning_hidden.py`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest


@pytest.fixture
def grpo_against_warm_start(tmp_path: Path) -> Callable[..., dict[str, Any]]:
    """A function that runs a recipe's SFT warm start, then its GRPO stage with `grpo_changes`, scores both greedily
    on the same test tasks against the real backend, and returns ``accuracy_before``, ``accuracy_after``, the
    ``gained`` and ``lost`` task ids (paired, task by task), ``n_tasks`` and ``groups_with_reward_variance`` (per
    GRPO step). `threads` torch threads (the measured runs' setting), restored afterwards; `limit` test tasks per
    family (None: all)."""

    def run(recipe_path: Path, threads: int, limit: int | None, grpo_changes: dict[str, Any]) -> dict[str, Any]:
        import torch

        from agents.config import load_dataclass, replace_fields
        from agents.models import default_store
        from agents.pipeline import PipelineConfig, StageRunner, grpo_stage, latest_model, sft_stage
        from agents.training.run_folder import read_jsonl

        before_threads = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            recipe = load_dataclass(PipelineConfig, str(recipe_path), run_dir=str(tmp_path), threads=threads)
            recipe = dataclasses.replace(recipe, eval=dataclasses.replace(recipe.eval, limit=limit))
            models = default_store()
            stages = StageRunner(tmp_path)
            stages.stage("sft", lambda folder: sft_stage(recipe, folder, models))
            warm = latest_model(tmp_path / "sft")
            config = replace_fields(recipe.grpo_config(tmp_path / "grpo", warm), grpo_changes)
            trained_info = stages.stage("grpo", lambda _: grpo_stage(config, models))
            trained = latest_model(tmp_path / "grpo")
            before = stages.evaluate("eval_sft", recipe.eval_config(tmp_path / "eval_sft", warm), models)
            after = stages.evaluate("eval_grpo", recipe.eval_config(tmp_path / "eval_grpo", trained), models)
        finally:
            torch.set_num_threads(before_threads)
        assert before["n_tasks"] == after["n_tasks"]

        def rewards(stage: str) -> dict[str, float]:
            return {e["task_id"]: e["reward"] for e in read_jsonl(tmp_path / stage / "episodes.jsonl")}

        sft, grpo = rewards("eval_sft"), rewards("eval_grpo")
        return {
            "accuracy_before": before["accuracy"],
            "accuracy_after": after["accuracy"],
            "gained": sorted(t for t in sft if grpo[t] > sft[t]),
            "lost": sorted(t for t in sft if grpo[t] < sft[t]),
            "n_tasks": before["n_tasks"],
            "groups_with_reward_variance": trained_info["groups_with_reward_variance"],
        }

    return run
