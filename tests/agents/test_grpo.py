"""Tests of agents/grpo.py: role-wise advantages on a hand-worked group, hypothesis invariants, and the loss.

The advantage tests check the formula of docs/design.md §1 (A = R − b(q, ρ), b a weighted mean over the role's
segments in the group) against numbers worked out by hand in the comments and against a plain-Python loop
written independently of the vectorised code.
"""

from __future__ import annotations

import math
from collections import defaultdict

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from agents.grpo import (
    ADVANTAGE_ESTIMATORS,
    AGGREGATIONS,
    WEIGHTINGS,
    act_only_advantages,
    aggregate,
    entropy_from_logits,
    grpo_advantages,
    grpo_loss,
    kl_k3,
    policy_loss,
    role_wise_advantages,
    segment_advantages_to_tokens,
)
from envace_gym.types import Role

ACT, REH = int(Role.ACT), int(Role.REHEARSE)
HYP = settings(max_examples=60, deadline=None)


def seg_tensors(segments):
    """segments: list of (reward, group, role, traj, num_tokens) -> the five (S,) tensors."""
    cols = list(zip(*segments))
    return (
        torch.tensor(cols[0], dtype=torch.float32),
        torch.tensor(cols[1], dtype=torch.int64),
        torch.tensor(cols[2], dtype=torch.int64),
        torch.tensor(cols[3], dtype=torch.int64),
        torch.tensor(cols[4], dtype=torch.int64),
    )


# ---------------------------------------------------------------------------------------------------------
# Hand-worked group
# ---------------------------------------------------------------------------------------------------------

# Group 0 has two trajectories:
#   τ1 (R = 1): ACT, REH, ACT, REH, ACT  -> 3 ACT segments of 2 tokens each, 2 REH segments of 3 tokens each
#   τ2 (R = 0): ACT, REH                  -> 1 ACT segment of 10 tokens,     1 REH segment of 4 tokens
# Group 1 has one trajectory τ3 (R = 5, ACT + REH): a group of one, every advantage 0.
# Group 2 has τ4 (R = 1, ACT + REH) and τ5 (R = 0, ACT only): (2, ACT) has two trajectories,
#   (2, REH) only one -> the REH segment of τ4 gets 0, not its raw reward.
HAND = [
    # reward, group, role, traj, tokens
    (1.0, 0, ACT, 1, 2),
    (1.0, 0, REH, 1, 3),
    (1.0, 0, ACT, 1, 2),
    (1.0, 0, REH, 1, 3),
    (1.0, 0, ACT, 1, 2),
    (0.0, 0, ACT, 2, 10),
    (0.0, 0, REH, 2, 4),
    (5.0, 1, ACT, 3, 7),
    (5.0, 1, REH, 3, 7),
    (1.0, 2, ACT, 4, 1),
    (1.0, 2, REH, 4, 1),
    (0.0, 2, ACT, 5, 1),
]

# turn (w = 1 per segment):
#   b(0, ACT) = (1 + 1 + 1 + 0) / 4 = 3/4  -> τ1 ACT: 1 − 3/4 = 1/4,  τ2 ACT: 0 − 3/4 = −3/4
#   b(0, REH) = (1 + 1 + 0) / 3     = 2/3  -> τ1 REH: 1/3,            τ2 REH: −2/3
# token (w = tokens):
#   b(0, ACT) = (3·2·1 + 10·0) / (6 + 10) = 6/16 = 0.375 -> τ1 ACT: 0.625, τ2 ACT: −0.375
#   b(0, REH) = (2·3·1 + 4·0) / (6 + 4)   = 6/10 = 0.6   -> τ1 REH: 0.4,   τ2 REH: −0.6
# trajectory (w = 1 per trajectory with the role): b(0, ·) = (1 + 0) / 2 = 1/2 -> ±1/2 for both roles.
# Group 2, ACT: b = (1 + 0) / 2 = 1/2 under every weighting (one 1-token segment each) -> ±1/2.
EXPECTED = {
    "turn": [1 / 4, 1 / 3, 1 / 4, 1 / 3, 1 / 4, -3 / 4, -2 / 3, 0, 0, 0.5, 0, -0.5],
    "token": [0.625, 0.4, 0.625, 0.4, 0.625, -0.375, -0.6, 0, 0, 0.5, 0, -0.5],
    "trajectory": [0.5, 0.5, 0.5, 0.5, 0.5, -0.5, -0.5, 0, 0, 0.5, 0, -0.5],
}


