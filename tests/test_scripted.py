"""Scripted policies land near the book's train pass rates (random 0.10, blind 0.21, oracle 1.00).

Tolerances are honest binomial ones: 20 tasks x 16 episodes = 320 episodes per policy, so
one standard error is about 0.017 at p = 0.10 and 0.023 at p = 0.21; we allow ~3 of them.
The expected values are not the book's digits exactly: blind picks one of five ops (0.2)
plus the rare wrong op that happens to fix a task; random is what uniform legal calls give.
"""

from __future__ import annotations

import math

import pytest

from bugfix_gym import BugFixEnv, CALLS, evaluate, make_tasks, scripted_policy

BOOK = {"random": 0.10, "blind": 0.21, "oracle": 1.00}
N_PER_TASK = 16


def _tolerance(p: float, n: int) -> float:
    return 3 * math.sqrt(p * (1 - p) / n) + 1e-9


@pytest.mark.parametrize("kind", ["random", "blind", "oracle"])
def test_train_pass_rate_matches_the_book(kind):
    stats = evaluate(scripted_policy(kind, seed=0), split="train", n_per_task=N_PER_TASK, seed=0)
    n = len(make_tasks("train")) * N_PER_TASK
    assert abs(stats["pass_rate"] - BOOK[kind]) <= _tolerance(BOOK[kind], n), stats
    assert stats["valid_calls"] == 1.0  # every scripted policy makes only legal calls
    assert stats["reward"] == stats["pass_rate"]


@pytest.mark.parametrize("kind", ["random", "blind"])
def test_pass_rate_is_the_same_on_held_out_tasks_and_other_seeds(kind):
    # Neither policy depends on which function it is fixing, so held-out lands in the same range.
    rates = [evaluate(scripted_policy(kind, seed=s), split=split, n_per_task=N_PER_TASK, seed=s)["pass_rate"]
             for split, s in (("heldout", 0), ("train", 1), ("train", 2))]
    for rate in rates:
        assert abs(rate - BOOK[kind]) <= _tolerance(BOOK[kind], 160) + 0.02, rates


def test_policy_behaviours():
    blind = evaluate(scripted_policy("blind", seed=0), n_per_task=4)
    assert blind["read_rate"] == 0.0 and blind["edits_per_episode"] == 1.0 and blind["turns"] == 2.0
    assert blind["submit_rate"] == 1.0
    oracle = evaluate(scripted_policy("oracle"), split="all", n_per_task=2)
    assert oracle["read_rate"] == 1.0 and oracle["first_edit_right"] == 1.0 and oracle["turns"] == 3.0
    random_ = evaluate(scripted_policy("random", seed=0), n_per_task=4)
    assert 0.0 < random_["submit_rate"] < 1.0 and random_["turns"] > 2.0


def test_noisy_oracle_interpolates_between_blind_and_oracle():
    exact = evaluate(scripted_policy("noisy_oracle", seed=0, p=1.0), n_per_task=4)["pass_rate"]
    never = evaluate(scripted_policy("noisy_oracle", seed=0, p=0.0), n_per_task=8)
    half = evaluate(scripted_policy("noisy_oracle", seed=0, p=0.5), n_per_task=N_PER_TASK)
    assert exact == 1.0
    assert never["first_edit_right"] == 0.0 and never["pass_rate"] < 0.15
    assert abs(half["first_edit_right"] - 0.5) <= _tolerance(0.5, 320)
    assert half["pass_rate"] >= half["first_edit_right"]


def test_random_policy_uses_only_calls_the_mask_allows():
    policy = scripted_policy("random", seed=3)
    env = BugFixEnv()
    seen = set()
    for episode in range(40):
        obs, info = env.reset(seed=episode)
        done = False
        while not done:
            action = policy(obs, info)
            assert info["call_mask"][CALLS.index(action)]
            seen.add(action)
            obs, _, terminated, truncated, info = env.step(action)
            done = terminated or truncated
    assert seen == set(CALLS)


def test_seeded_policies_are_reproducible_and_unknown_kinds_rejected():
    a = evaluate(scripted_policy("random", seed=5), n_per_task=2, seed=5)
    b = evaluate(scripted_policy("random", seed=5), n_per_task=2, seed=5)
    assert a == b
    with pytest.raises(ValueError, match="unknown scripted policy 'smart'"):
        scripted_policy("smart")
    with pytest.raises(ValueError, match="probability"):
        scripted_policy("noisy_oracle", p=1.5)


def _play(policy, env, task):
    obs, info = env.reset(options={"task": task})
    done = False
    while not done:
        obs, _, terminated, truncated, info = env.step(policy(obs, info))
        done = terminated or truncated
    return info


def test_careful_teacher_chooses_its_ops_blind_same_seed_same_op_sequence_on_every_task():
    from bugfix_gym import FIX_OPS, generate_tasks

    # tasks of every defect kind and of different code shapes: the sources and test outputs differ
    tasks = make_tasks("all") + generate_tasks("train", 10, seed=0)
    env = BugFixEnv(tasks=tasks)
    for seed in range(12):
        plays = [_play(scripted_policy("careful", seed=seed), env, task) for task in tasks]
        longest = max((i["ops"] for i in plays), key=len)
        assert len(longest) >= 2 and len(set(longest)) == len(longest) and set(longest) <= set(FIX_OPS)
        for info in plays:  # each episode's ops are a prefix of the one order drawn for this seed
            assert info["ops"] == longest[: len(info["ops"])], (seed, info["task"])
            assert info["n_invalid"] == 0 and info["submitted"]
    # and the first op is no better than chance at being the right one
    stats = evaluate(scripted_policy("careful", seed=0), split="all", n_per_task=N_PER_TASK, seed=0)
    assert abs(stats["first_edit_right"] - 0.2) <= _tolerance(0.2, 30 * N_PER_TASK)


def test_careful_teacher_shape_look_edit_test_revert_edit_submit():
    from bugfix_gym.core.scripted import tests_passed

    env = BugFixEnv()
    seen_revert = seen_pass = 0
    for seed in range(40):
        policy = scripted_policy("careful", seed=seed, p_read=1.0, p_test=0.0, retry_on_no_change=False)
        info = _play(policy, env, "count_above")
        acts = info["actions"]
        assert info["n_invalid"] == 0
        assert acts[0] == "read" and acts[1].startswith("edit ") and acts[2] == "test" and acts[-1] == "submit"
        if acts[3] == "revert" or acts[3].startswith("edit "):  # failed: revert (if it changed), another op
            seen_revert += 1
            nxt = acts[4] if acts[3] == "revert" else acts[3]
            assert nxt.startswith("edit ") and nxt != acts[1]
        else:
            seen_pass += 1
            assert acts[3] == "submit" and info["hidden_pass"]
    assert seen_revert and seen_pass
    assert tests_passed("visible tests : 3 / 3 passed") and not tests_passed("visible tests : 2 / 3 passed . first")
    never = evaluate(scripted_policy("careful", p_read=0.0, p_test=0.0), n_per_task=2)
    assert never["read_rate"] == 0.0
    with pytest.raises(ValueError, match="p_read and p_test"):
        scripted_policy("careful", p_read=0.8, p_test=0.5)
    with pytest.raises(TypeError, match="takes no p_read"):
        scripted_policy("blind", p_read=0.5)
