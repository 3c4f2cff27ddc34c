"""Tiny Llamas whose weights are set so that they answer one fixed text to any prompt: real Transformers models
that a judge test can serve and parse (a trained judge would take minutes on these CPUs).

The model is `agents.models.tiny_random_model` with untied embeddings and every attention and MLP output projection
zeroed, so each layer passes its input through and the logits at a position depend on that position's token only:
a bigram table. The embedding of each token of the chain (the generation prompt's last token, then the reply's
tokens) is its own basis vector, and the LM-head row of the next token points along it, so greedy decoding walks
the chain and stops at the end-of-message token.
"""

from __future__ import annotations

from typing import Any

import torch

from agents.models import tiny_random_model
from agents.policy import Policy


def fixed_reply_policy(tokenizer: Any, reply: str, after: str | None = None) -> Policy:
    """A `Policy` whose model greedily answers `reply` (then ``<|im_end|>``) after any chat prompt, or, with
    `after`, after a prompt that ends with the ids of that text (a judge's reply prefix).

    Raises:
        ValueError: the chain repeats a token (a bigram table cannot tell its two successors apart).
    """
    model = tiny_random_model(seed=0, tie_word_embeddings=False)
    policy = Policy(model, tokenizer, kv_cache=False)
    r = policy.renderer
    start = r.content_ids(after)[-1] if after else r.generation_prompt_ids[-1]
    chain = [start, *r.content_ids(reply), *r.generation_end_ids("assistant")]
    if len(set(chain[:-1])) != len(chain) - 1:
        raise ValueError(f"the reply {reply!r} repeats a token; choose another text")
    hidden = model.config.hidden_size
    if len(chain) > hidden:
        raise ValueError(f"the reply is {len(chain)} tokens, more than the hidden size {hidden}")
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        emb = model.model.embed_tokens.weight
        head = model.lm_head.weight
        emb.zero_()
        head.zero_()
        for i, (a, b) in enumerate(zip(chain, chain[1:])):
            emb[a, i] = 1.0
            head[b, i] = 100.0
    return policy