@pytest.mark.parametrize("weighting", ["turn", "token", "trajectory"])
def test_hand_worked_group(weighting):
    adv = role_wise_advantages(*seg_tensors(HAND), weighting=weighting)
    assert adv.dtype == torch.float32 and adv.shape == (len(HAND),)
    torch.testing.assert_close(adv, torch.tensor(EXPECTED[weighting]), atol=1e-6, rtol=0)


@pytest.mark.parametrize("weighting", ["turn", "token", "trajectory"])
def test_act_only_keeps_role_wise_act_advantages_and_zeroes_rehearse(weighting):
    """The act-only control trains ACT exactly as role-wise GRPO does and gives the world model no gradient."""
    adv = act_only_advantages(*seg_tensors(HAND), weighting=weighting)
    roles = [role for _, _, role, _, _ in HAND]
    expected = [0.0 if role == REH else a for a, role in zip(EXPECTED[weighting], roles)]
    assert adv.dtype == torch.float32
    torch.testing.assert_close(adv, torch.tensor(expected), atol=1e-6, rtol=0)
    assert ADVANTAGE_ESTIMATORS["role_grpo_act_only"] is act_only_advantages


def test_turn_and_trajectory_weighting_differ_on_the_hand_group():
    # τ1 has 3 ACT turns and τ2 one: the turn baseline 3/4 leans towards τ1's reward, the trajectory one is 1/2.
    turn = role_wise_advantages(*seg_tensors(HAND), weighting="turn")
    traj = role_wise_advantages(*seg_tensors(HAND), weighting="trajectory")
    assert turn[0].item() == pytest.approx(0.25) and traj[0].item() == pytest.approx(0.5)


def test_hand_worked_std_scaling():
    # turn weighting, (0, ACT): deviations 1/4 (three segments) and −3/4 (one segment);
    # weighted population variance = (3·(1/4)² + (3/4)²) / 4 = (3/16 + 9/16) / 4 = 3/16, std = √3/4.
    # A(τ1 ACT) = (1/4)/(√3/4) = 1/√3, A(τ2 ACT) = (−3/4)/(√3/4) = −√3.
    # (0, REH): deviations 1/3 (two) and −2/3 (one); variance = (2/9 + 4/9)/3 = 2/9, std = √2/3;
    # A(τ1 REH) = (1/3)/(√2/3) = 1/√2, A(τ2 REH) = −2/√2 = −√2. Groups of one stay 0.
    adv = role_wise_advantages(*seg_tensors(HAND), weighting="turn", scale_by_std=True, eps=0.0)
    s3, s2 = math.sqrt(3), math.sqrt(2)
    expected = [1 / s3, 1 / s2, 1 / s3, 1 / s2, 1 / s3, -s3, -s2, 0, 0, 1, 0, -1]
    torch.testing.assert_close(adv, torch.tensor(expected), atol=1e-6, rtol=0)


def test_std_scaling_of_tied_rewards_is_zero_even_without_eps():
    """Equal rewards in a (q, ρ) leave nothing to scale: A = 0, not 0 / 0 = NaN, whatever eps >= 0."""
    rewards = torch.tensor([0.5, 0.5, 1.0, 0.0])
    group_ids, roles = torch.tensor([0, 0, 1, 1]), torch.tensor([1, 1, 1, 1])
    traj_ids, num_tokens = torch.tensor([0, 1, 2, 3]), torch.tensor([3, 3, 3, 3])
    for eps in (0.0, 1e-6):
        adv = role_wise_advantages(rewards, group_ids, roles, traj_ids, num_tokens, scale_by_std=True, eps=eps)
        torch.testing.assert_close(adv, torch.tensor([0.0, 0.0, 1.0, -1.0]), atol=1e-5, rtol=0)
    # 0.1 three times: the weighted mean differs from 0.1 by rounding, a std of ~1e-17 that eps = 0 cannot absorb
    tenth = torch.tensor([0.1, 0.1, 0.1])
    three = torch.tensor([0, 1, 2])
    for weighting in ("turn", "token", "trajectory"):
        adv = role_wise_advantages(
            tenth,
            torch.zeros(3, dtype=torch.long),
            torch.ones(3, dtype=torch.long),
            three,
            torch.tensor([1, 2, 3]),
            weighting=weighting,
            scale_by_std=True,
            eps=0.0,
        )
        assert adv.eq(0).all(), (weighting, adv)
    for eps in (-1e-6, float("nan")):
        with pytest.raises(ValueError, match="eps must be a finite number >= 0"):
            role_wise_advantages(rewards, group_ids, roles, traj_ids, num_tokens, scale_by_std=True, eps=eps)
        with pytest.raises(ValueError, match="eps must be a finite number >= 0"):  # checked before any input
            role_wise_advantages(rewards[:0], group_ids[:0], roles[:0], traj_ids[:0], num_tokens[:0], eps=eps)


