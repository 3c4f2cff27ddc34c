"""Can a model much cheaper than ``smollm2-lab`` learn EnvACE-Lab by SFT on 2 CPU cores?
(how the lab's model was chosen)

Builds a randomly initialised Llama from a config with ``smollm2-lab``'s tokenizer (the lab world's ~630
tokens; tied embeddings, head size 64, MLP width 3 x hidden), fine-tunes it on real executions of the
reference solutions of a large generated lab corpus (both roles, `agents.training.sft.SFTTrainer`), then scores it
greedily on the standard lab test split against the real backend (`agents.evaluation.evaluate`), with the evaluation
budget of ``configs/recipes/lab-stated.yaml`` (tokens per message, messages per turn). ``--init smollm2-prefix`` starts
instead from ``smollm2-lab``'s first ``--layers`` decoder layers (pretrained weights, the cut vocabulary).

The corpus is the ``lab-stated`` suite's generator with another task seed (``LabConfig(rules="stated",
seed=--corpus-seed, tasks_per_category=--tasks-per-family)``, registered as suite ``lab-corpus``, split ``all``); the
script refuses to train when any corpus task's prompt (the warehouse layout together with the instruction) equals a
test-split task's, so the score is on unseen tasks. An instruction alone may recur under another layout.

Printed: parameters, SFT seconds and trained tokens/s, the last step's ACT and REHEARSE losses, test success
per family and overall, parse errors per task and the fraction of ACT steps that made a tool call.

    .venv/bin/python -m benchmarks.experiments.lab_small_model   # 0.9M Llama, 6,000 tasks, 1,200 steps (~25 min)
    .venv/bin/python -m benchmarks.experiments.lab_small_model --steps 50 --tasks-per-family 20 --limit 1  # smoke run

It is the probe behind `agents.models.LAB_MODEL_LAYERS`: on the stated-rules world with a byte-level
tokenizer, a model this small learns the call format but not to copy an item from the instruction.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

RECIPE = Path(__file__).resolve().parents[2] / "configs" / "recipes" / "lab-stated.yaml"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="runs/lab_small_model", help="folder of the initial model, SFT run and evaluation")
    ap.add_argument(
        "--init",
        choices=("random", "smollm2-prefix"),
        default="random",
        help="a random Llama from a config, or smollm2-lab's first --layers layers",
    )
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=128, help="hidden size (a multiple of 64; --init random only)")
    ap.add_argument("--tasks-per-family", type=int, default=1000, help="corpus tasks per lab family (x6 families)")
    ap.add_argument("--corpus-seed", type=int, default=1, help="task seed of the corpus (the lab suite's is 0)")
    ap.add_argument("--steps", type=int, default=1200, help="SFT optimizer steps")
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--batch-tokens", type=int, default=8192)
    ap.add_argument("--limit", type=int, default=8, help="test tasks per family (8: the ablations' 48 tasks)")
    ap.add_argument("--seed", type=int, default=0, help="initialisation and batch-order seed")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    if args.layers < 1 or args.steps < 1 or args.tasks_per_family < 2 or args.limit < 1:
        ap.error("--layers, --steps and --limit must be >= 1 and --tasks-per-family >= 2")
    if args.init == "random" and (args.hidden < 64 or args.hidden % 64):
        ap.error(f"--hidden must be a positive multiple of 64 (the head size), got {args.hidden}")
    return args


def _prompts(task) -> str:
    """Everything a task shows the policy: the opening (layout) and every user turn, as one comparable string."""
    return repr([[m.content for m in turn] for turn in task.turns])


def build_initial_model(args: argparse.Namespace, folder: Path, tokenizer) -> int:
    """Write the initial model and tokenizer to `folder`; returns its parameter count."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    from agents.models import ensure_lab_model

    torch.manual_seed(args.seed)
    if args.init == "random":
        heads = args.hidden // 64
        config = LlamaConfig(
            vocab_size=len(tokenizer),
            hidden_size=args.hidden,
            intermediate_size=3 * args.hidden,
            num_hidden_layers=args.layers,
            num_attention_heads=heads,
            num_key_value_heads=heads,
            head_dim=64,
            max_position_embeddings=2048,
            tie_word_embeddings=True,
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    else:
        model = AutoModelForCausalLM.from_pretrained(ensure_lab_model(), dtype=torch.float32)
        model.model.layers = model.model.layers[: args.layers]
        model.config.num_hidden_layers = args.layers
        if getattr(model.config, "layer_types", None):
            model.config.layer_types = model.config.layer_types[: args.layers]
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return sum(p.numel() for p in model.parameters())


def run(args: argparse.Namespace, log=print) -> dict:
    import torch

    from agents.config import load_dataclass
    from agents.evaluation.evaluate import EvalConfig, evaluate
    from agents.models import LAB_MODEL, default_store
    from agents.pipeline import PipelineConfig, latest_model
    from agents.training.sft import SFTConfig, SFTTrainer
    from benchmarks.lab import LabConfig
    from benchmarks.lab.suite import LabSuite
    from envace_gym.suites import make_suite, register_suite

    torch.set_num_threads(args.threads)
    out = Path(args.out)
    corpus = LabSuite(LabConfig(rules="stated", seed=args.corpus_seed, tasks_per_category=args.tasks_per_family))
    register_suite("lab-corpus", lambda: corpus)
    test_prompts = {_prompts(t) for t in make_suite("lab-stated").tasks(None, "test")}
    shared = [t.id for t in corpus.tasks(None, "all") if _prompts(t) in test_prompts]
    if shared:
        raise SystemExit(
            f"{len(shared)} corpus tasks have a test-split prompt (e.g. {shared[:3]}); choose another --corpus-seed"
        )
    store = default_store()
    tokenizer = store.tokenizer(LAB_MODEL)
    # a rerun into the same folder reuses its initial model and finished SFT run: only with the same settings
    settings = {k: v for k, v in vars(args).items() if k not in ("out", "limit", "threads")}
    saved = out / "settings.json"
    if saved.is_file() and json.loads(saved.read_text()) != settings:
        raise SystemExit(f"{out} holds a run with other settings ({saved}); use another --out")
    out.mkdir(parents=True, exist_ok=True)
    saved.write_text(json.dumps(settings, indent=1))
    init = out / "init"
    if (init / "config.json").is_file():
        from transformers import AutoModelForCausalLM

        params = sum(p.numel() for p in AutoModelForCausalLM.from_pretrained(init).parameters())
    else:
        params = build_initial_model(args, init, tokenizer)
    log(
        f"[small-model] {args.init}, {args.layers} layers, {params / 1e6:.2f}M parameters; corpus "
        f"{6 * args.tasks_per_family} tasks (seed {args.corpus_seed}), none with a test prompt"
    )

    t0 = time.perf_counter()
    sft = SFTConfig(
        run_dir=str(out / "sft"),
        model=str(init),
        data=["lab-corpus"],
        categories=[],
        split="all",
        max_steps=args.steps,
        batch_tokens=args.batch_tokens,
        max_batch_rows=24,
        optim={"lr": args.lr, "lr_schedule": "cosine", "warmup_steps": min(100, args.steps // 10)},
        max_seq_len=1024,
        memory={"gradient_checkpointing": False},
        run={"save_every": args.steps, "threads": args.threads},
        seed=args.seed,
    )
    history = SFTTrainer(sft, models=store).train()
    sft_s = time.perf_counter() - t0
    last = history[-1] if history else {}
    tokens = sum(h.get("data/tokens/act", 0) + h.get("data/tokens/rehearse", 0) for h in history)

    t0 = time.perf_counter()
    budget = load_dataclass(PipelineConfig, RECIPE).eval
    evaluation = EvalConfig(
        model=latest_model(out / "sft"),
        suite="lab-stated",
        categories=[],
        split="test",
        limit=args.limit,
        max_new_tokens=budget.max_new_tokens,
        max_steps_per_turn=budget.max_steps_per_turn,
        temperature=0.0,
        out=str(out / "eval"),
        overwrite=True,
    )
    result = evaluate(evaluation, models=store)
    eval_s = time.perf_counter() - t0
    overall = result.summary[-1]
    report = {
        "parameters": params,
        "sft_s": sft_s,
        "trained_target_tokens_per_s": tokens / sft_s if history else None,
        "act_loss": last.get("train/loss/act"),
        "rehearse_loss": last.get("train/loss/rehearse"),
        "test_success": {r["category"]: r["accuracy"] for r in result.summary},
        "test_tasks": overall["n_tasks"],
        "parse_errors_per_task": overall["parse_errors_per_task"],
        "tool_call_fraction": overall["tool_call_fraction"],
        "eval_s": eval_s,
    }
    log(
        f"[small-model] SFT {args.steps} steps in {sft_s:.0f} s ({report['trained_target_tokens_per_s'] or 0:.0f} "
        f"trained target tokens/s); last step: ACT loss {report['act_loss']}, REHEARSE loss {report['rehearse_loss']}"
    )
    log(
        f"[small-model] test success on {overall['n_tasks']} tasks: "
        + ", ".join(f"{k} {v:.3f}" for k, v in report["test_success"].items())
        + f"; parse errors per task {overall['parse_errors_per_task']:.2f}, ACT steps with a call "
        f"{overall['tool_call_fraction']:.2f} ({eval_s:.0f} s)"
    )
    return report


def main(argv: list[str] | None = None) -> dict:
    return run(parse_args(argv))


if __name__ == "__main__":
    main()
