"""GPU check: role-wise GRPO steps with the Transformers engine on CUDA beside the same steps on CPU.

Run it through ``bash benchmarks/gpu_check.sh`` (one command; under 10 minutes on one GPU). What a stock
PyTorch GPU machine lacks is carried along: SmolLM2-135M's config and tokenizer (a few MB; the 98 MB GGUF
and the 538 MB converted weights are not), with random weights built from the config at seed 0 (fine for
speed and memory, meaningless for reward), and the wheels of the project's pure-Python dependencies the
trainer imports (gymnasium and its two small dependencies). ``--prepare`` writes both under
``benchmarks/gpu_assets/`` on a machine that has the project's venv and SmolLM2 cache.

Workload (the same for every setting): EnvACE-Lab train tasks (``ship``, ``relocate``), B instructions x K
samples, rehearsed rollouts, one optimizer step per batch. Random weights earn no reward, so every
advantage is 0; ``skip_empty_updates=False`` makes the update run anyway, with the same forward and backward
work as a step with a learning signal.

Printed per setting (CUDA bfloat16, CUDA float32, CPU float32): generated tokens/s in the rollouts, step,
rollout and update seconds (mean over the steps after the first, which carries one-time costs), peak GPU
memory (``torch.cuda.max_memory_allocated``) and the trainer's ``train/logprob_mismatch`` (mean
abs(log pi_trainer - log pi_engine) over loss tokens); then CUDA's speed-ups over CPU.

Where vLLM is importable (a CUDA build installed beforehand, ``pip install vllm``: the check fetches nothing),
the vLLM engine is checked on CUDA too (`vllm_engine_check`, float32): greedy ids and
logprobs against the HF engine on the same weights, again after an AdamW step and `weights_updated` (the
layerwise reload; the weight-transfer API's IPC backend is for a trainer in another process), and sleep mode
(the GPU memory `sleep` frees, and the same output after `wake_up`); then the GRPO steps run with
``--engine vllm`` in bfloat16 beside the HF rows.

    python -m benchmarks.perf.gpu_check --prepare            # here: write benchmarks/gpu_assets/
    bash benchmarks/gpu_check.sh                              # there: prepare if needed, install wheels, run
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ASSETS = REPO / "benchmarks" / "gpu_assets"
MODEL_ASSETS = ASSETS / "smollm2-135m"
WHEELS = ASSETS / "wheels"
WHEEL_PACKAGES = ("gymnasium", "farama-notifications", "cloudpickle")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


def prepare() -> None:
    """Write SmolLM2-135M's config and tokenizer (no weights) and the dependency wheels under ASSETS."""
    from agents.models import default_store

    store = default_store()
    tokenizer = store.tokenizer("smollm2-135m")
    MODEL_ASSETS.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(str(MODEL_ASSETS))
    store.model("smollm2-135m").config.save_pretrained(str(MODEL_ASSETS))  # the config only, no weights
    WHEELS.mkdir(parents=True, exist_ok=True)
    pins = [f"{p}=={importlib.metadata.version(p)}" for p in WHEEL_PACKAGES]
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(WHEELS), *pins], check=True)
    sizes = {p.name: p.stat().st_size for p in sorted(ASSETS.rglob("*")) if p.is_file()}
    print(json.dumps({"assets": str(ASSETS), "files": sizes}, indent=1))


