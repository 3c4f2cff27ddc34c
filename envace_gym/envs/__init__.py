"""The environments: `ToolUseEnv` (real tools) and `RehearseEnv` (the policy's REHEARSE role as dynamics)."""
