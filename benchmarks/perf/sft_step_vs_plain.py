"""One SFT optimizer step of our trainer against a plain PyTorch loop doing the same work, side by side.

At ``lab-tiny``'s size (0.9M parameters, a vocabulary of about 200 tokens) per-op overhead, not FLOPs, bounds a
step, so what our trainer adds around the model matters. Both sides train a copy of the same model on the
same batches (the trainer's own length-bucketed batches of hidden-rules lab demonstrations):

* **ours**: `agents.training.sft.SFTTrainer.train_step` (collate, `agents.training.logprobs.token_logprobs`, the
  role-weighted loss, AdamW, clipping, the scheduler and the metrics line);
* **plain**: ``model(input_ids, attention_mask).logits``, ``log_softmax``, gather, the same token-mean loss
  over ACT and REHEARSE tokens, backward, clipping, AdamW: a CleanRL-style loop.

Steps alternate (ours, plain, ours, ...) because this machine's speed drifts; the first two of each are
untimed. Prints median seconds per step, tokens per second and the ratio ours / plain.

    .venv/bin/python -m benchmarks.perf.sft_step_vs_plain [--rows 64] [--steps 8] [--threads 2]
"""

from __future__ import annotations

import argparse
import copy
import statistics
import tempfile
import time

import torch


def main(argv: list[str] | None = None) -> dict[str, float]:
    from agents.models import LAB_TINY_MODEL
    from agents.rollout import Role
    from agents.training.sft import SFTConfig, SFTTrainer, collate

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=64, help="rows per batch")
    parser.add_argument("--steps", type=int, default=8, help="timed steps per side")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as run_dir:
        config = SFTConfig(
            run_dir=run_dir,
            model=LAB_TINY_MODEL,
            data=["lab"],
            max_steps=10_000,
            optim={"lr": 1e-3},
            batch_tokens=1 << 20,
            max_batch_rows=args.rows,
            max_seq_len=512,
            memory={"gradient_checkpointing": False},
            run={"save_every": 10_000, "threads": args.threads, "resume": False},
        )
        trainer = SFTTrainer(config, log=None)
        model = copy.deepcopy(trainer.model).train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        targets = torch.tensor([int(Role.ACT), int(Role.REHEARSE)])

        def plain(step: int) -> float:
            t0 = time.perf_counter()
            rows = [trainer.demos[i] for i in trainer.batch_for_step(step)]
            input_ids, attention_mask, role_mask = collate(rows, trainer.pad_id)  # (N, T) each
            logits = model(input_ids=input_ids, attention_mask=attention_mask).logits[:, :-1]  # (N, T-1, V)
            logprobs = torch.log_softmax(logits, -1).gather(-1, input_ids[:, 1:, None])[..., 0]  # (N, T-1)
            mask = torch.isin(role_mask[:, 1:], targets).float()  # (N, T-1)
            loss = -(logprobs * mask).sum() / mask.sum()
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            return time.perf_counter() - t0

        ours_s, plain_s, tokens = [], [], []
        for step in range(args.steps + 2):
            m = trainer.train_step()
            p = plain(step)
            if step >= 2:
                ours_s.append(m["perf/step_s"])
                plain_s.append(p)
                tokens.append(m["perf/tokens_per_s"] * m["perf/step_s"])
    ours, ref, tok = statistics.median(ours_s), statistics.median(plain_s), statistics.median(tokens)
    print(f"rows {args.rows}, {tok:.0f} real tokens per batch, threads {args.threads}, median of {args.steps}")
    print(f"{'':8s}{'s/step':>9s}{'tokens/s':>10s}")
    print(f"{'ours':8s}{ours:9.3f}{tok / ours:10.0f}")
    print(f"{'plain':8s}{ref:9.3f}{tok / ref:10.0f}")
    print(f"ours / plain: {ours / ref:.2f}x")
    return {"ours_s": ours, "plain_s": ref, "ratio": ours / ref}


if __name__ == "__main__":
    main()