def test_plain_grpo_on_the_hand_group():
    # One baseline per q over trajectories: group 0 b = (1 + 0)/2; group 1 is a group of one;
    # group 2 b = 1/2, so τ4's REH segment now gets +1/2 (its role no longer has a baseline of its own).
    r, g, _, tr, _ = seg_tensors(HAND)
    adv = grpo_advantages(r, g, tr)
    expected = [0.5] * 5 + [-0.5] * 2 + [0, 0] + [0.5, 0.5, -0.5]
    torch.testing.assert_close(adv, torch.tensor(expected), atol=1e-6, rtol=0)


def test_segment_advantages_to_tokens():
    seg_adv = torch.tensor([0.5, -1.0, 2.0])
    ids = torch.tensor([[-1, 0, 0, -1, 1], [2, 2, -1, -1, -1]])
    out = segment_advantages_to_tokens(seg_adv, ids)
    assert out.shape == (2, 5) and out.dtype == torch.float32
    torch.testing.assert_close(out, torch.tensor([[0.0, 0.5, 0.5, 0.0, -1.0], [2.0, 2.0, 0.0, 0.0, 0.0]]))
    with pytest.raises(ValueError, match=r"\[-1, 3\)"):
        segment_advantages_to_tokens(seg_adv, torch.tensor([[3]]))


# ---------------------------------------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------------------------------------


def test_unknown_weighting_lists_valid_ones():
    with pytest.raises(ValueError, match="'turn', 'token', 'trajectory'"):
        role_wise_advantages(*seg_tensors(HAND), weighting="segment")


def test_shape_mismatch_names_shapes():
    r, g, ro, tr, n = seg_tensors(HAND)
    with pytest.raises(ValueError, match=r"rewards \(12,\).*roles \(11,\)"):
        role_wise_advantages(r, g, ro[:-1], tr, n)


@pytest.mark.parametrize(
    "bad, match",
    [
        ([(1.0, 0, ACT, 1, 1), (1.0, 1, REH, 1, 1)], "group_ids"),  # one trajectory in two groups
        ([(1.0, 0, ACT, 1, 1), (0.5, 0, REH, 1, 1)], "rewards"),  # one trajectory with two rewards
        ([(1.0, 0, int(Role.PROMPT), 1, 1)], "Role.ACT"),  # a role that carries no loss
        ([(1.0, 0, ACT, 1, -1)], "num_tokens"),
        ([(float("nan"), 0, ACT, 1, 1)], "finite"),
    ],
)
def test_invalid_segments_raise(bad, match):
    with pytest.raises(ValueError, match=match):
        role_wise_advantages(*seg_tensors(bad))


def test_empty_batch_gives_empty_advantages():
    empty = torch.zeros(0, dtype=torch.int64)
    adv = role_wise_advantages(torch.zeros(0), empty, empty, empty, empty)
    assert adv.shape == (0,) and adv.dtype == torch.float32


# ---------------------------------------------------------------------------------------------------------
# Hypothesis invariants
# ---------------------------------------------------------------------------------------------------------


@st.composite
def batches(draw, both_roles=False, max_k=4, rewards=st.floats(-10, 10, allow_nan=False, width=32)):
    """A batch of groups; each trajectory has a reward and 1-5 segments of random roles and lengths."""
    segments = []
    traj = 100  # trajectory ids need not start at 0 or be contiguous
    for group in draw(st.lists(st.integers(0, 50), min_size=1, max_size=4, unique=True)):
        for _ in range(draw(st.integers(1, max_k))):
            traj += draw(st.integers(1, 3))
            reward = draw(rewards)
            roles = draw(st.lists(st.sampled_from([ACT, REH]), min_size=1, max_size=5))
            if both_roles:
                roles = roles + [ACT, REH]
            for role in roles:
                segments.append((reward, group, role, traj, draw(st.integers(0, 20))))
    order = draw(st.permutations(range(len(segments))))
    return [segments[i] for i in order]


