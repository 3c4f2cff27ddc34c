"""`TrainConfig`: every setting of `RoleWiseGRPOTrainer`, one documented field each.

Each field's ``help`` metadata is its single description: ``envace train --help`` prints it, the YAML
loader validates against it, and the run folder's ``config.yaml`` records the resolved values. Fields are
grouped like CleanRL's ``Args`` and TRL's ``GRPOConfig`` ("Parameters that control ..."); sizes derived from
others are filled in `__post_init__` and never set by hand. `__post_init__` rejects bad combinations with a
message that says what to change, before any model loads.

What GRPO and SFT (`agents.training.sft.SFTConfig`) share are three nested groups, defined and validated once
here and held by both with each command's defaults: `RunConfig` (``run``: checkpoints, resume, device,
threads), `OptimConfig` (``optim``: AdamW and the learning-rate schedule) and `MemoryConfig` (``memory``). On
the command line a group's fields are ``--run.save-every``, ``--optim.lr``, ...; in YAML mappings under
``run:``, ``optim:`` and ``memory:``.

Defaults are small-CPU settings (those of ``make demo-bfcl``, the BFCL pipeline); the paper's run (Qwen3-8B, 16 GPUs)
used lr 1e-6, AdamW weight decay 0.01, grad clip 1.0, 16 instructions x K=4 per step, temperature 1.0, one
optimizer step per batch, an invalid-action penalty of 0.1 and about 470 steps (docs/design.md §1).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import re
import typing
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, NoReturn

import yaml

__all__ = [
    "TrainConfig",
    "RunConfig",
    "OptimConfig",
    "MemoryConfig",
    "config_field",
    "add_config_arguments",
    "config_from_args",
    "load_config",
    "add_dataclass_arguments",
    "dataclass_from_args",
    "load_dataclass",
    "nested_config_field",
    "HintingArgumentParser",
    "grouped_option_hints",
    "field_default",
    "flat_fields",
    "replace_fields",
    "NOT_GIVEN",
]


_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def coerce_fields(obj: Any, prefix: str = "") -> None:
    """Coerce every field of the dataclass instance `obj` to its annotated type, in place, or raise.

    The one type check of every config (`TrainConfig`, `agents.training.sft.SFTConfig`,
    `agents.pipeline.PipelineConfig`, the shared groups `RunConfig`, `OptimConfig`, `MemoryConfig`), run first in their
    ``__post_init__``, so a value from YAML (PyYAML reads ``1e-5`` as a string) or from Python is handled the same way:
    ``int`` takes an int or an integral string (not a bool, not 2.5); ``float`` takes a number or a numeric string and
    must be finite; ``bool`` takes a bool or one of true/false, yes/no, on/off, 1/0; ``str`` must be a string;
    ``list[str]`` takes a list of strings (a single string becomes a one-item list); ``Literal`` values must be among
    the choices; ``X | None`` takes None. A field that holds another config (`nested_config_field`) takes that config
    or a mapping of its fields, laid over the field's defaults (nested mappings merged key by key).

    Args:
        obj: the config to check.
        prefix: put before each field name in messages (a group's name as a user types it, e.g. ``"optim."``).

    Raises:
        ValueError: ``invalid <Class>: <prefix><field> must be <type>, got <value>`` naming the accepted values.
    """
    cls = type(obj)
    hints = typing.get_type_hints(cls)

    def fail(name: str, what: str, value: Any) -> NoReturn:
        raise ValueError(f"invalid {cls.__name__}: {prefix}{name} must be {what}, got {value!r}")

    def coerce(name: str, hint: Any, value: Any) -> Any:
        origin, args = typing.get_origin(hint), typing.get_args(hint)
        if type(None) in args:  # Optional[X]
            if value is None or (isinstance(value, str) and value.strip().lower() in ("none", "null")):
                return None
            return coerce(name, next(a for a in args if a is not type(None)), value)
        if origin is Literal:
            if value not in args:
                fail(name, f"one of {list(args)}", value)
            return value
        if origin is list:
            if isinstance(value, str):
                value = [value]
            if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
                fail(name, "a list of strings", value)
            return list(value)
        if hint is bool:
            if isinstance(value, bool):
                return value
            if isinstance(value, str) and value.strip().lower() in _TRUE + _FALSE:
                return value.strip().lower() in _TRUE
            if isinstance(value, int) and value in (0, 1):
                return bool(value)
            fail(name, "true or false", value)
        if hint is int:
            if isinstance(value, bool):
                fail(name, "an integer", value)
            if isinstance(value, int):
                return value
            if isinstance(value, float) and value.is_integer():
                return int(value)
            if isinstance(value, str):
                try:
                    return int(value.strip())
                except ValueError:
                    pass
            fail(name, "an integer", value)
        if hint is float:
            if isinstance(value, bool):
                fail(name, "a number", value)
            try:
                number = float(value) if isinstance(value, (int, float, str)) else None
            except ValueError:
                number = None
            if number is None:
                fail(name, "a number", value)
            if not math.isfinite(number):
                fail(name, "a finite number", value)
            return number
        if hint is str:
            if not isinstance(value, str):
                fail(name, "a string", value)
            return value
        return value

    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        value, hint = getattr(obj, f.name), hints[f.name]
        # a config inside another (a stage, a shared group): a mapping (YAML) over its defaults
        if isinstance(hint, type) and dataclasses.is_dataclass(hint):
            if isinstance(value, dict):
                value = _load(hint, None, _merged(f.metadata.get("defaults", {}), value))
            elif not isinstance(value, hint):
                fail(f.name, f"a {hint.__name__} or a mapping of its fields", value)
            setattr(obj, f.name, value)
        else:
            setattr(obj, f.name, coerce(f.name, hint, value))


def config_field(default: Any, help: str, **kw: Any) -> Any:
    """A dataclass field whose ``metadata["help"]`` is its one description (the ``--help`` text)."""
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata={"help": help, **kw})
    return field(default=default, metadata={"help": help, **kw})


def nested_config_field(cls: type, help: str, **defaults: Any) -> Any:
    """A field holding another config: a command's whole config (a pipeline stage) or a shared group of fields
    (`RunConfig`, `OptimConfig`, `MemoryConfig`), built with ``defaults`` over the class's own. A default for a
    field that is itself a config is a mapping of its fields (``optim={"lr": 1e-4}``).

    On the command line its fields are ``--<name>.<field>`` options (``--<name>.<group>.<field>`` one level
    down); in YAML a mapping under ``<name>``.
    """
    return field(default_factory=lambda: cls(**defaults), metadata={"help": help, "defaults": dict(defaults)})


def _merged(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """`base` with `over` on top, a mapping in both (a nested config's fields) merged key by key."""
    out = dict(base)
    for k, v in over.items():
        out[k] = _merged(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def flat_fields(config: Any) -> dict[str, Any]:
    """A config (a dataclass, or the dict ``dataclasses.asdict`` makes of one) as one flat dict: a nested config's
    fields as ``<name>.<field>`` (``{"optim.lr": 1e-5, ...}``), each value as stored."""
    values = config if isinstance(config, dict) else dataclasses.asdict(config)
    out: dict[str, Any] = {}
    for name, value in values.items():
        if isinstance(value, dict):
            out.update({f"{name}.{k}": v for k, v in flat_fields(value).items()})
        else:
            out[name] = value
    return out


def replace_fields(config: Any, changes: dict[str, Any]) -> Any:
    """A copy of the config dataclass `config` with `changes` applied (``dataclasses.replace``, so validated
    again); a nested config's field is named ``<name>.<field>`` (``{"run.threads": 2, "model": "m"}``)."""
    direct: dict[str, Any] = {}
    nested: dict[str, dict[str, Any]] = {}
    for name, value in changes.items():
        head, dot, rest = name.partition(".")
        if dot:
            nested.setdefault(head, {})[rest] = value
        else:
            direct[name] = value
    for head, sub in nested.items():
        direct[head] = replace_fields(getattr(config, head), sub)
    return dataclasses.replace(config, **direct)


_f = config_field


DEVICE_HELP = (
    "where the model trains and generates: 'auto' (CUDA when available, else CPU), 'cpu', 'cuda' or "
    "'cuda:N'; under accelerate launch each process takes its own GPU ('cpu' forces CPU processes)"
)


def _group_fail(cls: type, name: str) -> Any:
    """The ``fail(message)`` of a shared group's checks: each message starts with a field name, which gets the
    group's ``<name>.`` in front, as the user types it."""

    def fail(msg: str) -> NoReturn:
        raise ValueError(f"invalid {cls.__name__}: {name}.{msg}")

    return fail


@dataclass
class RunConfig:
    """How a training run keeps its folder and uses the machine: ``--run.<field>`` options, a ``run:`` mapping in
    YAML. `TrainConfig` and `agents.training.sft.SFTConfig` both hold one (``envace train`` and ``envace sft``
    differ only in ``save_every``). Nothing here changes what is trained, so a run may resume with any of it
    changed."""

    save_every: int = _f(1, "save a checkpoint every this many optimizer steps (and at the end)")
    keep_checkpoints: int = _f(2, "how many of the newest checkpoints to keep (older ones are deleted)")
    resume: bool = _f(
        True, "continue from the newest checkpoint in run_dir that loads (newer unreadable ones are skipped and named)"
    )
    allow_config_change: bool = _f(
        False,
        (
            "resume even when result-affecting fields (optim.lr, the algorithm, the data, ...) differ from the "
            "checkpoint's; the new values are used"
        ),
    )
    device: str = _f("auto", DEVICE_HELP)
    threads: int = _f(0, "torch CPU threads (0: leave torch's default)")

    def __post_init__(self) -> None:
        coerce_fields(self, "run.")
        fail = _group_fail(RunConfig, "run")
        for name in ("save_every", "keep_checkpoints"):
            if getattr(self, name) < 1:
                fail(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.threads < 0:
            fail(f"threads must be >= 0 (0: torch's default), got {self.threads}")
        check_device(self.device, fail)


@dataclass
class OptimConfig:
    """AdamW and its learning-rate schedule: ``--optim.<field>`` options, an ``optim:`` mapping in YAML.
    `TrainConfig` and `agents.training.sft.SFTConfig` both hold one, each with its own defaults (``envace train``:
    lr 1e-5, weight decay 0.01, constant; ``envace sft``: lr 2e-5, no weight decay, cosine). Those per-command
    defaults apply to a mapping (``TrainConfig(optim={"lr": 1e-4})``, YAML, options); an ``OptimConfig(...)`` object
    is used as given, with this class's defaults for the fields it does not set."""

    lr: float = _f(1e-5, "AdamW learning rate (the paper's 8B GRPO run used 1e-6)")
    weight_decay: float = _f(0.0, "AdamW weight decay")
    adam_beta1: float = _f(0.9, "AdamW beta1")
    adam_beta2: float = _f(0.999, "AdamW beta2")
    max_grad_norm: float = _f(1.0, "gradient clipping norm (0: off)")
    lr_schedule: Literal["constant", "linear", "cosine"] = _f("constant", "learning-rate schedule after warmup")
    warmup_steps: int = _f(0, "linear warmup steps of the schedule")

    def __post_init__(self) -> None:
        coerce_fields(self, "optim.")
        fail = _group_fail(OptimConfig, "optim")
        if self.lr <= 0:
            fail(f"lr must be > 0, got {self.lr}")
        for name in ("weight_decay", "max_grad_norm", "warmup_steps"):
            if getattr(self, name) < 0:
                fail(f"{name} must be >= 0, got {getattr(self, name)}")
        for name in ("adam_beta1", "adam_beta2"):
            if not 0 <= getattr(self, name) < 1:
                fail(f"{name} must be in [0, 1), got {getattr(self, name)}")


@dataclass
class MemoryConfig:
    """How a trainer trades time for memory: ``--memory.<field>`` options, a ``memory:`` mapping in YAML, held by
    `TrainConfig` and `agents.training.sft.SFTConfig`. None of it changes what is trained (up to float rounding),
    so a run may resume with any of it changed."""

    logprob_chunk_size: int = _f(512, "positions per chunk through the LM head when computing logprobs")
    gradient_checkpointing: bool = _f(
        True,
        (
            "recompute decoder activations layer by layer in the backward pass: about 30% slower, but without it CPU "
            "attention keeps every layer's (rows, heads, T, T) probabilities (SmolLM2, one 4k-token row: ~13 GB; "
            "2 rows x 4k: ~36 GB)"
        ),
    )
    malloc_mmap_threshold_kb: int = _f(
        128,
        (
            "fix glibc's mmap threshold at this many KiB so freed activations leave RSS (agents.training.allocator; "
            "0: keep glibc's dynamic threshold)"
        ),
    )

    def __post_init__(self) -> None:
        coerce_fields(self, "memory.")
        fail = _group_fail(MemoryConfig, "memory")
        if self.logprob_chunk_size < 1:
            fail(f"logprob_chunk_size must be >= 1, got {self.logprob_chunk_size}")
        if not 0 <= self.malloc_mmap_threshold_kb <= 32768:
            fail(
                "malloc_mmap_threshold_kb must be in [0, 32768] (0 keeps glibc's default), got "
                f"{self.malloc_mmap_threshold_kb}"
            )


@dataclass
class TrainConfig:
    """Settings of a role-wise GRPO run; see each field's help (``envace train --help``)."""

    # --- Parameters that control the experiment -------------------------------------------------------
    run_dir: str = _f("runs/envace", "folder for checkpoints, metrics.jsonl, TensorBoard events and config.yaml")
    seed: int = _f(0, "seed of task sampling, rollouts and initialisation; step s uses seeds derived from (seed, s)")
    model: str = _f(
        "smollm2-135m",
        ("policy model: 'smollm2-135m', 'lab-tiny', 'smollm2-lab', a local Hugging Face folder, or 'tiny-random'"),
    )
    init: str | None = _f(
        None, "start from this checkpoint's model folder (e.g. an `envace sft` checkpoint) instead of --model"
    )
    num_steps: int = _f(4, "training steps (one rollout batch and its update each)")
    generated_token_budget: int = _f(
        0,
        (
            "also stop once the rollouts have generated this many ACT and REHEARSE tokens in all (rehearsal attempts "
            "included; the metric rollout/generated_tokens_total), so runs of different rollout costs can be compared "
            "at equal compute (needs a constant optim.lr_schedule); 0: num_steps alone"
        ),
    )
    run: RunConfig = nested_config_field(RunConfig, "checkpoints, resume and the machine (RunConfig)")
    tensorboard: bool = _f(True, "also write TensorBoard events to run_dir/tb")
    engine: str = _f(
        "auto",
        "generation engine registered in agents.engines.registry: 'hf' (Transformers with the prefix KV cache), "
        "'hf-nocache', 'vllm' (vLLM in this process; needs the vllm extra, docs/guides/engines.md) or 'auto' "
        "('vllm' where installed for models of 10M parameters or more, else 'hf')",
    )

    # --- Parameters that control the tasks ------------------------------------------------------------
    suite: str = _f("bfcl", "task suite registered in envace_gym.suites")
    categories: list[str] | None = _f(
        None,
        (
            "suite categories to train on (none given: the suite's default, BFCL's multi_turn_base, every lab family; "
            "tau2: its domains, --domains is the same option)"
        ),
        aliases=("domains",),
    )
    split: str = _f("train", "task split: train, test or all (test ids are never used for training by default)")
    task_ids: list[str] = _f([], "train on these task ids only (empty: every task of the categories and split)")

    # --- Parameters that control the rollouts ---------------------------------------------------------
    batch_tasks: int = _f(2, "B: instructions per step")
    group_size: int = _f(4, "K: trajectories sampled per instruction (the GRPO group); K = 1 makes every advantage 0")
    rollout: Literal["rehearse", "real", "null", "hybrid"] = _f(
        "rehearse",
        (
            "'rehearse': the policy simulates the tools (EnvACE); 'real': real backends (ablation); 'null': every call "
            "answered with the same uninformative text (the null-rehearser control); 'hybrid': each call answered by "
            "the real backend with probability real_call_prob, else rehearsed (envace_gym.responders.Hybrid)"
        ),
    )
    real_call_prob: float | None = _f(
        None,
        (
            "rollout=hybrid only: the probability p in [0, 1] that a tool call is answered by the real backend (drawn "
            "per call, seeded by the run's seed and step); a real answer first executes the episode's rehearsed calls "
            "not yet executed, which count as real calls too (rollout/real_tool_calls)"
        ),
    )
    world_model_loss_weight: float = _f(
        0.0,
        (
            "lambda >= 0: add lambda x the REHEARSE role's teacher-forced cross-entropy on the tool outputs the real "
            "backend answered (rollout real or hybrid, or the world_model_demos demonstrations) to the GRPO loss "
            "(agents.grpo.world_model_loss); 0: off"
        ),
    )
    world_model_demos: int = _f(
        0,
        (
            "per step, this many train tasks (drawn from the task pool, seeded by the run's seed and step) executed "
            "on the real backend along their reference solutions, as the SFT warm start's demonstrations are "
            "(agents.training.demonstrations), each with world_model_demo_errors error demonstrations; their tool "
            "outputs join the batch as world-model targets of weight world_model_loss_weight (no policy-gradient "
            "loss on them): a world-model anchor beside rehearsed rollouts; 0: off"
        ),
    )
    world_model_demo_errors: int = _f(
        1, "world_model_demos > 0: error demonstrations per task (a mistaken call and the real error output)"
    )
    prompt_mode: Literal["inline", "separate"] = _f(
        "inline",
        "rehearsal prompt: 'inline' continues the trajectory; 'separate' uses a simulator prompt and its own row",
    )
    rehearsal_n: int = _f(
        0,
        (
            "rehearsal-aware RL: before each user turn's committed steps, this many private rehearsal attempts whose "
            "memory the committed steps read (wrappers.TestTimeRehearsal); the committed reward trains the "
            "attempts' ACT and REHEARSE tokens too (agents.rollout.collect_rollouts; 0: off)"
        ),
    )
    rehearsal_mode: Literal["parallel", "sequential"] = _f(
        "parallel", "rehearsal-aware RL: attempts from the same context, or each reading the earlier ones' memory"
    )
    rehearsal_memory: Literal["trace", "outcomes"] = _f(
        "trace",
        (
            "rehearsal-aware RL: the memory's layout (wrappers.TestTimeRehearsal's memory: the attempts' calls and "
            "outputs, or the same without their closing replies); the one the policy was trained to read"
        ),
    )
    rehearsal_restate_request: bool = _f(
        False, "rehearsal-aware RL: the turn's request again after the memory (as the policy was trained to read it)"
    )
    rehearsal_memory_tokens: int = _f(256, "rehearsal-aware RL: bound on each rehearsal memory, in tokens")
    max_new_tokens: int = _f(
        128,
        (
            "cap on tokens per ACT message (the longest BFCL multi_turn_base ground-truth call is 114 SmolLM2 tokens "
            "in Hermes format)"
        ),
    )
    rehearse_max_new_tokens: int = _f(64, "cap on tokens per rehearsed tool response")
    temperature: float = _f(1.0, "sampling temperature of both roles (the recorded and recomputed logprobs use it)")
    max_steps_per_turn: int = _f(
        5,
        (
            "ACT messages per user turn, the closing one included; a turn whose last allowed message still calls a "
            "tool truncates the episode with R = 0, as BFCL force-quits a turn (BFCL's limit of 20 calling messages is "
            "21 here)"
        ),
    )
    max_episode_tokens: int | None = _f(None, "token budget per episode (None: unlimited)")
    min_solvable_fraction: float = _f(
        0.9,
        (
            "refuse to start when fewer of the selected tasks than this can be completed within max_steps_per_turn, "
            "max_new_tokens and max_episode_tokens (computed from the ground truth before any model loads; "
            "agents.training.budgets)"
        ),
    )
    invalid_action_penalty: float = _f(0.1, "subtracted from R(tau) when an ACT response is empty (docs/design.md §1)")
    reward: Literal["replay", "judge", "judge_imagined"] = _f(
        "replay",
        (
            "R(tau): 'replay', the suite's verifier replaying the calls on real backends; 'judge', an LLM judge's "
            "checklist score of the episode with its calls replayed on a real backend; 'judge_imagined', the judge's "
            "score of the episode as rehearsed, with no real backend at reward time (envace_gym.judging)"
        ),
    )
    checklists: str | None = _f(
        None, "judge rewards: a checklist JSONL (envace_gym.judging; none: the suite's own checklist(task), e.g. lab)"
    )
    judge_model: str = _f("smollm2-135m", "judge rewards: the judge model (local), or its name at --judge-url")
    judge_url: str | None = _f(
        None, "judge rewards: an OpenAI-compatible endpoint (envace serve, vLLM, ...); none: a LocalJudge"
    )
    judge_reply_prefix: str = _f(
        "", "judge rewards, local judge: text the judge's reply starts with (e.g. '{\"answer\":')"
    )
    judge_unparseable_score: float = _f(
        0.0, "judge rewards: the score of a checklist item whose verdict cannot be read (counted, never raised)"
    )
    user_model: str | None = _f(
        None,
        (
            "suites with a simulated user (tau2): the model that plays the user in the rollouts (none: the policy "
            "itself, with its current weights; its tokens are never trained)"
        ),
    )
    user_max_new_tokens: int = _f(128, "cap per simulated-user message, tokens")
    user_temperature: float = _f(0.0, "sampling temperature of the simulated user (0: greedy, tau2's default)")
    user_max_turns: int = _f(
        10, "messages a simulated user may write before it gives up (the episode is then truncated, R = 0)"
    )

    # --- Parameters that control the algorithm --------------------------------------------------------
    algo: str = _f(
        "role_grpo",
        (
            "advantage estimator registered in agents.grpo.ADVANTAGE_ESTIMATORS: 'role_grpo' (one baseline per (group, "
            "role)), 'grpo' (one per group; the ablation) or 'role_grpo_act_only' (role-wise, REHEARSE advantages 0: "
            "the world model gets no policy gradient)"
        ),
    )
    policy: Literal["shared", "per_role"] = _f(
        "shared",
        (
            "'shared': one model plays both roles; 'per_role': two models, each trained on its role (ablation; each "
            "model also has its own optimizer, its own loss normalisation over its role's tokens and its own "
            "max_grad_norm budget)"
        ),
    )
    weighting: Literal["turn", "token", "trajectory"] = _f(
        "turn", "baseline weights within (group, role): per segment, per token, or per trajectory"
    )
    scale_by_std: bool = _f(False, "divide advantages by the per-(group, role) std (off, as in the reference runs)")
    clip_eps_low: float = _f(0.2, "epsilon_low of the clipped importance ratio")
    clip_eps_high: float = _f(0.2, "epsilon_high of the clipped importance ratio")
    beta: float = _f(0.0, "KL coefficient to a frozen reference model (k3 estimator); 0 loads no reference")
    entropy_coef: float = _f(0.0, "entropy bonus coefficient")
    aggregation: Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"] = _f(
        "token-mean",
        (
            "how per-token losses are averaged (a seq-mean's sequence is one batch row: the whole trajectory under "
            "prompt_mode inline, but under separate each rehearsal is a row of its own, so the two modes weigh the "
            "roles differently)"
        ),
    )
    importance_sampling_cap: float = _f(
        0.0,
        (
            "truncated importance sampling (TIS) between trainer and engine: before the update the trainer recomputes "
            "the batch's logprobs, the clipped ratio is taken against them, and each token's loss is weighted by "
            "min(pi_trainer / pi_engine, cap) (Yao et al., 2025); 0: off (the ratio is taken against the engine's "
            "recorded logprobs)"
        ),
    )
    skip_empty_updates: bool = _f(
        True,
        (
            "skip the forward and backward passes of a batch in which no loss token has a non-zero advantage (and "
            "there is no KL or entropy term): its loss and gradient would be exactly 0; with one process, also leave "
            "the rows without a non-zero advantage out of the passes of a batch that trains (same gradient); false "
            "runs every row with loss tokens, e.g. to time an update with the same work as a trainer that never skips"
        ),
    )
    ppo_epochs: int = _f(1, "passes over each rollout batch")
    num_minibatches: int = _f(1, "optimizer steps per epoch; the B*K trajectory rows must split into whole minibatches")

    # --- Parameters that control the optimizer --------------------------------------------------------
    optim: OptimConfig = nested_config_field(
        OptimConfig, "AdamW and its learning-rate schedule (OptimConfig)", lr=1e-5, weight_decay=0.01
    )
    max_nonfinite_steps: int = _f(
        3,
        (
            "an optimizer step whose loss or clipped gradient is not finite is skipped (train/skipped_nonfinite); this "
            "many in a row (per model) stop the run"
        ),
    )

    # --- Parameters that control memory ---------------------------------------------------------------
    memory: MemoryConfig = nested_config_field(MemoryConfig, "time traded for memory (MemoryConfig)")
    micro_batch_tokens: int = _f(
        1024,
        (
            "padded tokens per forward/backward pass of the update: a minibatch's rows, sorted by length, are packed "
            "into micro-batches of at most this many (rows x longest row; a longer row goes alone) whose gradients add "
            "up to the minibatch's, so only float rounding changes. Less padding is less work, and a CPU forward "
            "without padding skips the attention mask (1024 was fastest on 2 cores for 135M; raise it on a GPU)"
        ),
    )
    shard_optimizer: bool = _f(
        False,
        (
            "ZeRO stage 1 under accelerate launch: each of W processes keeps AdamW's state for 1/W of the weights "
            "(torch's ZeroRedundancyOptimizer); no effect with one process"
        ),
    )
    dtype: Literal["float32", "bfloat16"] = _f(
        "float32",
        (
            "dtype of the trained weights (and of generation); logprobs and the loss are computed in float32 either "
            "way. bfloat16 halves weight memory but AdamW updates smaller than half of bfloat16's spacing (about 0.2% "
            "of a weight) round away, so lr 1e-6 needs float32 weights"
        ),
    )

    # --- Computed at run time (not set by hand) -------------------------------------------------------
    trajectories_per_step: int = field(default=0, init=False, metadata={"help": "B*K (computed)", "computed": True})

    def __post_init__(self) -> None:
        def fail(msg: str) -> NoReturn:
            raise ValueError(f"invalid TrainConfig: {msg}")

        coerce_fields(self)
        if not self.model.strip():
            fail("model must name a model ('smollm2-135m', a local folder or 'tiny-random'), got ''")
        if self.seed < 0:
            fail(f"seed must be >= 0, got {self.seed}")
        if not 0 <= self.judge_unparseable_score <= 1:
            fail(f"judge_unparseable_score must be in [0, 1], got {self.judge_unparseable_score}")
        if self.generated_token_budget < 0:
            fail(f"generated_token_budget must be >= 0 (0: no budget), got {self.generated_token_budget}")
        if self.generated_token_budget and self.optim.lr_schedule != "constant":
            # the schedule decays over num_steps, which a token budget does not fix: it would stop mid-decay
            fail(
                "generated_token_budget needs optim.lr_schedule 'constant' (a decaying schedule runs over "
                "num_steps, and a token budget stops the run at an unknown step): set --optim.lr-schedule constant "
                f"or --generated-token-budget 0, got {self.optim.lr_schedule!r}"
            )
        if self.rehearsal_n < 0 or self.rehearsal_memory_tokens < 1:
            fail(
                f"rehearsal_n must be >= 0 and rehearsal_memory_tokens >= 1, got {self.rehearsal_n}, "
                f"{self.rehearsal_memory_tokens}"
            )
        if self.rehearsal_restate_request and not self.rehearsal_n:
            fail("rehearsal_restate_request repeats the request after a rehearsal memory; set rehearsal_n >= 1")
        if self.max_episode_tokens is not None and self.max_episode_tokens < 1:
            fail(f"max_episode_tokens must be None (no budget) or >= 1, got {self.max_episode_tokens}")
        from agents.engines.registry import registered_engines

        if self.engine not in registered_engines():
            fail(
                f"engine must be one of {registered_engines()} (agents.engines.registry.register_engine adds one), got "
                f"{self.engine!r}"
            )

        for name in (
            "num_steps",
            "batch_tasks",
            "group_size",
            "max_new_tokens",
            "rehearse_max_new_tokens",
            "max_steps_per_turn",
            "ppo_epochs",
            "num_minibatches",
            "micro_batch_tokens",
            "max_nonfinite_steps",
            "user_max_new_tokens",
            "user_max_turns",
        ):
            if getattr(self, name) < 1:
                fail(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.group_size == 1:
            fail(
                "group_size K=1 makes every advantage zero (a group of one has no baseline); set --group-size 2 or more"
            )
        self.trajectories_per_step = self.batch_tasks * self.group_size
        if self.trajectories_per_step % self.num_minibatches:
            fail(
                f"B*K = {self.batch_tasks}*{self.group_size} = {self.trajectories_per_step} rows do not split into "
                f"{self.num_minibatches} whole minibatches; choose --num-minibatches dividing "
                f"{self.trajectories_per_step}"
            )
        from agents.grpo import ADVANTAGE_ESTIMATORS

        if self.algo not in ADVANTAGE_ESTIMATORS:
            fail(
                f"algo must be one of {list(ADVANTAGE_ESTIMATORS)} (agents.grpo.ADVANTAGE_ESTIMATORS), got "
                f"{self.algo!r}"
            )
        for name in (
            "rollout",
            "prompt_mode",
            "rehearsal_mode",
            "reward",
            "policy",
            "weighting",
            "aggregation",
            "dtype",
        ):
            allowed = typing.get_args(_HINTS[name])
            if getattr(self, name) not in allowed:
                fail(f"{name} must be one of {list(allowed)}, got {getattr(self, name)!r}")
        if self.temperature < 0 or self.user_temperature < 0:
            fail(f"temperature and user_temperature must be >= 0, got {self.temperature}, {self.user_temperature}")
        if not 0 <= self.clip_eps_low < 1 or self.clip_eps_high < 0:
            fail(f"need 0 <= clip_eps_low < 1 and clip_eps_high >= 0, got {self.clip_eps_low}, {self.clip_eps_high}")
        if self.beta < 0 or self.entropy_coef < 0 or self.invalid_action_penalty < 0:
            fail("beta, entropy_coef and invalid_action_penalty must be >= 0")
        if self.importance_sampling_cap < 0 or 0 < self.importance_sampling_cap < 1:
            fail(
                f"importance_sampling_cap must be 0 (off) or >= 1 (a cap below 1 would shrink on-policy tokens), "
                f"got {self.importance_sampling_cap}"
            )
        never_rehearses = self.rollout in ("real", "null") or (self.rollout == "hybrid" and self.real_call_prob == 1)
        if self.policy == "per_role" and never_rehearses:
            at = " at real_call_prob=1" if self.rollout == "hybrid" else ""
            fail(
                f"policy=per_role trains a separate REHEARSE model, but rollout={self.rollout}{at} never rehearses; "
                "use policy=shared"
            )
        if self.rollout == "hybrid" and (self.real_call_prob is None or not 0 <= self.real_call_prob <= 1):
            fail(f"rollout=hybrid needs real_call_prob in [0, 1] (--real-call-prob), got {self.real_call_prob}")
        if self.rollout != "hybrid" and self.real_call_prob is not None:
            fail(
                f"real_call_prob is the share of real calls of rollout=hybrid; rollout={self.rollout} takes none: set "
                "--rollout hybrid or leave real_call_prob unset (none)"
            )
        if self.world_model_loss_weight < 0:
            fail(f"world_model_loss_weight must be >= 0 (0: off), got {self.world_model_loss_weight}")
        if self.world_model_demos < 0 or self.world_model_demo_errors < 0:
            fail(
                "world_model_demos and world_model_demo_errors must be >= 0, got "
                f"{self.world_model_demos} and {self.world_model_demo_errors}"
            )
        if self.world_model_demos > 0 and self.world_model_loss_weight == 0:
            fail(
                f"world_model_demos={self.world_model_demos} adds world-model targets, which train nothing at "
                "world_model_loss_weight 0: set --world-model-loss-weight > 0, or world_model_demos 0"
            )
        if self.world_model_demos > 0 and self.prompt_mode != "inline":
            fail(
                "world_model_demos trains on demonstrations in the inline format (the tool outputs within the "
                "trajectory); prompt_mode=separate rehearses from a simulator prompt: set prompt_mode inline"
            )
        if (
            self.world_model_loss_weight > 0
            and self.world_model_demos == 0
            and (self.rollout in ("rehearse", "null") or (self.rollout == "hybrid" and self.real_call_prob == 0))
        ):
            fail(
                f"world_model_loss_weight > 0 trains on tool outputs of the real backend, and rollout={self.rollout}"
                + (" with real_call_prob=0" if self.rollout == "hybrid" else "")
                + " makes none: set --rollout real, or hybrid with --real-call-prob > 0, or --world-model-demos > 0, "
                "or world_model_loss_weight 0"
            )
        if not 0 <= self.min_solvable_fraction <= 1:
            fail(f"min_solvable_fraction must be in [0, 1], got {self.min_solvable_fraction}")
        if self.split not in ("train", "test", "all"):
            fail(f"split must be train, test or all, got {self.split!r}")

    def to_dict(self) -> dict[str, Any]:
        """Every field (computed ones included), JSON/YAML-compatible."""
        return dataclasses.asdict(self)

    RESUME_IGNORES: typing.ClassVar[tuple[str, ...]] = (
        "run_dir",
        "num_steps",
        "generated_token_budget",
        "run",
        "memory",
        "tensorboard",
        "min_solvable_fraction",
        "max_nonfinite_steps",
        "micro_batch_tokens",
        "shard_optimizer",
        "engine",
    )
    """Fields that may change between a run and its resume (bookkeeping, memory, speed: an engine samples from
    the same distribution as another, up to float rounding, which ``train/logprob_mismatch`` reports; a group's
    name, such as ``run``, stands for each of its fields): every other one changes what is trained, so a resume
    with another value refuses unless ``run.allow_config_change``."""


_HINTS = typing.get_type_hints(TrainConfig)


def _settable_fields(cls: type = TrainConfig) -> list[dataclasses.Field]:
    return [f for f in dataclasses.fields(cls) if f.init]


def field_default(f: dataclasses.Field) -> Any:
    """The default value of a dataclass field (its ``default_factory()`` when it has one)."""
    if f.default is not dataclasses.MISSING:
        return f.default
    return f.default_factory()  # type: ignore[operator]  # MISSING is a sentinel object: mypy does not narrow it


def load_dataclass(cls: type, path: str | Path | None = None, **overrides: Any) -> Any:
    """An instance of the config dataclass `cls` from a YAML file (optional) with keyword overrides on top
    (an override of None means "not given"; a nested config's override is a mapping of its fields).

    Raises:
        ValueError: the file is not YAML or gives one key twice in a mapping (the message names the file and the
            line), the YAML names an unknown field (the message lists the valid ones), or a value is invalid.
    """
    return _load(cls, path, {k: v for k, v in overrides.items() if v is not None})


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing a key given twice in one mapping: YAML keeps the last silently, so a
    recipe copied with a field left in twice would run with whichever came last."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, Any] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # <<: *defaults: a key written here overrides a merged one
                continue
            key = self.construct_object(key_node, deep=deep)
            try:
                first = seen.get(key)
            except TypeError:  # an unhashable key: the safe loader's own error says so
                continue
            if first is not None:
                raise yaml.constructor.ConstructorError(
                    None,
                    None,
                    f"{key!r} is given twice in one mapping (line {first.line + 1} and line "
                    f"{key_node.start_mark.line + 1}); keep one",
                    key_node.start_mark,
                )
            seen[key] = key_node.start_mark
        return super().construct_mapping(node, deep=deep)


def _read_yaml(path: str | Path) -> Any:
    """The YAML file at `path` (`_UniqueKeyLoader`).

    Raises:
        ValueError: not YAML, or a key given twice in one mapping: one line naming the file, the problem and
            where.
    """
    try:
        return yaml.load(Path(path).read_text(), Loader=_UniqueKeyLoader)
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        raise ValueError(f"{path}: {err.problem or err.context}{where}") from None
    except yaml.YAMLError as err:
        raise ValueError(f"{path}: {err}") from None


def _load(cls: type, path: str | Path | None, overrides: dict[str, Any]) -> Any:
    """`load_dataclass` with every override applied, None included (an explicit ``--limit none``)."""
    values: dict[str, Any] = {}
    if path is not None:
        loaded = _read_yaml(path) or {}
        if not isinstance(loaded, dict):
            raise ValueError(f"{path}: expected a mapping of {cls.__name__} fields, got {type(loaded).__name__}")
        values.update(loaded)
    values = _merged(values, overrides)  # a nested config's options over the file's mapping of it
    computed = {f.name for f in dataclasses.fields(cls) if not f.init}
    known = {f.name for f in _settable_fields(cls)}
    unknown = sorted(set(values) - known - computed)
    if unknown:
        moved = [f"{name} is {group}.{name}" for name in unknown for group in _groups_holding(cls, name)]
        hint = f" ({'; '.join(moved)})" if moved else ""
        raise ValueError(f"unknown {cls.__name__} field(s) {unknown}{hint}; valid fields: {sorted(known)}")
    return cls(**{k: v for k, v in values.items() if k not in computed})


def _groups_holding(cls: type, name: str) -> list[str]:
    """The nested config fields of `cls` (``optim``, ``run``, ...) that have a field called `name`: where a
    top-level spelling such as ``lr`` belongs (``optim.lr``)."""
    hints = typing.get_type_hints(cls)
    return [
        f.name
        for f in _settable_fields(cls)
        if isinstance(hints[f.name], type)
        and dataclasses.is_dataclass(hints[f.name])
        and any(g.name == name for g in _settable_fields(hints[f.name]))
    ]


def grouped_option_hints(unknown: Sequence[str], known: Iterable[str]) -> list[str]:
    """For each unrecognised ``--option`` in `unknown`, the known options that are it one group level down
    (``--lr`` -> ``--optim.lr``, ``--grpo.lr`` -> ``--grpo.optim.lr``), as "did you mean" lines.

    Args:
        unknown: the command line's unrecognised tokens (values and ``--opt=value`` forms are handled).
        known: the option strings of the parser that refused them, e.g. ``--optim.lr``.

    Returns:
        One line per unrecognised option that has such a twin (``"--lr: did you mean --optim.lr?"``), in order.
    """
    known_paths = [o[2:].split(".") for o in known if o.startswith("--")]
    lines = []
    for token in unknown:
        if not token.startswith("--"):
            continue
        want = token[2:].split("=", 1)[0].split(".")
        matches = sorted(
            {
                "--" + ".".join(path)
                for path in known_paths
                if len(path) == len(want) + 1 and any(path[:i] + path[i + 1 :] == want for i in range(len(path) - 1))
            }
        )
        if matches:
            lines.append(f"{token.split('=', 1)[0]}: did you mean {' or '.join(matches)}?")
    return lines


class HintingArgumentParser(argparse.ArgumentParser):
    """`argparse.ArgumentParser` whose "unrecognized arguments" error also names, for each unknown option, the
    grouped option of the chosen sub-command it is one level short of (`grouped_option_hints`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.subcommands: list[argparse.Action] = []

    def add_subparsers(self, **kwargs: Any) -> Any:
        action = super().add_subparsers(**kwargs)
        self.subcommands.append(action)
        return action

    def option_strings(self) -> set[str]:
        """Every ``--option`` this parser itself accepts (read from its help)."""
        return set(re.findall(r"(?<![\w-])--[A-Za-z][\w.-]*", self.format_help()))

    def chosen_parser(self, namespace: argparse.Namespace) -> HintingArgumentParser:
        """The parser of the sub-command `namespace` chose (recursively), or this one."""
        for action in self.subcommands:
            choices = action.choices if isinstance(action.choices, dict) else {}  # sub-command name -> parser
            sub = choices.get(getattr(namespace, action.dest, None))
            if isinstance(sub, HintingArgumentParser):
                return sub.chosen_parser(namespace)
        return self

    def parse_args(self, args: Any = None, namespace: Any = None) -> Any:
        """As `argparse.ArgumentParser.parse_args`.

        Raises:
            SystemExit: (code 2, via ``error``) a bad or unrecognised option; the message of an unrecognised one
                adds its "did you mean" line when it has a grouped twin in the chosen sub-command.
        """
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            hints = grouped_option_hints(extras, self.chosen_parser(parsed).option_strings())
            self.error("; ".join([f"unrecognized arguments: {' '.join(extras)}", *hints]))
        return parsed


def check_device(device: str, fail) -> None:
    """Call ``fail(message)`` unless `device` is 'auto', 'cpu', 'cuda' or 'cuda:N'."""
    if not re.fullmatch(r"auto|cpu|cuda(:\d+)?", device):
        fail(f"device must be 'auto', 'cpu', 'cuda' or 'cuda:N', got {device!r}")


def load_config(path: str | Path | None = None, **overrides: Any) -> TrainConfig:
    """A `TrainConfig` from a YAML file (optional) with keyword overrides on top; see `load_dataclass`."""
    return load_dataclass(TrainConfig, path, **overrides)


def _bool(text: str) -> bool:
    low = text.lower()
    if low in _TRUE:
        return True
    if low in _FALSE:
        return False
    raise argparse.ArgumentTypeError(f"expected true/false, got {text!r}")


def _optional(kind: type) -> Any:
    """An argparse type for an optional number: the word ``none`` gives None."""

    def parse(text: str) -> Any:
        return None if text.strip().lower() in ("none", "null") else kind(text)

    parse.__name__ = kind.__name__
    return parse


def add_dataclass_arguments(parser: Any, cls: type) -> None:
    """Add ``--config FILE`` and one ``--field-name`` option per settable field of `cls` (help from the field).

    A field that holds another config (`nested_config_field`) becomes a titled group of ``--<field>.<name>``
    options, and a config inside that one a group of ``--<field>.<group>.<name>`` options (as ``--grpo.optim.lr``);
    each option's help ends with its default there (the nested field's defaults over its class's own).
    """
    parser.add_argument(
        "--config", default=None, help=f"YAML file of {cls.__name__} fields (command-line options override it)"
    )
    _add_field_arguments(parser, parser, cls, "", {})


def _add_field_arguments(root: Any, parser: Any, cls: type, prefix: str, defaults: dict[str, Any]) -> None:
    """The options of `cls`'s fields on `parser` (`root` or one of its groups), named ``--<prefix><field>``;
    `defaults` are the values that replace the fields' own defaults in the help."""
    hints = typing.get_type_hints(cls)
    for f in _settable_fields(cls):
        hint = hints[f.name]
        if isinstance(hint, type) and dataclasses.is_dataclass(hint):
            over = defaults.get(f.name, {})
            nested = _merged(f.metadata.get("defaults", {}), over if isinstance(over, dict) else {})
            # every group on the root parser: argparse deprecates groups inside groups
            group = root.add_argument_group(f"{prefix}{f.name}", f.metadata["help"].replace("%", "%%"))
            _add_field_arguments(root, group, hint, f"{prefix}{f.name}.", nested)
            continue
        if type(None) in typing.get_args(hint):  # Optional[X]: the option takes X ("none" gives None via coercion)
            hint = next(a for a in typing.get_args(hint) if a is not type(None))
        origin = typing.get_origin(hint)
        args = typing.get_args(hint)
        default = defaults.get(f.name, field_default(f))
        # argparse %-formats help strings: a literal "%" (as in "30% slower") must be doubled
        help_text = f"{f.metadata['help']} (default: {default})".replace("%", "%%")
        kw: dict[str, Any] = {"default": NOT_GIVEN, "dest": prefix + f.name, "help": help_text}
        if hint is bool:  # ``--flag`` alone is true; ``--flag false`` also works
            kw.update(type=_bool, metavar="BOOL", nargs="?", const=True)
        elif origin is list:
            kw["nargs"] = "*"
        elif origin is Literal:
            kw["choices"] = list(args)
        elif hint in (int, float, str):
            kw["type"] = hint if f.default is not None or hint is str else _optional(hint)
        aliases = [f"--{prefix}{a}" for a in f.metadata.get("aliases", ())]  # e.g. --domains for τ²'s categories
        parser.add_argument("--" + prefix + f.name.replace("_", "-"), *aliases, **kw)


class _NotGiven:
    """The default of every generated option: tells an option left out from one given as ``none``."""

    def __repr__(self) -> str:
        return "NOT_GIVEN"


NOT_GIVEN = _NotGiven()


def _option_values(cls: type, args: argparse.Namespace, prefix: str = "") -> dict[str, Any]:
    """The options given for `cls`'s fields (nested configs as dicts of theirs); left-out ones are absent."""
    hints = typing.get_type_hints(cls)
    values: dict[str, Any] = {}
    for f in _settable_fields(cls):
        if dataclasses.is_dataclass(hints[f.name]):
            nested = _option_values(hints[f.name], args, f"{prefix}{f.name}.")
            if nested:
                values[f.name] = nested
        elif getattr(args, prefix + f.name, NOT_GIVEN) is not NOT_GIVEN:
            values[f.name] = getattr(args, prefix + f.name)
    return values


def dataclass_from_args(cls: type, args: argparse.Namespace) -> Any:
    """The `cls` instance of parsed arguments (``--config`` YAML, then the options given; ``none`` sets None)."""
    return _load(cls, getattr(args, "config", None), _option_values(cls, args))


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    """`add_dataclass_arguments` for `TrainConfig`."""
    add_dataclass_arguments(parser, TrainConfig)


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    """`dataclass_from_args` for `TrainConfig`."""
    return dataclass_from_args(TrainConfig, args)


def _dump_yaml(config: TrainConfig, path: str | Path) -> None:
    Path(path).write_text(yaml.safe_dump(config.to_dict(), sort_keys=False))


def field_docs(cls: type = TrainConfig) -> Sequence[tuple[str, str, Any]]:
    """(name, help, default) of every settable field of `cls`, for docs tables; a nested config's fields are
    named ``<name>.<field>``, with the defaults it has there."""
    flat = flat_fields(cls())
    hints = typing.get_type_hints(cls)
    out: list[tuple[str, str, Any]] = []
    for f in _settable_fields(cls):
        if dataclasses.is_dataclass(hints[f.name]):
            out += [(f"{f.name}.{n}", h, flat[f"{f.name}.{n}"]) for n, h, _ in field_docs(hints[f.name])]
        else:
            out.append((f.name, f.metadata["help"], field_default(f)))
    return out
