"""Role-wise GRPO: advantages and loss as pure functions.

References:
    - EnvACE: Xu et al., 2026, "Internalizing Environment Dynamics via World Rehearsal for Agentic
      Reinforcement Learning", arXiv 2608.06197; the method as this project builds it is docs/design.md §1
      ("Role-wise GRPO"): A = R(τ) − b(q, ρ), b(q, ρ) = Σ_i w_i R(τ_i) / Σ_i w_i over the segments i of
      role ρ in group q.
    - GRPO: Shao et al., 2024, "DeepSeekMath", arXiv 2402.03300, §4.1 (objective eq. 3, KL estimator
      eq. 4, outcome-supervision advantage in §4.1.2).
    - PPO clipped surrogate: Schulman et al., 2017, arXiv 1707.06347, eq. 7; asymmetric clip range
      ("clip-higher") and token-level loss: DAPO, Yu et al., 2025, arXiv 2503.14476.
    - Length and difficulty biases of the loss aggregation and of std scaling: Dr. GRPO, Liu et al., 2025,
      arXiv 2503.20783, §3.1.
    - k3 KL estimator: Schulman, "Approximating KL Divergence", http://joschu.net/blog/kl-approx.html.
    - The world-model loss (`world_model_loss`) is this project's supervised term beside the GRPO objective of
      docs/design.md §1, not a paper's equation: teacher-forced cross-entropy of the REHEARSE role on the tool
      outputs a real backend answered during the rollouts (the idea of a cross-entropy loss on real tool
      observations next to the RL loss, as proposed for TRL's GRPO trainer).

Vocabulary. A *group* is the K trajectories sampled for one instruction q (``group_ids``). A *segment* is
one contiguous run of generated tokens of one role ρ ∈ {ACT, REHEARSE} (``envace_gym.types.Role``). Advantages
are computed per segment, ``(S,)``, then broadcast to tokens, ``(N, T)``, with
`segment_advantages_to_tokens`. N = B·K sequences of T tokens; V is the vocabulary size.

Implementation details (numbered as in CleanRL's docs):

1. **One baseline per (group, role).** ACT and REHEARSE segments of the same group get different baselines
   b(q, ACT), b(q, REHEARSE) (docs/design.md §1). Plain GRPO (`grpo_advantages`) is the ablation with one
   baseline per q over trajectories.
2. **Three weightings of the baseline** (`Weighting`), resolved once through a dict of functions:
   ``turn`` (w = 1 per segment; what the reference code does, so a trajectory with more turns of a role
   weighs more in that role's baseline; the default), ``token`` (w = tokens in the segment), ``trajectory``
   (w = 1 per trajectory that has the role, i.e. w = 1/n for each of its n segments of that role).
3. **The reward is the trajectory's.** Every segment carries R(τ) of its trajectory; the inputs are
   checked: segments of one trajectory must share one group and one reward (else ``ValueError``).
4. **No division by the std by default** (as in the reference runs; Dr. GRPO §3.1 shows that dividing by
   the per-question std up-weights questions that are too easy or too hard). With ``scale_by_std=True`` the
   advantage is divided by the *weighted population* std of the (q, ρ) rewards plus ``eps``
   (sqrt(Σ w (R − b)² / Σ w)); with ``trajectory`` weighting this is ``torch.std(..., correction=0)`` over
   the group's trajectories. DeepSeekMath §4.1.2 does not say which std; TRL uses the unbiased one.
5. **A group of one gets zero.** A (q, ρ) whose segments all come from one trajectory gets A = 0, never
   the raw reward (which would be a baseline-free REINFORCE signal). With K = 1 every advantage is 0.
   A (q, ρ) whose weights sum to 0 (``token`` weighting, all segments empty) also gets 0.
6. **Advantage arithmetic in float64**, returned as float32, so a large reward offset does not eat the
   small differences the baseline exposes.
7. **Outcome advantage per token.** Every token of a segment gets its segment's advantage (no critic, no
   per-token credit); tokens outside any ACT/REHEARSE segment get 0 and must be masked out.
8. **Token-level clipped surrogate.** ratio = exp(log π_θ − log π_old) per token; loss per token
   max(−A·ratio, −A·clip(ratio, 1 − ε_low, 1 + ε_high)) (PPO eq. 7 as a loss; DAPO's asymmetric range,
   0.2/0.2 by default). No dual clip.
9. **Masked positions cannot poison the loss.** The log-ratio and the KL log-difference are set to 0 at
   masked positions *before* ``exp``, and every per-token term is selected with ``torch.where``, so
   padding holding -inf, NaN or garbage gives a finite loss and exactly zero gradient there.
10. **KL in the loss, not in the reward** (DeepSeekMath eq. 3), with the k3 estimator
    exp(ref − lp) − (ref − lp) − 1 ≥ 0 of KL(π_θ ‖ π_ref) (DeepSeekMath eq. 4), weighted by β (0 by default;
    the reference model is then never needed). Computed as expm1(δ) − δ clamped at 0, since the literal
    form rounds to small negatives for |δ| ≲ 1e-4 in float32.
11. **Entropy bonus from the full distribution**, −entropy_coef·H per token, with H computed from logits in
    float32 row chunks (`entropy_from_logits`) so a (N, T, V) softmax never has to exist in full.
12. **Aggregation** (`Aggregation`), resolved once through a dict of functions:
    ``token-mean`` (Σ over all masked tokens / their count; DAPO; every token weighs the same, but the
    normaliser depends on the batch's total length), ``seq-mean-token-mean`` (mean per sequence, then
    mean over sequences; the original GRPO: a token of a short sequence weighs more, so correct short
    answers are favoured and wrong long ones are penalised less, the length bias of Dr. GRPO §3.1),
    ``seq-mean-token-sum`` (sum per sequence, mean over sequences; Dr. GRPO's unbiased form up to its
    constant normaliser: every token's gradient is A/N whatever its sequence length, but the loss
    magnitude grows with length, so the learning rate must be set for it). Sequences with no masked
    token are left out of the seq-means; an all-masked batch gives a loss of 0 (with a zero gradient).
13. **Logged statistics** (floats): ``clip_fraction`` is the fraction of masked tokens where the clipped
    term is active and the gradient is zero (A > 0 and ratio > 1 + ε_high, or A < 0 and ratio < 1 − ε_low);
    ``approx_kl`` is the masked token mean of (ratio − 1) − log ratio, the k3 estimate of KL(π_old ‖ π_θ)
    (CleanRL's ``approx_kl``); ``ratio_mean`` is the masked token mean of the ratio. These are always
    token means, whatever the aggregation of the loss.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from envace_gym.types import Role

__all__ = [
    "Weighting",
    "Aggregation",
    "WEIGHTINGS",
    "AGGREGATIONS",
    "AGGREGATION_PARTS",
    "aggregation_count",
    "role_wise_advantages",
    "grpo_advantages",
    "act_only_advantages",
    "AdvantageEstimator",
    "ADVANTAGE_ESTIMATORS",
    "advantage_estimator",
    "segment_advantages_to_tokens",
    "kl_k3",
    "entropy_from_logits",
    "aggregate",
    "LossStats",
    "policy_loss",
    "grpo_loss",
    "world_model_loss",
]

Weighting = Literal["turn", "token", "trajectory"]
Aggregation = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"]

_TRAINABLE_ROLES = (int(Role.ACT), int(Role.REHEARSE))


# ---------------------------------------------------------------------------------------------------------
# Input checks
# ---------------------------------------------------------------------------------------------------------


def _check_same_shape(**tensors: Tensor) -> None:
    """Raise ``ValueError`` naming every shape when the given tensors do not all have the same shape."""
    shapes = {name: tuple(t.shape) for name, t in tensors.items()}
    if len(set(shapes.values())) > 1:
        listed = ", ".join(f"{name} {shape}" for name, shape in shapes.items())
        raise ValueError(f"shape mismatch: {listed}")


def _check_segments(rewards: Tensor, group_ids: Tensor, roles: Tensor, traj_ids: Tensor, num_tokens: Tensor) -> None:
    """Validate the ``(S,)`` segment inputs of `role_wise_advantages` (detail 3)."""
    if rewards.ndim != 1:
        raise ValueError(f"rewards must be 1-D (S,), got shape {tuple(rewards.shape)}")
    _check_same_shape(rewards=rewards, group_ids=group_ids, roles=roles, traj_ids=traj_ids, num_tokens=num_tokens)
    if not rewards.is_floating_point():
        raise TypeError(f"rewards must be a floating tensor, got {rewards.dtype}")
    for name, t in (("group_ids", group_ids), ("roles", roles), ("traj_ids", traj_ids), ("num_tokens", num_tokens)):
        if t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
            raise TypeError(f"{name} must be an integer tensor, got {t.dtype}")
    if rewards.numel() == 0:
        return
    if not torch.isfinite(rewards).all():
        raise ValueError("rewards must be finite")
    if (num_tokens < 0).any():
        raise ValueError(f"num_tokens must be >= 0, got min {int(num_tokens.min())}")
    bad_roles = set(roles.unique().tolist()) - set(_TRAINABLE_ROLES)
    if bad_roles:
        raise ValueError(
            f"roles must be Role.ACT ({int(Role.ACT)}) or Role.REHEARSE ({int(Role.REHEARSE)}), got {sorted(bad_roles)}"
        )
    # One trajectory -> one group and one reward: per-trajectory min and max must agree.
    _, traj_inverse = torch.unique(traj_ids, return_inverse=True)  # (S,) trajectory index in [0, U)
    num_traj = int(traj_inverse.max()) + 1
    for name, values in (("group_ids", group_ids.long()), ("rewards", rewards)):
        lo = values.new_zeros(num_traj).scatter_reduce(0, traj_inverse, values, "amin", include_self=False)  # (U,)
        hi = values.new_zeros(num_traj).scatter_reduce(0, traj_inverse, values, "amax", include_self=False)  # (U,)
        if (lo != hi).any():
            raise ValueError(f"segments of one trajectory (same traj_ids) must share one {name} value")


# ---------------------------------------------------------------------------------------------------------
# Advantages (details 1-7)
# ---------------------------------------------------------------------------------------------------------


def _turn_weights(group_ids: Tensor, roles: Tensor, traj_ids: Tensor, num_tokens: Tensor) -> Tensor:
    """w = 1 per segment. Returns ``(S,) float64``."""
    return torch.ones(group_ids.shape, dtype=torch.float64, device=group_ids.device)  # (S,)


def _token_weights(group_ids: Tensor, roles: Tensor, traj_ids: Tensor, num_tokens: Tensor) -> Tensor:
    """w = number of tokens of the segment. Returns ``(S,) float64``."""
    return num_tokens.to(torch.float64)  # (S,)


def _trajectory_weights(group_ids: Tensor, roles: Tensor, traj_ids: Tensor, num_tokens: Tensor) -> Tensor:
    """w = 1/n for each of the n segments of role ρ of a trajectory, so each trajectory counts once.

    Returns ``(S,) float64``.
    """
    keys = torch.stack([group_ids.long(), roles.long(), traj_ids.long()], dim=1)  # (S, 3)
    _, inverse, counts = torch.unique(keys, dim=0, return_inverse=True, return_counts=True)  # (S,), (U,)
    return 1.0 / counts[inverse].to(torch.float64)  # (S,)


WEIGHTINGS: dict[str, Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]] = {
    "turn": _turn_weights,
    "token": _token_weights,
    "trajectory": _trajectory_weights,
}
"""Weighting name -> ``fn(group_ids, roles, traj_ids, num_tokens) -> (S,) float64`` baseline weights."""


def _resolve(table: dict[str, Callable], name: str, what: str) -> Callable:
    """Look ``name`` up once; unknown names raise ``ValueError`` listing the valid ones."""
    try:
        return table[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown {what} {name!r}; valid: {', '.join(repr(k) for k in table)}") from None


def _baseline_advantages(
    rewards: Tensor, keys: Tensor, traj_ids: Tensor, weights: Tensor, scale_by_std: bool, eps: float
) -> Tensor:
    """A = R − b(key) per segment, b the weighted mean over the key's segments (details 4-6).

    Args:
        rewards: ``(S,)`` floating, R(τ) per segment.
        keys: ``(S, k) int64``, the baseline key of each segment ((q, ρ) or (q,)).
        traj_ids: ``(S,)`` integer, trajectory of each segment.
        weights: ``(S,) float64`` baseline weights, >= 0.
        scale_by_std: divide by the weighted population std of the key's rewards plus ``eps``.
        eps: added to the std.

    Returns:
        ``(S,) float32`` advantages, 0 for keys with a single trajectory or zero total weight.
    """
    r = rewards.to(torch.float64)  # (S,)
    _, key_inverse = torch.unique(keys, dim=0, return_inverse=True)  # (S,) key index in [0, K)
    num_keys = int(key_inverse.max()) + 1
    zeros = torch.zeros(num_keys, dtype=torch.float64, device=r.device)  # (K,)
    weight_sum = zeros.index_add(0, key_inverse, weights)  # (K,)
    safe_weight_sum = torch.where(weight_sum > 0, weight_sum, torch.ones_like(weight_sum))  # (K,)
    baseline = zeros.index_add(0, key_inverse, weights * r) / safe_weight_sum  # (K,)
    advantages = r - baseline[key_inverse]  # (S,)
    if scale_by_std:
        variance = zeros.index_add(0, key_inverse, weights * advantages**2) / safe_weight_sum  # (K,)
        std = variance.sqrt()[key_inverse]  # (S,)
        # Equal rewards leave nothing to scale: A = 0. Tested on the rewards themselves, since the weighted
        # mean of equal rewards can differ from them by rounding (0.1 three times), which std + 0 would
        # blow up to +-1; std == 0 also covers weight-free segments, where eps = 0 would give 0 / 0.
        highest = zeros.scatter_reduce(0, key_inverse, r, "amax", include_self=False)  # (K,)
        lowest = zeros.scatter_reduce(0, key_inverse, r, "amin", include_self=False)  # (K,)
        flat = (highest == lowest)[key_inverse] | (std == 0)  # (S,)
        advantages = torch.where(
            flat, torch.zeros_like(advantages), advantages / torch.where(flat, 1.0, std + eps)
        )  # (S,)
    # Detail 5: a key whose segments come from one trajectory only (or carry no weight) gets 0.
    key_traj = torch.stack([key_inverse, traj_ids.long()], dim=1)  # (S, 2)
    distinct = torch.unique(key_traj, dim=0)  # (U, 2) one row per (key, trajectory)
    trajectories_per_key = torch.bincount(distinct[:, 0], minlength=num_keys)  # (K,)
    valid = (trajectories_per_key >= 2) & (weight_sum > 0)  # (K,)
    advantages = torch.where(valid[key_inverse], advantages, torch.zeros_like(advantages))  # (S,)
    return advantages.to(torch.float32)  # (S,)


def role_wise_advantages(
    rewards: Tensor,
    group_ids: Tensor,
    roles: Tensor,
    traj_ids: Tensor,
    num_tokens: Tensor,
    weighting: Weighting = "turn",
    scale_by_std: bool = False,
    eps: float = 1e-6,
) -> Tensor:
    """Role-wise GRPO advantage of every segment: A = R(τ) − b(q, ρ) (EnvACE, docs/design.md §1).

    b(q, ρ) = Σ_i w_i R(τ_i) / Σ_i w_i over the segments i of role ρ in group q (details 1-6 of the module
    docstring).

    Args:
        rewards: ``(S,)`` floating, the reward R(τ) of each segment's trajectory (repeated for each of its
            segments).
        group_ids: ``(S,)`` integer, the instruction q (group) of each segment.
        roles: ``(S,)`` integer, ``Role.ACT`` (1) or ``Role.REHEARSE`` (2).
        traj_ids: ``(S,)`` integer, the trajectory of each segment (unique across the batch).
        num_tokens: ``(S,)`` integer >= 0, tokens in each segment (used by ``token`` weighting only, always
            checked).
        weighting: ``"turn"`` (w = 1 per segment; the reference code), ``"token"`` (w = tokens in the
            segment) or ``"trajectory"`` (w = 1 per trajectory that has the role).
        scale_by_std: divide by the weighted population std of the (q, ρ) rewards plus ``eps`` (off by
            default, as in the reference runs).
        eps: added to the std when ``scale_by_std`` (>= 0); a (q, ρ) whose rewards are all equal, or
            whose weighted std is 0 (all weight on one trajectory's segments), gets 0.

    Returns:
        ``(S,) float32`` advantages. A (q, ρ) with segments from a single trajectory gets 0.

    Raises:
        ValueError: inputs are not all 1-D of the same length (the message names the shapes); ``weighting``
            is unknown (the message lists the valid ones); a role is not ACT/REHEARSE; a reward is not
            finite; ``num_tokens`` is negative; segments of one trajectory disagree on group or reward;
            ``eps`` is negative or not finite.
        TypeError: ``rewards`` is not floating or an id tensor is not integer.
    """
    weight_fn = _resolve(WEIGHTINGS, weighting, "weighting")
    if not (math.isfinite(eps) and eps >= 0):
        raise ValueError(f"eps must be a finite number >= 0, got {eps!r}")
    _check_segments(rewards, group_ids, roles, traj_ids, num_tokens)
    if rewards.numel() == 0:
        return torch.zeros(0, dtype=torch.float32, device=rewards.device)  # (0,)
    weights = weight_fn(group_ids, roles, traj_ids, num_tokens)  # (S,)
    keys = torch.stack([group_ids.long(), roles.long()], dim=1)  # (S, 2) baseline key (q, ρ)
    return _baseline_advantages(rewards, keys, traj_ids, weights, scale_by_std, eps)  # (S,)


def grpo_advantages(
    rewards: Tensor,
    group_ids: Tensor,
    traj_ids: Tensor,
    scale_by_std: bool = False,
    eps: float = 1e-6,
) -> Tensor:
    """Plain GRPO advantage: one baseline per q, the mean reward over the group's trajectories.

    DeepSeekMath §4.1.2 (outcome supervision), the "plain GRPO" ablation of docs/design.md §1. Rows may be
    trajectories (``traj_ids`` all distinct) or segments (each trajectory counts once whatever its number
    of segments), so the same segment tensors as `role_wise_advantages` can be passed.

    Args:
        rewards: ``(S,)`` floating, R(τ) of each row's trajectory.
        group_ids: ``(S,)`` integer, the instruction q of each row.
        traj_ids: ``(S,)`` integer, the trajectory of each row.
        scale_by_std: divide by the population std of the group's trajectory rewards plus ``eps``.
        eps: added to the std when ``scale_by_std`` (>= 0); a group whose rewards are all equal gets 0.

    Returns:
        ``(S,) float32`` advantages; a group of one trajectory gets 0.

    Raises:
        ValueError: shapes differ (named), a reward is not finite, rows of one trajectory disagree on
            group or reward, ``eps`` is negative or not finite.
        TypeError: ``rewards`` is not floating or an id tensor is not integer.
    """
    roles = torch.full_like(group_ids, int(Role.ACT))  # (S,) one pseudo-role: one baseline per q
    return role_wise_advantages(
        rewards, group_ids, roles, traj_ids, torch.ones_like(group_ids), "trajectory", scale_by_std, eps
    )  # (S,)


def _grpo_estimator(
    rewards: Tensor,
    group_ids: Tensor,
    roles: Tensor,
    traj_ids: Tensor,
    num_tokens: Tensor,
    weighting: Weighting = "turn",
    scale_by_std: bool = False,
) -> Tensor:
    """`grpo_advantages` with the estimator signature (``roles``, ``num_tokens`` and ``weighting`` unused)."""
    return grpo_advantages(rewards, group_ids, traj_ids, scale_by_std=scale_by_std)  # (S,)


def act_only_advantages(
    rewards: Tensor,
    group_ids: Tensor,
    roles: Tensor,
    traj_ids: Tensor,
    num_tokens: Tensor,
    weighting: Weighting = "turn",
    scale_by_std: bool = False,
) -> Tensor:
    """`role_wise_advantages` with every REHEARSE segment's advantage set to 0: the policy gradient trains ACT only,
    exactly as role-wise GRPO trains it, and leaves the REHEARSE role (the world model) where it was. The ablation
    that tells what the outcome reward's gradient on rehearsed outputs does to the world model. Inputs, shapes and
    errors as in `role_wise_advantages`; returns ``(S,) float32``."""
    advantages = role_wise_advantages(rewards, group_ids, roles, traj_ids, num_tokens, weighting, scale_by_std)
    return torch.where(roles == int(Role.REHEARSE), torch.zeros_like(advantages), advantages)  # (S,)


AdvantageEstimator = Callable[..., Tensor]
"""``fn(rewards, group_ids, roles, traj_ids, num_tokens, *, weighting, scale_by_std) -> (S,) float32``: the
advantage of every ACT/REHEARSE segment, inputs as in `role_wise_advantages`."""

ADVANTAGE_ESTIMATORS: dict[str, AdvantageEstimator] = {
    "role_grpo": role_wise_advantages,  # one baseline per (group, role): EnvACE
    "grpo": _grpo_estimator,  # one baseline per group: the plain-GRPO ablation
    "role_grpo_act_only": act_only_advantages,  # role-wise GRPO on ACT tokens only: the world model is not trained
}
"""Estimator name (``TrainConfig.algo``) -> `AdvantageEstimator`. A new estimator is one function here and
one entry in this dict; the config check, `agents.rollout.build_batch` and the trainer look names up here."""


def advantage_estimator(name: str) -> AdvantageEstimator:
    """The estimator registered as `name`.

    Raises:
        ValueError: an unknown name (the message lists the registered ones).
    """
    return _resolve(ADVANTAGE_ESTIMATORS, name, "advantage estimator (algo)")


def segment_advantages_to_tokens(segment_advantages: Tensor, token_segment_ids: Tensor) -> Tensor:
    """Broadcast segment advantages to tokens (detail 7).

    Args:
        segment_advantages: ``(S,)`` floating, from `role_wise_advantages` or `grpo_advantages`.
        token_segment_ids: ``(N, T)`` integer, the index in ``[0, S)`` of the segment each token belongs to,
            or -1 for tokens of no trainable segment (prompt, observation, template, padding).

    Returns:
        ``(N, T) float32``: ``segment_advantages[token_segment_ids]``, 0 where the id is -1.

    Raises:
        ValueError: ``segment_advantages`` is not 1-D, or an id is < -1 or >= S.
        TypeError: ``token_segment_ids`` is not an integer tensor.
    """
    if segment_advantages.ndim != 1:
        raise ValueError(f"segment_advantages must be 1-D (S,), got shape {tuple(segment_advantages.shape)}")
    if token_segment_ids.is_floating_point() or token_segment_ids.dtype == torch.bool:
        raise TypeError(f"token_segment_ids must be an integer tensor, got {token_segment_ids.dtype}")
    num_segments = segment_advantages.shape[0]
    if token_segment_ids.numel() and (
        int(token_segment_ids.min()) < -1 or int(token_segment_ids.max()) >= num_segments
    ):
        raise ValueError(
            f"token_segment_ids must lie in [-1, {num_segments}) for S = {num_segments} segments, "
            f"got [{int(token_segment_ids.min())}, {int(token_segment_ids.max())}]"
        )
    ids = token_segment_ids.long()  # (N, T)
    padded = torch.cat([segment_advantages.float(), segment_advantages.new_zeros(1, dtype=torch.float32)])  # (S+1,)
    index = torch.where(ids >= 0, ids, torch.full_like(ids, num_segments))  # (N, T) -1 -> the trailing 0
    return padded[index]  # (N, T)


# ---------------------------------------------------------------------------------------------------------
# Loss (details 8-13)
# ---------------------------------------------------------------------------------------------------------


def kl_k3(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """Per-token k3 estimate of KL(π_θ ‖ π_ref) for tokens sampled from π_θ (detail 10).

    k3 = exp(ref − lp) − (ref − lp) − 1, unbiased and ≥ 0 (Schulman, http://joschu.net/blog/kl-approx.html;
    DeepSeekMath eq. 4). Computed as ``expm1(δ) − δ`` and clamped at 0: written literally, exp(δ) − δ − 1
    rounds to small negatives for |δ| ≲ 1e-4 in float32. No other clamping (large δ overflow to inf): mask
    padding before calling, or use `grpo_loss`, which does.

    Args:
        logprobs: ``(N, T)`` floating, log π_θ of the sampled tokens.
        ref_logprobs: ``(N, T)`` floating, log π_ref of the same tokens.

    Returns:
        ``(N, T)``, same dtype as the inputs; 0 where the two are equal.

    Raises:
        ValueError: the shapes differ (the message names them).
    """
    _check_same_shape(logprobs=logprobs, ref_logprobs=ref_logprobs)
    delta = ref_logprobs - logprobs  # (N, T)
    return torch.clamp(torch.expm1(delta) - delta, min=0.0)  # (N, T)


def entropy_from_logits(logits: Tensor, chunk_size: int = 1024) -> Tensor:
    """Per-token entropy H = logsumexp(l) − Σ_v softmax(l)_v · l_v of the next-token distribution (detail 11).

    Rows of the flattened ``(N·T, V)`` logits are processed ``chunk_size`` at a time in float32, so the
    peak extra memory is ``chunk_size × V`` floats rather than ``N × T × V``. Differentiable.

    Args:
        logits: ``(N, T, V)`` floating (bf16/fp16 are upcast per chunk).
        chunk_size: rows per chunk, >= 1.

    Returns:
        ``(N, T) float32``.

    Raises:
        ValueError: ``logits`` is not 3-D or ``chunk_size`` < 1.
    """
    if logits.ndim != 3:
        raise ValueError(f"logits must be 3-D (N, T, V), got shape {tuple(logits.shape)}")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    n, t, v = logits.shape
    rows = logits.reshape(n * t, v)  # (N·T, V)
    entropies = []
    for chunk in rows.split(chunk_size, dim=0):  # each (≤chunk_size, V)
        chunk = chunk.float()  # (c, V)
        logp = torch.log_softmax(chunk, dim=-1)  # (c, V)
        entropies.append(-(logp.exp() * logp).sum(dim=-1))  # (c,)
    if not entropies:
        return logits.new_zeros((n, t), dtype=torch.float32)  # (N, T)
    return torch.cat(entropies).reshape(n, t)  # (N, T)


def _token_parts(values: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """(Σ over masked tokens, number of masked tokens)."""
    masked = torch.where(mask, values, torch.zeros_like(values))  # (N, T)
    return masked.sum(), mask.sum()  # (), ()


def _seq_parts(per_seq: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """(Σ of ``per_seq (N,)`` over sequences with a masked token, number of such sequences)."""
    has_tokens = mask.any(dim=-1)  # (N,)
    return torch.where(has_tokens, per_seq, torch.zeros_like(per_seq)).sum(), has_tokens.sum()  # (), ()


def _seq_token_mean_parts(values: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """Mean over masked tokens of each sequence; summed over non-empty sequences, and their number."""
    masked = torch.where(mask, values, torch.zeros_like(values))  # (N, T)
    return _seq_parts(masked.sum(dim=-1) / mask.sum(dim=-1).clamp(min=1), mask)


def _seq_token_sum_parts(values: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """Sum over masked tokens of each sequence; summed over non-empty sequences, and their number."""
    masked = torch.where(mask, values, torch.zeros_like(values))  # (N, T)
    return _seq_parts(masked.sum(dim=-1), mask)


def _token_mean(values: Tensor, mask: Tensor) -> Tensor:
    """Σ over masked tokens / number of masked tokens (0 if none)."""
    total, count = _token_parts(values, mask)
    return total / count.clamp(min=1)  # ()


AGGREGATION_PARTS: dict[str, Callable[[Tensor, Tensor], tuple[Tensor, Tensor]]] = {
    "token-mean": _token_parts,
    "seq-mean-token-mean": _seq_token_mean_parts,
    "seq-mean-token-sum": _seq_token_sum_parts,
}
"""Aggregation name -> ``fn(values (N, T), mask (N, T) bool) -> (numerator (), count ())``: the aggregate is
numerator / max(count, 1). A data-parallel shard divides its numerator by the count of the whole batch."""


def _divide(parts: Callable[[Tensor, Tensor], tuple[Tensor, Tensor]]) -> Callable[[Tensor, Tensor], Tensor]:
    def fn(values: Tensor, mask: Tensor) -> Tensor:
        total, count = parts(values, mask)
        return total / count.clamp(min=1)  # ()

    fn.__doc__ = parts.__doc__
    return fn


AGGREGATIONS: dict[str, Callable[[Tensor, Tensor], Tensor]] = {
    name: _divide(fn) for name, fn in AGGREGATION_PARTS.items()
}
"""Aggregation name -> ``fn(values (N, T), mask (N, T) bool) -> ()`` (detail 12)."""


def aggregation_count(mask: Tensor, mode: Aggregation = "token-mean") -> int:
    """The count an aggregation divides by: masked tokens (``token-mean``) or sequences with a masked token
    (the seq-means). Data-parallel training sums it over the shards and passes it as ``count`` to
    `grpo_loss`, so the shards' losses add up to the loss of the whole batch.

    Raises:
        ValueError: ``mode`` is unknown.
        TypeError: ``mask`` is not bool.
    """
    _resolve(AGGREGATIONS, mode, "aggregation")
    _check_mask(mask, mask)
    return int(mask.sum()) if mode == "token-mean" else int(mask.any(dim=-1).sum())


def _check_mask(mask: Tensor, like: Tensor) -> None:
    if mask.dtype != torch.bool:
        raise TypeError(f"mask must be a bool tensor, got {mask.dtype}")
    if like.ndim != 2:
        raise ValueError(f"per-token tensors must be 2-D (N, T), got shape {tuple(like.shape)}")


def aggregate(values: Tensor, mask: Tensor, mode: Aggregation = "token-mean", count: float | None = None) -> Tensor:
    """Reduce per-token values to a scalar over the masked tokens (detail 12).

    - ``token-mean``: Σ_{n,t} m·x / Σ_{n,t} m (DAPO). Each token weighs the same; the normaliser is the
      batch's total token count.
    - ``seq-mean-token-mean``: mean_n (Σ_t m·x / Σ_t m) (original GRPO, DeepSeekMath eq. 3). Tokens of short
      sequences weigh more: the length bias of Dr. GRPO (Liu et al., 2025, arXiv 2503.20783, §3.1).
    - ``seq-mean-token-sum``: mean_n Σ_t m·x (Dr. GRPO's unbiased form, with N in place of its constant):
      no per-length normalisation, so the scalar grows with sequence length.

    Sequences with no masked token are left out of the seq-means; no masked token at all gives 0.

    Args:
        values: ``(N, T)`` floating.
        mask: ``(N, T) bool``, True for tokens that count.
        mode: one of `AGGREGATIONS`.
        count: the count to divide by instead of this batch's own (`aggregation_count`): the count of the
            whole batch when ``values`` is one data-parallel shard of it, so the shards' results add up to
            the whole batch's. None: this batch's count.

    Returns:
        A 0-d tensor of ``values``' dtype.

    Raises:
        ValueError: the shapes differ or are not 2-D; ``mode`` is unknown (the valid ones are listed).
        TypeError: ``mask`` is not bool.
    """
    parts = _resolve(AGGREGATION_PARTS, mode, "aggregation")
    _check_same_shape(values=values, mask=mask)
    _check_mask(mask, values)
    return _reduce(parts, values, mask, count)  # ()


def _reduce(parts, values: Tensor, mask: Tensor, count: float | None) -> Tensor:
    """numerator / max(count, 1), with this batch's count when ``count`` is None."""
    total, own = parts(values, mask)
    return total / (own.clamp(min=1) if count is None else max(float(count), 1.0))  # ()


def _clipped_surrogate(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    clip_eps_low: float,
    clip_eps_high: float,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Per-token PPO clipped loss (details 8, 9, 13); inputs already checked. Returns ``(N, T)`` and 0-d stats."""
    if not 0.0 <= clip_eps_low < 1.0:
        raise ValueError(f"clip_eps_low must be in [0, 1), got {clip_eps_low}")
    if clip_eps_high < 0.0:
        raise ValueError(f"clip_eps_high must be >= 0, got {clip_eps_high}")
    zeros = torch.zeros_like(logprobs)  # (N, T)
    log_ratio = torch.where(mask, logprobs - old_logprobs, zeros)  # (N, T) 0 at masked positions (detail 9)
    ratio = torch.exp(log_ratio)  # (N, T)
    adv = torch.where(mask, advantages, torch.zeros_like(advantages))  # (N, T)
    pg_losses1 = -adv * ratio  # (N, T)
    pg_losses2 = -adv * torch.clamp(ratio, 1.0 - clip_eps_low, 1.0 + clip_eps_high)  # (N, T)
    pg_loss = torch.where(mask, torch.maximum(pg_losses1, pg_losses2), zeros)  # (N, T)
    with torch.no_grad():
        clipped = ((adv > 0) & (ratio > 1.0 + clip_eps_high)) | ((adv < 0) & (ratio < 1.0 - clip_eps_low))  # (N, T)
        stats = {
            "clip_fraction": _token_mean(clipped.to(ratio.dtype), mask),
            "approx_kl": _token_mean((ratio - 1.0) - log_ratio, mask),
            "ratio_mean": _token_mean(ratio, mask),
        }
    return pg_loss, stats


@dataclass(frozen=True)
class LossStats:
    """Statistics of one loss evaluation (`policy_loss`, `grpo_loss`), as Python floats.

    Attributes:
        loss: the aggregated loss.
        pg_loss: its clipped policy-gradient term (same aggregation).
        kl: its k3 KL term before ``beta`` (0 without reference logprobs).
        entropy: its entropy term before ``entropy_coef`` (0 without entropies).
        clip_fraction: masked token mean of tokens whose importance ratio was clipped (detail 13).
        approx_kl: masked token mean of ``(r - 1) - log r`` (Schulman's k3 of the old policy to the new).
        ratio_mean: masked token mean of the importance ratio r.
        world_model_loss: `world_model_loss` before its weight (0 when none is computed; the trainer adds the
            weighted term to ``loss``).
    """

    loss: float
    pg_loss: float
    kl: float
    entropy: float
    clip_fraction: float
    approx_kl: float
    ratio_mean: float
    world_model_loss: float = 0.0

    def to_dict(self) -> dict[str, float]:
        """The fields as a dict (metric name -> value)."""
        return dataclasses.asdict(self)


def _check_loss_inputs(**tensors: Tensor) -> None:
    mask = tensors.pop("mask")
    _check_same_shape(**tensors, mask=mask)
    _check_mask(mask, mask)


def policy_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    clip_eps_low: float = 0.2,
    clip_eps_high: float = 0.2,
    aggregation: Aggregation = "token-mean",
    count: float | None = None,
) -> tuple[Tensor, LossStats]:
    """Token-level PPO clipped surrogate loss (PPO eq. 7, negated; DAPO's asymmetric clip).

    Per token: max(−A·ratio, −A·clip(ratio, 1 − ε_low, 1 + ε_high)), ratio = exp(logprobs − old_logprobs),
    then reduced with ``aggregation`` over the masked tokens (details 8, 9, 12, 13).

    Args:
        logprobs: ``(N, T)`` floating, log π_θ of the sampled tokens (carries the gradient).
        old_logprobs: ``(N, T)`` floating, log π_old recorded at generation (no gradient is taken).
        advantages: ``(N, T)`` floating, e.g. from `segment_advantages_to_tokens`.
        mask: ``(N, T) bool``, True for ACT/REHEARSE tokens that carry loss.
        clip_eps_low: ε_low in [0, 1).
        clip_eps_high: ε_high >= 0.
        aggregation: one of `AGGREGATIONS`.
        count: what the aggregation divides by (`aggregate`); None: this batch's own count.

    Returns:
        ``(loss, stats)``: a 0-d loss tensor and its `LossStats` (``kl`` and ``entropy`` 0, ``pg_loss`` = ``loss``).

    Raises:
        ValueError: shapes differ or are not 2-D (named); unknown ``aggregation`` (valid ones listed); an ε
            is out of range.
        TypeError: ``mask`` is not bool.
    """
    parts = _resolve(AGGREGATION_PARTS, aggregation, "aggregation")
    _check_loss_inputs(logprobs=logprobs, old_logprobs=old_logprobs, advantages=advantages, mask=mask)
    pg_loss, stats = _clipped_surrogate(
        logprobs, old_logprobs.detach(), advantages.detach(), mask, clip_eps_low, clip_eps_high
    )  # (N, T)
    loss = _reduce(parts, pg_loss, mask, count)  # ()
    value = float(loss.detach())
    return loss, LossStats(loss=value, pg_loss=value, kl=0.0, entropy=0.0, **{k: float(v) for k, v in stats.items()})


def grpo_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    ref_logprobs: Tensor | None = None,
    entropy: Tensor | None = None,
    clip_eps_low: float = 0.2,
    clip_eps_high: float = 0.2,
    beta: float = 0.0,
    entropy_coef: float = 0.0,
    aggregation: Aggregation = "token-mean",
    count: float | None = None,
    token_weights: Tensor | None = None,
) -> tuple[Tensor, LossStats]:
    """The GRPO loss: clipped surrogate + β·KL_k3 − entropy_coef·H, aggregated once (DeepSeekMath eq. 3).

    Per token ℓ = max(−A·ratio, −A·clip(ratio, 1 − ε_low, 1 + ε_high)) + β·k3(π_θ, π_ref) − c·H, then
    ``aggregation`` over the masked tokens (details 8-13). All three terms use the same aggregation.

    Args:
        logprobs: ``(N, T)`` floating, log π_θ of the sampled tokens (carries the gradient).
        old_logprobs: ``(N, T)`` floating, log π_old recorded at generation.
        advantages: ``(N, T)`` floating.
        mask: ``(N, T) bool``, True for tokens that carry loss.
        ref_logprobs: ``(N, T)`` floating, log π_ref of a frozen reference; required when ``beta > 0``.
        entropy: ``(N, T)`` floating, per-token entropy of π_θ (`entropy_from_logits`); required when
            ``entropy_coef > 0``.
        clip_eps_low: ε_low in [0, 1) (0.2).
        clip_eps_high: ε_high >= 0 (0.2).
        beta: KL coefficient β >= 0 (0: no reference model needed).
        entropy_coef: entropy bonus coefficient >= 0.
        aggregation: one of `AGGREGATIONS`.
        count: what the aggregation divides by (`aggregate`): data-parallel training passes the whole batch's
            `aggregation_count`, so the shards' losses (and gradients) add up to the whole batch's. None:
            this batch's own count. The token-mean statistics (clip fraction, approx KL, ratio) stay this
            batch's own.
        token_weights: ``(N, T)`` floating, a per-token factor on the clipped surrogate (no gradient is
            taken): truncated importance sampling passes ``min(π_trainer / π_engine, cap)`` (Yao et al., 2025,
            "Your Efficient RL Framework Secretly Brings You Off-Policy RL Training"), correcting for
            logprobs that differ between the generation engine and the trainer. None: 1.

    Returns:
        ``(loss, stats)``: a 0-d loss tensor and its `LossStats` (each term with the loss's aggregation;
        ``kl``/``entropy`` are 0 when their input is not given).

    Raises:
        ValueError: shapes differ or are not 2-D (named); unknown ``aggregation`` (valid ones listed); an ε,
            ``beta`` or ``entropy_coef`` is out of range; ``beta > 0`` without ``ref_logprobs`` or
            ``entropy_coef > 0`` without ``entropy``.
        TypeError: ``mask`` is not bool.
    """
    parts = _resolve(AGGREGATION_PARTS, aggregation, "aggregation")
    if beta < 0.0 or entropy_coef < 0.0:
        raise ValueError(f"beta and entropy_coef must be >= 0, got beta={beta}, entropy_coef={entropy_coef}")
    if beta > 0.0 and ref_logprobs is None:
        raise ValueError("beta > 0 needs ref_logprobs (N, T)")
    if entropy_coef > 0.0 and entropy is None:
        raise ValueError("entropy_coef > 0 needs entropy (N, T)")
    optional = {"ref_logprobs": ref_logprobs, "entropy": entropy, "token_weights": token_weights}
    _check_loss_inputs(
        logprobs=logprobs,
        old_logprobs=old_logprobs,
        advantages=advantages,
        mask=mask,
        **{k: v for k, v in optional.items() if v is not None},
    )
    pg_loss, stats = _clipped_surrogate(
        logprobs, old_logprobs.detach(), advantages.detach(), mask, clip_eps_low, clip_eps_high
    )  # (N, T)
    if token_weights is not None:
        pg_loss = pg_loss * token_weights.detach()  # (N, T)
    zeros = torch.zeros_like(pg_loss)  # (N, T)
    kl = zeros
    if ref_logprobs is not None:
        # Detail 9: both inputs 0 at masked positions, so k3 is 0 there with a zero gradient.
        kl = kl_k3(torch.where(mask, logprobs, zeros), torch.where(mask, ref_logprobs.detach(), zeros))  # (N, T)
    ent = zeros if entropy is None else torch.where(mask, entropy, zeros)  # (N, T)
    per_token = pg_loss + beta * kl - entropy_coef * ent  # (N, T)
    loss = _reduce(parts, per_token, mask, count)  # ()
    with torch.no_grad():
        return loss, LossStats(
            loss=float(loss.detach()),
            pg_loss=float(_reduce(parts, pg_loss, mask, count)),
            kl=float(_reduce(parts, kl, mask, count)),
            entropy=float(_reduce(parts, ent, mask, count)),
            **{k: float(v) for k, v in stats.items()},
        )


def world_model_loss(logprobs: Tensor, mask: Tensor, count: float | None = None) -> Tensor:
    """Teacher-forced cross-entropy of the REHEARSE role on real tool outputs (the world-model loss).

    L_WM = −(1/|M|) Σ_{(n,t) ∈ M} log π_θ(x_{n,t} | x_{n,<t}), where M is the set of target tokens (the real
    outputs' ids, `agents.rollout.RolloutBatch.world_model_mask`). The trainer minimises L_GRPO + λ·L_WM with
    λ = ``world_model_loss_weight``: a supervised term beside the GRPO objective of docs/design.md §1 (see the
    module's references), always a token mean whatever the GRPO aggregation. ``logprobs`` are those the GRPO
    term uses, log_softmax(logits / temperature): the distribution the REHEARSE role samples from.

    Args:
        logprobs: ``(N, T)`` floating, log π_θ of each token given its prefix (carries the gradient).
        mask: ``(N, T) bool``, True on target tokens.
        count: what the sum divides by: the target tokens of the whole batch when this is a shard or a
            micro-batch of it, so the parts add up to the whole batch's mean. None: this batch's own count.

    Returns:
        A 0-d tensor (0 with a zero gradient when no token is masked). Positions outside ``mask`` may hold
        anything (-inf, NaN): they are selected away before the sum (detail 9).

    Raises:
        ValueError: the shapes differ or are not 2-D.
        TypeError: ``mask`` is not bool.
    """
    _check_loss_inputs(logprobs=logprobs, mask=mask)
    nll = torch.where(mask, -logprobs, torch.zeros_like(logprobs))  # (N, T)
    denominator = float(mask.sum()) if count is None else float(count)
    return nll.sum() / max(denominator, 1.0)  # ()
