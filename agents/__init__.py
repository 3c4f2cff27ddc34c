"""The model side of EnvACE: a Transformers causal LM that acts and rehearses, trained with SFT and role-wise GRPO.

Read first (the algorithm, at the top of the package):

* `agents.grpo`: role-wise advantages and the GRPO loss, as pure functions.
* `agents.rollout`: drive the vector env, fill a `RolloutBatch`.
* `agents.policy`: the `Policy` (generation with logprobs) and its rehearser.
* `agents.config`: `TrainConfig`, the GRPO trainer's settings, and the groups of settings it shares with SFT
  (`RunConfig`, `OptimConfig`, `MemoryConfig`); `agents.models`: loading models and tokenizers.
* `agents.pipeline`: the recipe, eval -> SFT -> GRPO -> eval (``make demo``); `agents.users`: a model as the
  simulated user.

Judge rewards: `agents.judges` (`LocalJudge`, `OpenAIJudge`) and `agents.serving` (the OpenAI-compatible server of
``envace serve``).

Then by concern: `agents.engines` (what samples tokens), `agents.training` (the trainers and what they stand
on), `agents.evaluation` (real-backend evaluation, plots) and `agents.cli` (the ``envace`` command).

The public names below import lazily (PEP 562): ``import agents`` loads neither torch nor Transformers, and
``agents.RoleWiseGRPOTrainer`` imports its module on first use. Each is also importable from its module (the
table `PUBLIC` gives it).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

PUBLIC: dict[str, str] = {
    # training
    "RoleWiseGRPOTrainer": "agents.training.trainer",
    "TrainConfig": "agents.config",
    "RunConfig": "agents.config",
    "OptimConfig": "agents.config",
    "MemoryConfig": "agents.config",
    "load_config": "agents.config",
    "SFTTrainer": "agents.training.sft",
    "SFTConfig": "agents.training.sft",
    "build_demonstrations": "agents.training.demonstrations",
    # evaluation and the recipe
    "evaluate": "agents.evaluation.evaluate",
    "EvalConfig": "agents.evaluation.evaluate",
    "EvalResult": "agents.evaluation.evaluate",
    "PipelineConfig": "agents.pipeline",
    "run_pipeline": "agents.pipeline",
    # the policy, its models and engines
    "Policy": "agents.policy",
    "PolicyRehearser": "agents.policy",
    "load_policy": "agents.policy",
    "make_policy_rehearser": "agents.policy",
    "ModelStore": "agents.models",
    "load_model": "agents.models",
    "load_tokenizer": "agents.models",
    "load_model_and_tokenizer": "agents.models",
    "GenerationEngine": "agents.engines.registry",
    "HFEngine": "agents.engines.registry",
    "make_engine": "agents.engines.registry",
    "register_engine": "agents.engines.registry",
    "registered_engines": "agents.engines.registry",
    # judge rewards and the chat server
    "LocalJudge": "agents.judges",
    "OpenAIJudge": "agents.judges",
    "make_chat_app": "agents.serving",
    "ChatServer": "agents.serving",
    # the algorithm
    "collect_rollouts": "agents.rollout",
    "RolloutBatch": "agents.rollout",
    "role_wise_advantages": "agents.grpo",
    "grpo_loss": "agents.grpo",
}
"""Public name -> the module that defines it."""

__all__ = list(PUBLIC)

if TYPE_CHECKING:  # the same names, re-exported for type checkers and editors (a test checks they agree)
    from agents.config import MemoryConfig as MemoryConfig
    from agents.config import OptimConfig as OptimConfig
    from agents.config import RunConfig as RunConfig
    from agents.config import TrainConfig as TrainConfig
    from agents.config import load_config as load_config
    from agents.engines.registry import GenerationEngine as GenerationEngine
    from agents.engines.registry import HFEngine as HFEngine
    from agents.engines.registry import make_engine as make_engine
    from agents.engines.registry import register_engine as register_engine
    from agents.engines.registry import registered_engines as registered_engines
    from agents.evaluation.evaluate import EvalConfig as EvalConfig
    from agents.evaluation.evaluate import EvalResult as EvalResult
    from agents.evaluation.evaluate import evaluate as evaluate
    from agents.grpo import grpo_loss as grpo_loss
    from agents.grpo import role_wise_advantages as role_wise_advantages
    from agents.judges import LocalJudge as LocalJudge
    from agents.judges import OpenAIJudge as OpenAIJudge
    from agents.models import ModelStore as ModelStore
    from agents.models import load_model as load_model
    from agents.models import load_model_and_tokenizer as load_model_and_tokenizer
    from agents.models import load_tokenizer as load_tokenizer
    from agents.pipeline import PipelineConfig as PipelineConfig
    from agents.pipeline import run_pipeline as run_pipeline
    from agents.policy import Policy as Policy
    from agents.policy import PolicyRehearser as PolicyRehearser
    from agents.policy import load_policy as load_policy
    from agents.policy import make_policy_rehearser as make_policy_rehearser
    from agents.rollout import RolloutBatch as RolloutBatch
    from agents.rollout import collect_rollouts as collect_rollouts
    from agents.serving import ChatServer as ChatServer
    from agents.serving import make_chat_app as make_chat_app
    from agents.training.demonstrations import build_demonstrations as build_demonstrations
    from agents.training.sft import SFTConfig as SFTConfig
    from agents.training.sft import SFTTrainer as SFTTrainer
    from agents.training.trainer import RoleWiseGRPOTrainer as RoleWiseGRPOTrainer


def __getattr__(name: str) -> Any:
    """Import a public name's module on first use (PEP 562) and keep the name here."""
    module = PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'agents' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