def random_model(out: Path) -> Path:
    """SmolLM2-135M's architecture with random weights (seed 0) and its tokenizer, saved to `out`."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(str(MODEL_ASSETS))
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    model.save_pretrained(str(out))
    for name in TOKENIZER_FILES:
        if (MODEL_ASSETS / name).is_file():
            shutil.copy(MODEL_ASSETS / name, out / name)
    return out


def vllm_engine_check(model_dir: Path, new_tokens: int = 24, device: str = "cuda") -> dict:
    """The vLLM engine against the HF engine on `device`, float32, the model in `model_dir`: greedy ids and
    logprobs before and after an AdamW step pushed with `weights_updated`, and sleep/wake. Returns the
    measurements (a failed check is a False or a large number, not an exception)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agents.engines.registry import HFEngine
    from agents.engines.vllm_engine import VLLMEngine
    from agents.training.logprobs import token_logprobs

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    texts = ["Ship the lamp from the north dock.", "Which shelf holds the kettle?", "List every item. " * 40]
    prompts = [
        tok.encode(
            tok.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True, tokenize=False),
            add_special_tokens=False,
        )
        for t in texts
    ]
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).to(device).eval()
    t0 = time.perf_counter()
    engine = VLLMEngine(model, 2, enforce_eager=True)
    build_s = time.perf_counter() - t0
    hf = HFEngine(model, 2, kv_cache=False)
    kw = dict(max_new_tokens=new_tokens, temperature=0.0, stop_ids=[])

    def compare() -> tuple[bool, float]:
        a, b = engine.generate(prompts, **kw), hf.generate(prompts, **kw)
        same = all(x.token_ids == y.token_ids for x, y in zip(a, b))
        diff = max(abs(p - q) for x, y in zip(a, b) for p, q in zip(x.logprobs, y.logprobs))
        return same, diff

    same_before, diff_before = compare()
    target = torch.tensor([prompts[0] + prompts[1]], device=device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model.train()
    (-token_logprobs(model, target, torch.ones_like(target)).sum()).backward()
    optimizer.step()
    model.eval()
    t0 = time.perf_counter()
    engine.weights_updated()
    sync_s = time.perf_counter() - t0
    same_after, diff_after = compare()
    out = engine.generate(prompts, **kw)
    free_awake = torch.cuda.mem_get_info()[0] if device.startswith("cuda") else 0
    engine.sleep()
    freed_gib = (torch.cuda.mem_get_info()[0] - free_awake) / 2**30 if device.startswith("cuda") else 0.0
    woken = engine.generate(prompts, **kw)  # wakes it
    return {
        "setting": f"vllm engine check, {device} float32",
        "build_s": build_s,
        "greedy_ids_equal": same_before,
        "max_abs_logprob_diff": diff_before,
        "greedy_ids_equal_after_step_and_sync": same_after,
        "max_abs_logprob_diff_after_sync": diff_after,
        "sync_s": sync_s,
        "sleep_available": engine.sleep_between_updates,
        "sleep_freed_gib": freed_gib,
        "same_output_after_wake": [g.token_ids for g in woken] == [g.token_ids for g in out],
    }


def run_setting(
    model: Path, device: str, dtype: str, args: argparse.Namespace, run_dir: Path, engine: str = "hf"
) -> dict:
    """`args.steps` GRPO steps on `device` in `dtype` with `engine`; the per-step metrics and peak GPU memory."""
    import torch

    from agents.config import TrainConfig
    from agents.training.trainer import RoleWiseGRPOTrainer

    if device.startswith("cuda"):
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    config = TrainConfig(
        run_dir=str(run_dir),
        model=str(model),
        suite="lab-stated",
        categories=["ship", "relocate"],
        split="train",
        batch_tasks=args.batch_tasks,
        group_size=args.group_size,
        num_steps=args.steps if device != "cpu" else args.cpu_steps,
        max_new_tokens=args.max_new_tokens,
        rehearse_max_new_tokens=args.max_new_tokens,
        max_steps_per_turn=2,
        min_solvable_fraction=0.0,
        skip_empty_updates=False,
        optim={"lr": 1e-6},
        dtype=dtype,
        tensorboard=False,
        engine=engine,
        run={"device": device, "save_every": 10_000, "threads": args.cpu_threads if device == "cpu" else 0},
    )
    t0 = time.perf_counter()
    trainer = RoleWiseGRPOTrainer(config, log=None)
    load_s = time.perf_counter() - t0
    history = trainer.train(progress=False)
    trainer.close()
    peak = torch.cuda.max_memory_allocated() / 2**30 if device.startswith("cuda") else float("nan")
    steady = history[1:] or history

    def mean(key):
        values = [h[key] for h in steady if h.get(key) is not None]
        return sum(values) / len(values) if values else float("nan")

    return {
        "setting": f"{engine} {device} {dtype}",
        "steps": len(history),
        "load_s": load_s,
        "tokens_per_s": mean("perf/rollout_tokens_per_s"),
        "step_s": mean("perf/step_s"),
        "rollout_s": mean("perf/rollout_s"),
        "update_s": mean("perf/update_s"),
        "generated_tokens": mean("rollout/tokens/act") + mean("rollout/tokens/rehearse"),
        "logprob_mismatch": mean("train/logprob_mismatch"),
        "peak_gpu_gib": peak,
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--prepare", action="store_true", help="write benchmarks/gpu_assets/ (on a machine with the venv)"
    )
    parser.add_argument("--steps", type=int, default=4, help="GRPO steps per CUDA setting (the first is not averaged)")
    parser.add_argument("--cpu-steps", type=int, default=2, help="GRPO steps on CPU")
    parser.add_argument("--cpu-threads", type=int, default=0, help="torch CPU threads for the CPU setting (0: default)")
    parser.add_argument("--batch-tasks", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--json", type=Path, default=None, help="also write the rows here")
    args = parser.parse_args(argv)
    if args.prepare:
        prepare()
        return 0
    import torch

    from envace_gym.suites import register_suite

    register_suite(
        "lab-stated", "benchmarks.lab.suite:stated_suite"
    )  # works without `pip install -e .` (no entry points)
    if not (MODEL_ASSETS / "config.json").is_file():
        print(
            f"missing {MODEL_ASSETS}; run `python -m benchmarks.perf.gpu_check --prepare` where the venv is",
            file=sys.stderr,
        )
        return 2
    cuda = torch.cuda.is_available()
    print(
        f"torch {torch.__version__}, CUDA {'available: ' + torch.cuda.get_device_name(0) if cuda else 'not available'}"
    )
    import importlib.util

    vllm = cuda and importlib.util.find_spec("vllm") is not None
    settings = [("cuda", "bfloat16", "hf"), ("cuda", "float32", "hf")] if cuda else []
    settings += [("cuda", "bfloat16", "vllm")] if vllm else []
    settings += [("cpu", "float32", "hf")]
    rows = []
    engine_check: dict | None = None
    failed: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        model = random_model(Path(tmp) / "smollm2-135m-random")
        if vllm:
            try:
                engine_check = vllm_engine_check(model)
                print(json.dumps(engine_check), flush=True)
            except Exception as err:  # report it and keep the other rows
                failed.append(f"vllm engine check: {type(err).__name__}: {err}")
                print(failed[-1], flush=True)
        for i, (device, dtype, engine) in enumerate(settings):
            try:
                rows.append(run_setting(model, device, dtype, args, Path(tmp) / f"run{i}", engine))
            except Exception as err:  # a vLLM failure is reported and the HF rows still run
                if engine != "vllm":
                    raise
                failed.append(f"vllm setting: {type(err).__name__}: {err}")
                print(failed[-1], flush=True)
                continue
            print(json.dumps(rows[-1]), flush=True)
    print(
        f"\nrole-wise GRPO, lab, B={args.batch_tasks} x K={args.group_size}, max_new_tokens={args.max_new_tokens}, "
        "random-weight SmolLM2-135M (means over the steps after the first)"
    )
    header = ("setting", "gen tok/s", "step s", "rollout s", "update s", "peak GPU GiB", "logprob mismatch")
    print(" | ".join(header))
    for r in rows:
        print(
            f"{r['setting']} | {r['tokens_per_s']:.0f} | {r['step_s']:.2f} | {r['rollout_s']:.2f} | "
            f"{r['update_s']:.2f} | "
            f"{r['peak_gpu_gib']:.2f} | {r['logprob_mismatch']:.2e}"
        )
    cpu = rows[-1]
    for r in rows[:-1]:
        print(
            f"{r['setting']} over cpu float32: generation {r['tokens_per_s'] / cpu['tokens_per_s']:.1f}x tokens/s, "
            f"step {cpu['step_s'] / r['step_s']:.1f}x faster"
        )
    if not vllm:
        print("vllm is not importable here (or there is no GPU): no vLLM rows")
    if engine_check is not None:
        print("vLLM engine check: " + ", ".join(f"{k} {v}" for k, v in engine_check.items() if k != "setting"))
    for line in failed:
        print(f"FAILED {line}")
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "vllm_engine_check": engine_check}, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
