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
a half checkpoint that resume would pick. `latest_checkpoint` returns the newest complete one; `load_newest`
resumes from the newest one that actually loads (a truncated or corrupt file makes it fall back to the
previous checkpoint, and it says so). Optimizer, scheduler and RNG files are read with
``torch.load(weights_only=True)``, so a tampered run folder cannot execute code on resume.
"""  # noqa: E501 (a markdown table row in this docstring cannot be wrapped)

from __future__ import annotations

import json
import os
import random
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch

__all__ = [
    "save_checkpoint",
    "load_checkpoint",
    "read_checkpoint",
    "load_newest",
    "latest_checkpoint",
    "checkpoint_dir",
    "prune_checkpoints",
    "trainer_state",
    "CheckpointError",
]

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
    model_state_dicts: dict[str, dict[str, torch.Tensor] | None] | None = None,
    optimizer_state_dicts: dict[str, dict[str, Any] | None] | None = None,
) -> Path:
    """Write a complete checkpoint for `step` atomically; returns its folder.

    Args:
        models: ``{"model": policy}`` (plus ``"rehearse_model"`` for per-role training).
        optimizers, schedulers: keyed like `models`.
        tokenizer: saved beside each model so the folder loads on its own.
        config: the resolved config dict, stored in ``trainer_state.json``.
        extra: more JSON-compatible trainer state, stored there too (`trainer_state` reads it back).
        model_state_dicts, optimizer_state_dicts: whole states to write instead of a model's or optimizer's
            own ``state_dict()`` where one is given (not None): sharded (FSDP) weights gathered by
            `agents.training.distributed.DataParallel.model_state_dict` and ``optimizer_state_dict``. The optimizer's is
            then keyed by parameter name; `load_checkpoint` reads either form into either kind of optimizer.
    """
    model_state_dicts = model_state_dicts or {}
    optimizer_state_dicts = optimizer_state_dicts or {}
    final = checkpoint_dir(run_dir, step)
    tmp = final.with_name(final.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    for name, model in models.items():
        state = model_state_dicts.get(name)
        hf_model: Any = model  # a Transformers model: save_pretrained is not on nn.Module
        hf_model.save_pretrained(
            tmp / name, safe_serialization=True, **({"state_dict": state} if state is not None else {})
        )
        tokenizer.save_pretrained(tmp / name)
    torch.save(
        {
            k: optimizer_state_dicts[k] if optimizer_state_dicts.get(k) is not None else o.state_dict()
            for k, o in optimizers.items()
        },
        tmp / "optimizer.pt",
    )
    torch.save({k: s.state_dict() for k, s in schedulers.items()}, tmp / "scheduler.pt")
    # the legacy form, always a tuple for the global MT19937 generator (numpy's stubs also allow a dict)
    name, keys, pos, has_gauss, cached = cast(tuple[str, np.ndarray, int, int, float], np.random.get_state())
    numpy_state = {
        "name": name,
        "keys": torch.from_numpy(keys.astype(np.int64)),
        "pos": int(pos),
        "has_gauss": int(has_gauss),
        "cached_gaussian": float(cached),
    }
    torch.save({"python": random.getstate(), "numpy": numpy_state, "torch": torch.get_rng_state()}, tmp / "rng.pt")
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


class CheckpointError(RuntimeError):
    """A checkpoint folder cannot be read (truncated or corrupt file, wrong model); the message names the file."""


def _torch_load(path: Path) -> Any:
    """``torch.load`` with ``weights_only=True``: a tampered file cannot run code. NumPy's array reconstruction
    is allowed too, for RNG files written before the NumPy state was stored as a tensor. Tensors load on the
    CPU (``load_state_dict`` moves them to the parameters' device), so a checkpoint written on a GPU resumes
    on any device and no rank piles every state onto the GPU rank 0 saved from."""
    safe: list[Callable[..., Any] | tuple[Callable[..., Any], str]] = [np.ndarray, np.dtype, type(np.dtype("uint32"))]
    try:
        from numpy.core.multiarray import _reconstruct  # noqa: PLC0415 - numpy < 2 and >= 2 both expose it

        safe.append(_reconstruct)
    except ImportError:  # pragma: no cover - depends on the numpy version
        pass
    with torch.serialization.safe_globals(safe):
        return torch.load(path, weights_only=True, map_location="cpu")


def read_checkpoint(folder: str | Path, model_names: Any) -> dict[str, Any]:
    """Read every file of a checkpoint into memory without touching any model (the read half of
    `load_checkpoint`).

    Returns:
        ``{"step", "models": {name: state_dict}, "optimizers", "schedulers", "rng", "extra"}``.

    Raises:
        CheckpointError: a file is missing, truncated or not what it should be (the message names it).
    """
    from safetensors.torch import load_file

    folder = Path(folder)
    current = folder / _STATE
    try:
        state = json.loads(current.read_text())
        out: dict[str, Any] = {"step": int(state["step"]), "extra": dict(state.get("extra", {})), "models": {}}
        for name in model_names:
            current = folder / name / "model.safetensors"
            out["models"][name] = load_file(str(current))
        for key, file in (("optimizers", "optimizer.pt"), ("schedulers", "scheduler.pt"), ("rng", "rng.pt")):
            current = folder / file
            out[key] = _torch_load(current)
    except Exception as err:  # noqa: BLE001 - every reading failure is reported with the file it came from
        raise CheckpointError(f"cannot read {current}: {type(err).__name__}: {err}") from err
    return out


def load_checkpoint(
    folder: str | Path,
    models: dict[str, torch.nn.Module],
    optimizers: dict[str, torch.optim.Optimizer],
    schedulers: dict[str, Any],
) -> int:
    """Restore weights, optimizer, scheduler and RNG states in place from `folder`; returns its step.

    Every file is read first (`read_checkpoint`), so a corrupt checkpoint raises before any model or
    optimizer is changed. Optimizer, scheduler and RNG files are loaded with ``weights_only=True``.

    Raises:
        FileNotFoundError: `folder` is not a complete checkpoint.
        CheckpointError: a file cannot be read, or the weights do not fit the model.
    """
    folder = Path(folder)
    if not (folder / _STATE).is_file():
        raise FileNotFoundError(f"{folder} is not a complete checkpoint (no {_STATE})")
    data = read_checkpoint(folder, list(models))
    for name, model in models.items():
        if _is_sharded(model):  # FSDP: each rank keeps its shard of the whole tensors
            from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

            missing, unexpected = set_model_state_dict(
                model, data["models"][name], options=StateDictOptions(full_state_dict=True, strict=False)
            )
        else:
            missing, unexpected = model.load_state_dict(data["models"][name], strict=False)
        unexpected = [k for k in unexpected]
        missing = [k for k in missing if not k.endswith("lm_head.weight")]  # tied to the embedding
        if missing or unexpected:
            raise CheckpointError(
                f"checkpoint {folder / name} does not match the model: missing {missing}, unexpected {unexpected}"
            )
        if getattr(model.config, "tie_word_embeddings", False) and not _is_sharded(model):
            hf_model: Any = model  # a Transformers model: tie_weights is not on nn.Module
            hf_model.tie_weights()
    for name, opt in optimizers.items():
        _load_optimizer_state(opt, models.get(name), data["optimizers"][name])
    for name, sched in schedulers.items():
        sched.load_state_dict(data["schedulers"][name])
    rng = data["rng"]
    random.setstate(_as_python_state(rng["python"]))
    numpy_state = rng["numpy"]
    if isinstance(numpy_state, dict):  # the tensor form save_checkpoint writes
        numpy_state = (
            numpy_state["name"],
            numpy_state["keys"].numpy().astype(np.uint32),
            int(numpy_state["pos"]),
            int(numpy_state["has_gauss"]),
            float(numpy_state["cached_gaussian"]),
        )
    np.random.set_state(numpy_state)
    torch.set_rng_state(rng["torch"])
    return data["step"]


def _is_sharded(model: torch.nn.Module) -> bool:
    """True when `model`'s parameters are FSDP shards (``DTensor``)."""
    return any(hasattr(p, "full_tensor") for p in model.parameters())


def _load_optimizer_state(opt: torch.optim.Optimizer, model: torch.nn.Module | None, state: dict[str, Any]) -> None:
    """Load `state` into `opt`, whichever form it has: an optimizer's own ``state_dict()`` (keyed by parameter
    index) or the whole state of sharded weights (keyed by parameter name, as FSDP runs save it), into an
    optimizer over plain or sharded (FSDP) parameters of `model`. Index and name match through the order of
    ``opt.param_groups`` and ``model.named_parameters()``."""
    by_name = any(isinstance(k, str) for k in state.get("state", {})) or any(
        isinstance(i, str) for g in state.get("param_groups", []) for i in g["params"]
    )
    sharded = model is not None and _is_sharded(model)
    if not by_name and not sharded:
        opt.load_state_dict(state)
        return
    if model is None:
        raise CheckpointError("an optimizer state keyed by parameter name needs its model to be loaded")
    names = {id(p): n for n, p in model.named_parameters()}
    order = [names[id(p)] for g in opt.param_groups for p in g["params"]]  # index i is parameter order[i]
    if sharded:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        if not by_name:
            state = {
                "state": {order[i]: v for i, v in state["state"].items()},
                "param_groups": [{**g, "params": [order[i] for i in g["params"]]} for g in state["param_groups"]],
            }
        set_optimizer_state_dict(model, opt, state, options=StateDictOptions(full_state_dict=True))
        return
    index = {n: i for i, n in enumerate(order)}
    opt.load_state_dict(
        {
            "state": {index[n]: v for n, v in state["state"].items()},
            "param_groups": [{**g, "params": [index[n] for n in g["params"]]} for g in state["param_groups"]],
        }
    )


def _as_python_state(state: Any) -> tuple:
    version, internal, gauss = state
    return (int(version), tuple(int(x) for x in internal), gauss)


def load_newest(
    run_dir: str | Path,
    models: dict[str, torch.nn.Module],
    optimizers: dict[str, torch.optim.Optimizer],
    schedulers: dict[str, Any],
    log: Any = print,
) -> tuple[Path | None, int]:
    """Resume from the newest checkpoint that loads; say which newer ones were skipped and why.

    Returns:
        ``(folder, step)``; ``(None, 0)`` when there is no loadable checkpoint.
    """
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return None, 0
    done = sorted(
        (p for p in root.iterdir() if p.is_dir() and not p.name.endswith(".tmp") and (p / _STATE).is_file()),
        key=lambda p: p.name,
        reverse=True,
    )
    for folder in done:
        try:
            return folder, load_checkpoint(folder, models, optimizers, schedulers)
        except CheckpointError as err:
            if log is not None:
                log(f"[checkpoint] skipped {folder.name}: {err}")
    return None, 0
