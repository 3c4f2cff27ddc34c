"""envace-gym: EnvACE (world rehearsal for agentic RL) as Gymnasium environments.

Importing this package registers the environment ids with string entry points; no model is loaded
until an environment that needs one is made.
"""

from envace_gym.types import Message, Role, Segment, Task, ToolCall, ToolSpec, Trajectory

__all__ = ["Message", "Role", "Segment", "Task", "ToolCall", "ToolSpec", "Trajectory"]
__version__ = "0.1.0"
