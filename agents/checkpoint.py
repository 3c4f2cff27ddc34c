"""Training checkpoints: model (safetensors via ``save_pretrained``), optimizer, scheduler, RNG states, step.

Layout of ``run_dir/checkpoints/step_000012/``:

| file | what |
|---|---|
| ``model/`` | ``save_pretrained`` folder (config + ``model.safetensors``) and the tokenizer: a valid ``--model``/``--init`` |
| ``rehearse_model/`` | ``policy=per_role`` only: the separate REHEARSE model, same format |
| ``optimizer.pt``, ``scheduler.pt`` | ``state_dict()`` of each (one per model for ``per_role``) |
| ``rng.pt`` | Python ``random``, NumPy global and torch CPU generator states |
| ``trainer_state.json`` | ``{"step": ..., "config": {...}}`` |

A checkpoint is written to a temporary folder and renamed into place, so an interrupted save never leaves
a half checkpoint that resume would pick. `latest_checkpoint` returns the newest complete one.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

__all__ = ["save_checkpoint", "load_checkpoint", "latest_checkpoint", "checkpoint_dir", "prune_checkpoints"]

_STATE = "trainer_state.json"


def checkpoint_dir(run_dir: str | Path, step: int) -> Path:
    """``run_dir/checkpoints/step_{step:06d}``."""
    return Path(run_dir) / "checkpoints" / f"step_{step:06d}"


def save_checkpoint(
    run_dir: str | Path,
    step: int,
    models: dict[str, torch.nn.Module],
    optimizers: dict[str, torch.optim.Optimizer],
    schedulers: dict[str, Any],
    tokenizer: Any,
    config: dict[str, Any],
    extra: dict[str, Any] | None = None,
) -> Path:
    """Write a complete checkpoint for `step` atomically; returns its folder.

    Args:
        models: ``{"model": policy}`` (plus ``"rehearse_model"`` for per-role training).
        optimizers, schedulers: keyed like `models`.
        tokenizer: saved beside each model so the folder loads on its own.
        config: the resolved config dict, stored in ``trainer_state.json``.
        extra: more JSON-compatible trainer state, stored there too (`trainer_state` reads it back).
    """
    final = checkpoint_dir(run_dir, step)
    tmp = final.with_name(final.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    for name, model in models.items():
        model.save_pretrained(tmp / name, safe_serialization=True)
        tokenizer.save_pretrained(tmp / name)
    torch.save({k: o.state_dict() for k, o in optimizers.items()}, tmp / "optimizer.pt")
    torch.save({k: s.state_dict() for k, s in schedulers.items()}, tmp / "scheduler.pt")
    torch.save(
        {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()},
        tmp / "rng.pt",
    )
    (tmp / _STATE).write_text(json.dumps({"step": step, "config": config, "extra": extra or {}}, indent=1))
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    return final


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    """The newest complete checkpoint folder under ``run_dir/checkpoints``, or None."""
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return None
    done = [p for p in root.iterdir() if p.is_dir() and not p.name.endswith(".tmp") and (p / _STATE).is_file()]
    return max(done, key=lambda p: p.name) if done else None


def prune_checkpoints(run_dir: str | Path, keep: int) -> None:
    """Delete all but the `keep` newest complete checkpoints."""
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return
    done = sorted(p for p in root.iterdir() if p.is_dir() and (p / _STATE).is_file())
    for p in done[: max(0, len(done) - keep)]:
        shutil.rmtree(p)


def trainer_state(folder: str | Path) -> dict[str, Any]:
    """The ``extra`` trainer state a checkpoint was saved with (``{}`` for none)."""
    return dict(json.loads((Path(folder) / _STATE).read_text()).get("extra", {}))


def load_checkpoint(
    folder: str | Path,
    models: dict[str, torch.nn.Module],
    optimizers: dict[str, torch.optim.Optimizer],
    schedulers: dict[str, Any],
) -> int:
    """Restore weights, optimizer, scheduler and RNG states in place from `folder`; returns its step.

    Raises:
        FileNotFoundError: `folder` is not a complete checkpoint.
    """
    from safetensors.torch import load_file

    folder = Path(folder)
    if not (folder / _STATE).is_file():
        raise FileNotFoundError(f"{folder} is not a complete checkpoint (no {_STATE})")
    for name, model in models.items():
        state = load_file(str(folder / name / "model.safetensors"))
        missing, unexpected = model.load_state_dict(state, strict=False)
        unexpected = [k for k in unexpected]
        missing = [k for k in missing if not k.endswith("lm_head.weight")]  # tied to the embedding
        if missing or unexpected:
            raise RuntimeError(f"checkpoint {folder / name} does not match the model: missing {missing}, unexpected {unexpected}")
        if getattr(model.config, "tie_word_embeddings", False):
            model.tie_weights()
    opt_states = torch.load(folder / "optimizer.pt", weights_only=False)
    for name, opt in optimizers.items():
        opt.load_state_dict(opt_states[name])
    sched_states = torch.load(folder / "scheduler.pt", weights_only=False)
    for name, sched in schedulers.items():
        sched.load_state_dict(sched_states[name])
    rng = torch.load(folder / "rng.pt", weights_only=False)
    random.setstate(rng["python"])
    np.random.set_state(rng["numpy"])
    torch.set_rng_state(rng["torch"])
    return int(json.loads((folder / _STATE).read_text())["step"])