def oracle(segments, weighting, scale_by_std=False, eps=1e-6):
    """Plain-Python A = R − b(q, ρ) with the weights of docs/design.md §1, written without torch."""
    n_role_segs = defaultdict(int)
    for _r, g, ro, tr, _n in segments:
        n_role_segs[(g, ro, tr)] += 1
    weight = {
        "turn": lambda g, ro, tr, n: 1.0,
        "token": lambda g, ro, tr, n: float(n),
        "trajectory": lambda g, ro, tr, n: 1.0 / n_role_segs[(g, ro, tr)],
    }[weighting]
    sums, trajs = defaultdict(lambda: [0.0, 0.0]), defaultdict(set)
    for r, g, ro, tr, n in segments:
        w = weight(g, ro, tr, n)
        sums[(g, ro)][0] += w * r
        sums[(g, ro)][1] += w
        trajs[(g, ro)].add(tr)
    var = defaultdict(float)
    for r, g, ro, tr, n in segments:
        if sums[(g, ro)][1] > 0:
            var[(g, ro)] += weight(g, ro, tr, n) * (r - sums[(g, ro)][0] / sums[(g, ro)][1]) ** 2 / sums[(g, ro)][1]
    out = []
    for r, g, ro, _tr, _n in segments:
        num, den = sums[(g, ro)]
        if len(trajs[(g, ro)]) < 2 or den == 0:
            out.append(0.0)
            continue
        a = r - num / den
        if scale_by_std and var[(g, ro)] == 0:
            # Zero weighted std (all weight on one reward): nothing to scale, A = 0, not a / eps.
            out.append(0.0)
            continue
        out.append(a / (math.sqrt(var[(g, ro)]) + eps) if scale_by_std else a)
    return out


def segment_weights(segments, weighting):
    n_role_segs = defaultdict(int)
    for _, g, ro, tr, _ in segments:
        n_role_segs[(g, ro, tr)] += 1
    return {
        "turn": [1.0 for _ in segments],
        "token": [float(s[4]) for s in segments],
        "trajectory": [1.0 / n_role_segs[(s[1], s[2], s[3])] for s in segments],
    }[weighting]


@HYP
@given(batches(), st.sampled_from(sorted(WEIGHTINGS)), st.booleans())
# Token weighting that puts all of a (q, ρ)'s weight on one trajectory: weighted std 0, unequal rewards.
@example([(0.0, 0, ACT, 101, 0), (0.0, 0, ACT, 102, 0), (1.0, 0, ACT, 103, 1)], "token", True)
def test_matches_plain_python_oracle(segments, weighting, scale_by_std):
    adv = role_wise_advantages(*seg_tensors(segments), weighting=weighting, scale_by_std=scale_by_std)
    expected = torch.tensor(oracle(segments, weighting, scale_by_std), dtype=torch.float32)
    # std scaling divides by a std that may be ~1e-6 when rewards nearly tie: compare relatively.
    torch.testing.assert_close(adv, expected, atol=1e-4, rtol=1e-3)


@HYP
@given(batches(), st.sampled_from(sorted(WEIGHTINGS)))
def test_weighted_mean_of_advantages_is_zero_per_group_and_role(segments, weighting):
    adv = role_wise_advantages(*seg_tensors(segments), weighting=weighting).tolist()
    weights = segment_weights(segments, weighting)
    totals = defaultdict(float)
    for a, w, (_, g, ro, _, _) in zip(adv, weights, segments):
        totals[(g, ro)] += w * a
    for key, total in totals.items():
        assert abs(total) < 1e-3, (key, total)


# Rewards on a grid of quarters, so that reward + integer shift is exact in float32: with std scaling a
# (q, ρ) whose std is ~0 divides by eps = 1e-6, which would turn float32 rounding of R + c into O(1) changes.
QUARTERS = st.integers(-40, 40).map(lambda i: i / 4)


@HYP
@given(batches(rewards=QUARTERS), st.sampled_from(sorted(WEIGHTINGS)), st.booleans(), st.data())
def test_adding_a_constant_to_a_group_leaves_advantages_unchanged(segments, weighting, scale_by_std, data):
    shift = {g: data.draw(st.integers(-100, 100), label=f"shift {g}") for g in {s[1] for s in segments}}
    shifted = [(r + shift[g], g, ro, tr, n) for r, g, ro, tr, n in segments]
    a = role_wise_advantages(*seg_tensors(segments), weighting=weighting, scale_by_std=scale_by_std)
    b = role_wise_advantages(*seg_tensors(shifted), weighting=weighting, scale_by_std=scale_by_std)
    torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


