"""Training: the role-wise GRPO trainer, the SFT warm start and what both stand on.

* `agents.training.trainer`: `RoleWiseGRPOTrainer`, role-wise GRPO over ``EnvACE-Rehearse-v0``.
* `agents.training.sft`: `SFTTrainer`, the supervised warm start of both roles.
* `agents.training.demonstrations`: demonstrations from real executions and recorded rollouts.
* `agents.training.budgets`: whether the configured budgets leave the selected tasks completable.
* `agents.training.logprobs`: selected-token logprobs with a chunked LM head.
* `agents.training.optim`: process set-up, the LR schedule, AdamW settings and length-bucketed batches.
* `agents.training.checkpoint`, `agents.training.run_folder`: crash-safe checkpoints and run folders.
* `agents.training.distributed`: data-parallel processes (Accelerate, FSDP2).
* `agents.training.allocator`: glibc's mmap threshold, so freed activations leave the resident set.
* `agents.training.trl_adapter`: EnvACE rollouts inside TRL's ``GRPOTrainer`` (the real-tool baseline).

Nothing is imported here: ``import agents.training.run_folder`` loads that module alone.
"""
