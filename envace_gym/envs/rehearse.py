"""`RehearseEnv`: the tool-use env whose dynamics are the policy's own REHEARSE role (`EnvACE-Rehearse-v0`)."""

from __future__ import annotations

from envace_gym.envs.tool_use import ToolUseEnv

__all__ = ["RehearseEnv"]


class RehearseEnv(ToolUseEnv):
    """`ToolUseEnv` whose default responder is the policy's REHEARSE role (EnvACE, docs/design.md §1).

    ``RehearseEnv(...)`` is ``ToolUseEnv(..., responder=Rehearsal(rehearser))``: every argument, method and
    info key is `ToolUseEnv`'s, and without a ``rehearser`` one is built with ``make_rehearser("policy",
    model=model, prompt_mode=prompt_mode)``. Passing another ``responder`` (``RealBackend()``, a recording)
    plays that one instead, as on ``EnvACE-Tool-v0``.

    ## Version History
    * v0: initial version.
    """

    rehearses_by_default = True