@HYP
@given(batches(), st.sampled_from(sorted(WEIGHTINGS)), st.floats(0.01, 100))
def test_scaling_rewards_scales_advantages(segments, weighting, c):
    scaled = [(r * c, g, ro, tr, n) for r, g, ro, tr, n in segments]
    a = role_wise_advantages(*seg_tensors(segments), weighting=weighting)
    b = role_wise_advantages(*seg_tensors(scaled), weighting=weighting)
    torch.testing.assert_close(b, a * c, atol=1e-3 * max(c, 1), rtol=1e-4)


@HYP
@given(batches(both_roles=True), st.booleans())
def test_trajectory_weighting_with_both_roles_everywhere_equals_plain_grpo(segments, scale_by_std):
    r, g, ro, tr, n = seg_tensors(segments)
    role_wise = role_wise_advantages(r, g, ro, tr, n, weighting="trajectory", scale_by_std=scale_by_std)
    plain = grpo_advantages(r, g, tr, scale_by_std=scale_by_std)
    torch.testing.assert_close(role_wise, plain, atol=1e-5, rtol=1e-4)


@HYP
@given(batches(max_k=1), st.sampled_from(sorted(WEIGHTINGS)), st.booleans())
def test_a_group_of_one_trajectory_gets_zero(segments, weighting, scale_by_std):
    r, g, ro, tr, n = seg_tensors(segments)
    assert (role_wise_advantages(r, g, ro, tr, n, weighting=weighting, scale_by_std=scale_by_std) == 0).all()
    assert (grpo_advantages(r, g, tr, scale_by_std=scale_by_std) == 0).all()


# ---------------------------------------------------------------------------------------------------------
# Policy loss
# ---------------------------------------------------------------------------------------------------------

MASK = torch.tensor([[True, True, True, False], [True, False, False, False]])


def test_on_policy_ratio_is_one_and_gradient_is_minus_advantage_over_token_count():
    torch.manual_seed(0)
    old = -torch.rand(2, 4) * 3
    lp = old.clone().requires_grad_(True)
    adv = torch.tensor([[1.0, -2.0, 0.5, 7.0], [3.0, 9.0, 9.0, 9.0]])
    loss, stats = policy_loss(lp, old, adv, MASK)
    loss.backward()
    assert stats.ratio_mean == pytest.approx(1.0)
    assert stats.clip_fraction == 0.0
    assert stats.approx_kl == pytest.approx(0.0, abs=1e-7)
    assert stats.loss == stats.pg_loss == pytest.approx(loss.item()) and stats.kl == stats.entropy == 0.0
    # token-mean over 4 masked tokens: loss = −Σ A·ratio / 4, d loss / d lp = −A·ratio / 4 = −A / 4.
    expected_grad = torch.where(MASK, -adv / 4, torch.zeros_like(adv))
    torch.testing.assert_close(lp.grad, expected_grad)
    assert loss.item() == pytest.approx(-(1 - 2 + 0.5 + 3) / 4)


@pytest.mark.parametrize(
    "adv, ratio, clipped",
    [
        (1.0, 1.3, True),  # A > 0, ratio > 1 + ε_high: objective capped, gradient 0
        (1.0, 1.25, False),  # inside the higher bound ε_high = 0.28 (DAPO clip-higher)
        (1.0, 0.5, False),  # A > 0, ratio < 1 − ε_low: the unclipped term is the min, gradient flows
        (-1.0, 0.7, True),  # A < 0, ratio < 1 − ε_low: gradient 0
        (-1.0, 0.85, False),
        (-1.0, 1.5, False),  # A < 0, ratio large: pessimistic term, gradient flows
    ],
)
def test_clipping(adv, ratio, clipped):
    old = torch.tensor([[-1.0]])
    lp = (old + math.log(ratio)).requires_grad_(True)
    loss, stats = policy_loss(lp, old, torch.tensor([[adv]]), torch.tensor([[True]]), 0.2, 0.28)
    loss.backward()
    assert stats.clip_fraction == (1.0 if clipped else 0.0)
    assert stats.ratio_mean == pytest.approx(ratio, rel=1e-5)
    if clipped:
        assert lp.grad.item() == 0.0
        assert loss.item() == pytest.approx(-adv * (1.28 if adv > 0 else 0.8), rel=1e-5)
    else:
        assert lp.grad.item() == pytest.approx(-adv * ratio, rel=1e-5)


