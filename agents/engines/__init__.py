"""Generation engines: what samples tokens for `agents.policy.Policy` (both roles, ACT and REHEARSE).

* `agents.engines.registry`: the `GenerationEngine` protocol, the Transformers engines (``"hf"``,
  ``"hf-nocache"``, ``"hf-generate"``) and the registry that picks one by name (`register_engine`,
  `make_engine`).
* `agents.engines.generation`: batched sampling with Transformers forward passes, logprobs recorded.
* `agents.engines.kv_cache`: the per-trajectory prefix KV cache that lets multi-turn rollouts feed each token once.
* `agents.engines.decode`: the lean decode step (one token per row without the Transformers module stack).
* `agents.engines.batching`: merging the calls of several environments into one batched call.
* `agents.engines.vllm_engine`: vLLM in this process (the optional ``vllm`` extra).

Nothing is imported here: ``import agents.engines.kv_cache`` loads that module alone.
"""
