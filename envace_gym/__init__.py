"""envace-gym: EnvACE (world rehearsal for agentic RL) as Gymnasium environments.

Importing this package registers the environment ids with string entry points (Gymnasium's lazy
registration), so no model and no benchmark data is loaded until an environment is made:

* ``EnvACE-Tool-v0``: `envace_gym.envs.tool_use.ToolUseEnv`, the token-level env answered by the suite's
  real tool backends (a text agent can ignore the tokens; the tokenizer is ``model``'s, no weights load).
* ``EnvACE-Rehearse-v0``: `envace_gym.envs.rehearse.RehearseEnv`, the same env answered by the policy's
  REHEARSE role.
* ``EnvACE-LabDiscrete-v0``: `benchmarks.lab.discrete.LabDiscreteEnv`, the lab world with discrete actions and
  a one-hot observation, for stable-baselines3 (the model-free baseline), stated rules.
* ``EnvACE-LabHiddenDiscrete-v0``: `benchmarks.lab.discrete_hidden.LabHiddenDiscreteEnv`, the same for the
  hidden-rules world (the observation holds what the prompt and the tool outputs so far show).
"""

from gymnasium.envs.registration import register, registry

from envace_gym.types import Message, Role, Segment, Task, ToolCall, ToolSpec, Trajectory

__all__ = ["Message", "Role", "Segment", "Task", "ToolCall", "ToolSpec", "Trajectory"]
__version__ = "0.1.0"

if "EnvACE-Tool-v0" not in registry:
    register(
        id="EnvACE-Tool-v0",
        entry_point="envace_gym.envs.tool_use:ToolUseEnv",
        kwargs={
            "suite": "bfcl",
            "categories": None,
            "split": "train",
            "max_steps_per_turn": 20,
            "model": "smollm2-135m",
        },
        disable_env_checker=False,
    )

if "EnvACE-Rehearse-v0" not in registry:
    register(
        id="EnvACE-Rehearse-v0",
        entry_point="envace_gym.envs.rehearse:RehearseEnv",
        vector_entry_point="envace_gym.envs.rehearse_vector:RehearseVectorEnv",
        kwargs={
            "suite": "bfcl",
            "categories": None,
            "split": "train",
            "model": "smollm2-135m",
            "prompt_mode": "inline",
            "max_new_tokens": 256,
            "temperature": 1.0,
            "max_steps_per_turn": 20,
        },
    )

if "EnvACE-LabDiscrete-v0" not in registry:
    register(
        id="EnvACE-LabDiscrete-v0",
        entry_point="benchmarks.lab.discrete:LabDiscreteEnv",
        kwargs={"suite": "lab-stated", "split": "train", "max_steps": 8},
    )

if "EnvACE-LabHiddenDiscrete-v0" not in registry:
    register(
        id="EnvACE-LabHiddenDiscrete-v0",
        entry_point="benchmarks.lab.discrete_hidden:LabHiddenDiscreteEnv",
        kwargs={"suite": "lab", "split": "train", "max_steps": 8},
    )