@pytest.mark.parametrize("aggregation", sorted(AGGREGATIONS))
def test_masked_tokens_get_zero_gradient_even_with_garbage(aggregation):
    # MASK keeps (0, 0..2) and (1, 0); every other position holds -inf, inf, NaN or huge values.
    old = torch.tensor([[-1.0, -2.0, -0.3, float("nan")], [-0.5, 50.0, float("inf"), -1e9]])
    lp = torch.tensor([[-1.1, -1.9, -0.2, float("nan")], [-0.4, float("-inf"), -3.0, 1e9]], requires_grad=True)
    ref = torch.tensor([[-1.0, -2.5, -0.1, 3.0], [-0.7, float("inf"), float("nan"), float("-inf")]])
    ent_logits = torch.randn(2, 4, 5, requires_grad=True)
    entropy = entropy_from_logits(ent_logits)
    adv = torch.tensor([[1.0, -1.0, 0.5, float("nan")], [2.0, 1e30, float("inf"), float("-inf")]])
    loss, stats = grpo_loss(
        lp, old, adv, MASK, ref_logprobs=ref, entropy=entropy, beta=0.1, entropy_coef=0.01, aggregation=aggregation
    )
    loss.backward()
    assert torch.isfinite(loss) and all(math.isfinite(v) for v in stats.to_dict().values())
    assert (lp.grad[~MASK] == 0).all() and (lp.grad[MASK] != 0).all()
    assert (ent_logits.grad[~MASK] == 0).all()


def test_all_masked_batch_gives_zero_loss():
    lp = torch.zeros(2, 3, requires_grad=True)
    mask = torch.zeros(2, 3, dtype=torch.bool)
    for aggregation in AGGREGATIONS:
        loss, stats = policy_loss(lp, lp.detach(), torch.ones(2, 3), mask, aggregation=aggregation)
        loss.backward()
        assert loss.item() == 0.0 and stats.clip_fraction == 0.0
        assert (lp.grad == 0).all()


