"""The environments.

* `TextToolUseEnv` (`envace_gym.envs.text`): the rules of a tool-use task, text in and text out.
* `ToolUseEnv` (`envace_gym.envs.tool_use`, ``EnvACE-Tool-v0``): the same task keeping its token sequence,
  with a pluggable responder (the real backend by default).
* `RehearseEnv` (`envace_gym.envs.rehearse`, ``EnvACE-Rehearse-v0``): `ToolUseEnv` answered by the policy's
  REHEARSE role.
* `RehearseVectorEnv` (`envace_gym.envs.rehearse_vector`): N token-level envs with one batched rehearsal
  per round.
"""