def test_loss_validation():
    x = torch.zeros(2, 3)
    with pytest.raises(ValueError, match=r"logprobs \(2, 3\).*advantages \(2, 4\)"):
        policy_loss(x, x, torch.zeros(2, 4), torch.ones(2, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match="'token-mean', 'seq-mean-token-mean', 'seq-mean-token-sum'"):
        policy_loss(x, x, x, torch.ones(2, 3, dtype=torch.bool), aggregation="seq-sum")
    with pytest.raises(TypeError, match="bool"):
        policy_loss(x, x, x, torch.ones(2, 3))
    with pytest.raises(ValueError, match="ref_logprobs"):
        grpo_loss(x, x, x, torch.ones(2, 3, dtype=torch.bool), beta=0.1)
    with pytest.raises(ValueError, match="entropy"):
        grpo_loss(x, x, x, torch.ones(2, 3, dtype=torch.bool), entropy_coef=0.1)
    with pytest.raises(ValueError, match=r"ref_logprobs \(2, 2\)"):
        grpo_loss(x, x, x, torch.ones(2, 3, dtype=torch.bool), ref_logprobs=torch.zeros(2, 2), beta=0.1)


def test_clip_ranges_are_checked():
    x, mask = torch.zeros(2, 3), torch.ones(2, 3, dtype=torch.bool)
    for low, high, message in (
        (1.0, 0.2, r"clip_eps_low must be in \[0, 1\), got 1.0"),
        (-0.1, 0.2, r"clip_eps_low must be in \[0, 1\), got -0.1"),
        (0.2, -0.1, r"clip_eps_high must be >= 0, got -0.1"),
    ):
        with pytest.raises(ValueError, match=message):
            grpo_loss(x, x, x, mask, clip_eps_low=low, clip_eps_high=high)


def test_only_the_current_logprobs_carry_gradient():
    """Old, reference logprobs, advantages and importance weights are constants of the loss: a gradient
    through any of them would train on the data instead of the policy."""
    torch.manual_seed(0)
    mask = torch.tensor([[True, True, False], [True, False, False]])
    logprobs = (torch.rand(2, 3) - 2).requires_grad_()
    constants = {name: (torch.rand(2, 3) - 2).requires_grad_() for name in ("old", "ref", "adv", "weights")}
    loss, _ = grpo_loss(
        logprobs,
        constants["old"],
        constants["adv"],
        mask,
        ref_logprobs=constants["ref"],
        beta=0.1,
        token_weights=constants["weights"].abs(),
    )
    loss.backward()
    assert logprobs.grad is not None and logprobs.grad[mask].abs().sum() > 0
    assert all(t.grad is None for t in constants.values()), {k: t.grad for k, t in constants.items()}


# ---------------------------------------------------------------------------------------------------------
# KL, entropy, aggregation
# ---------------------------------------------------------------------------------------------------------


@HYP
@given(st.lists(st.tuples(st.floats(-20, 0), st.floats(-20, 0)), min_size=1, max_size=30))
def test_k3_is_nonnegative_and_zero_when_equal(pairs):
    for dtype in (torch.float64, torch.float32):
        lp = torch.tensor([[p[0] for p in pairs]], dtype=dtype)
        ref = torch.tensor([[p[1] for p in pairs]], dtype=dtype)
        assert (kl_k3(lp, ref) >= 0).all()
        assert (kl_k3(lp, lp) == 0).all()


def test_k3_does_not_round_below_zero_for_tiny_differences():
    # Written literally, exp(δ) − δ − 1 is negative for thousands of these δ in float32.
    delta = torch.linspace(-1e-4, 1e-4, 20_001)[None]  # (1, 20001) float32
    kl = kl_k3(torch.zeros_like(delta), delta)
    assert (kl >= 0).all()
    torch.testing.assert_close(kl, delta**2 / 2, atol=2e-11, rtol=1e-2)  # float32 cancellation: ~ulp(δ)


def test_k3_is_an_unbiased_estimate_of_kl():
    # Tokens sampled from p: the mean of k3 over samples -> KL(p ‖ q) = Σ p log(p/q).
    gen = torch.Generator().manual_seed(0)
    p = torch.tensor([0.5, 0.3, 0.15, 0.05], dtype=torch.float64)
    q = torch.tensor([0.25, 0.25, 0.25, 0.25], dtype=torch.float64)
    tokens = torch.multinomial(p, 200_000, replacement=True, generator=gen)
    estimate = kl_k3(p.log()[tokens][None], q.log()[tokens][None]).mean().item()
    exact = (p * (p / q).log()).sum().item()
    assert estimate == pytest.approx(exact, rel=0.02)


def test_entropy_from_logits():
    torch.manual_seed(0)
    logits = torch.randn(3, 5, 11) * 3
    expected = torch.distributions.Categorical(logits=logits).entropy()
    for chunk_size in (1, 4, 1024):
        torch.testing.assert_close(entropy_from_logits(logits, chunk_size=chunk_size), expected)
    uniform = entropy_from_logits(torch.zeros(1, 2, 7, dtype=torch.bfloat16))
    assert uniform.dtype == torch.float32
    torch.testing.assert_close(uniform, torch.full((1, 2), math.log(7)))


# values with garbage (999) at masked positions; the third sequence has no masked token.
AGG_VALUES = torch.tensor([[1.0, 2.0, 3.0, 4.0], [10.0, 20.0, 999.0, 999.0], [999.0] * 4])
AGG_MASK = torch.tensor([[True] * 4, [True, True, False, False], [False] * 4])


@pytest.mark.parametrize(
    "mode, expected",
    [
        ("token-mean", (1 + 2 + 3 + 4 + 10 + 20) / 6),  # 40/6: every masked token once
        ("seq-mean-token-mean", ((1 + 2 + 3 + 4) / 4 + (10 + 20) / 2) / 2),  # (2.5 + 15)/2 = 8.75
        ("seq-mean-token-sum", ((1 + 2 + 3 + 4) + (10 + 20)) / 2),  # (10 + 30)/2 = 20; empty row left out
    ],
)
def test_aggregation_hand_example(mode, expected):
    assert aggregate(AGG_VALUES, AGG_MASK, mode).item() == pytest.approx(expected)


def test_aggregation_length_bias_on_ragged_masks():
    # Per-token gradient of each mode, sequences of 4 and 2 masked tokens:
    #   token-mean:          1/6 for every token (6 tokens in the batch)
    #   seq-mean-token-mean: 1/(2·4) = 1/8 in the long sequence, 1/(2·2) = 1/4 in the short one (length bias)
    #   seq-mean-token-sum:  1/2 for every token, whatever its sequence's length (1/number of sequences)
    expected = {
        "token-mean": [[1 / 6] * 4, [1 / 6] * 2 + [0, 0]],
        "seq-mean-token-mean": [[1 / 8] * 4, [1 / 4] * 2 + [0, 0]],
        "seq-mean-token-sum": [[1 / 2] * 4, [1 / 2] * 2 + [0, 0]],
    }
    ones = torch.ones(2, 4)
    mask = AGG_MASK[:2]
    for mode, grad in expected.items():
        values = ones.clone().requires_grad_(True)
        aggregate(values, mask, mode).backward()
        torch.testing.assert_close(values.grad, torch.tensor(grad))
    # With a per-token value of 1: token-mean = 1, seq-mean-token-sum = mean length = (4 + 2)/2 = 3.
    assert aggregate(ones, mask, "token-mean").item() == pytest.approx(1.0)
    assert aggregate(ones, mask, "seq-mean-token-sum").item() == pytest.approx(3.0)


@HYP
@given(st.integers(1, 5), st.integers(1, 6), st.data())
def test_equal_length_masks_make_the_modes_agree(n, t, data):
    values = torch.tensor(data.draw(st.lists(st.floats(-5, 5), min_size=n * t, max_size=n * t))).reshape(n, t)
    length = data.draw(st.integers(1, t))
    mask = torch.zeros(n, t, dtype=torch.bool)
    mask[:, :length] = True
    token_mean = aggregate(values, mask, "token-mean")
    torch.testing.assert_close(aggregate(values, mask, "seq-mean-token-mean"), token_mean, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(aggregate(values, mask, "seq-mean-token-sum"), token_mean * length, atol=1e-4, rtol=1e-5)


def test_grpo_loss_combines_the_three_terms():
    torch.manual_seed(1)
    old = -torch.rand(2, 4)
    lp = (old + 0.3 * torch.randn(2, 4)).requires_grad_(True)
    ref = -torch.rand(2, 4)
    adv = torch.randn(2, 4)
    entropy = torch.rand(2, 4)
    for mode in AGGREGATIONS:
        pg, pg_stats = policy_loss(lp, old, adv, MASK, aggregation=mode)
        only_pg, _ = grpo_loss(lp, old, adv, MASK, aggregation=mode)
        torch.testing.assert_close(only_pg, pg)
        loss, stats = grpo_loss(
            lp, old, adv, MASK, ref_logprobs=ref, entropy=entropy, beta=0.04, entropy_coef=0.01, aggregation=mode
        )
        kl = aggregate(kl_k3(lp, ref), MASK, mode)
        ent = aggregate(entropy, MASK, mode)
        torch.testing.assert_close(loss, pg + 0.04 * kl - 0.01 * ent)
        assert stats.kl == pytest.approx(kl.item()) and stats.entropy == pytest.approx(ent.item())
        assert stats.loss == pytest.approx(loss.item()) and stats.pg_loss == pytest.approx(pg.item())
        for name in ("clip_fraction", "approx_kl", "ratio_mean"):
            assert getattr(stats, name) == pytest.approx(getattr(pg_stats, name))


def test_token_weights_scale_the_clipped_surrogate_per_token():
    g = torch.Generator().manual_seed(3)
    lp = -torch.rand(3, 5, generator=g)
    old, adv = lp + 0.05 * torch.randn(3, 5, generator=g), torch.randn(3, 5, generator=g)
    mask = torch.rand(3, 5, generator=g) > 0.3
    plain, _ = grpo_loss(lp, old, adv, mask)
    doubled, _ = grpo_loss(lp, old, adv, mask, token_weights=torch.full((3, 5), 2.0))
    torch.testing.assert_close(doubled, 2 * plain)
    half_rows = torch.ones(3, 5)
    half_rows[0] = 0.0  # row 0's tokens no longer count toward the surrogate (its mask still counts them)
    weighted, _ = grpo_loss(lp, old, adv, mask, token_weights=half_rows)
    rest, _ = grpo_loss(lp, old, adv, mask & (torch.arange(3) > 0).view(3, 1))
    torch.testing.assert_close(weighted * mask.sum() / mask[1:].sum(), rest)
