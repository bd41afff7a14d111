"""The decoder and the episode sampler: owner codes and the policy mask, sample_logp parity, reward
alignment, seeding, the grammar, VecEnv auto-reset, episodes across batches, tokens from observations."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from stable_baselines3.common.monitor import Monitor
from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv

import bugfix_gym
from agents.decoding.grammar import CallGrammar
from agents.model.tinyagent import TinyAgent, TinyAgentConfig, score_tokens, sequence_log_probs
from agents.rollout.sampler import EpisodeSampler
from agents.rollout.trajectory import Trajectory, collate, rollout_stats, scripted_rollout
from agents.bugfix.evaluation import sample_episodes
from agents.rollout.vec_env import FreshInfoDummyVecEnv
from bugfix_gym.core.env import BugFixEnv

TRAIN = [t.name for t in bugfix_gym.make_tasks("train")]

#: foresight's words, as BugFix-v0 advertises them to its agents
WORDS = BugFixEnv.metadata["agent_defaults"]["foresight"]


def _sample(model, tok, tasks, seed=0, **kw) -> list[Trajectory]:
    return sample_episodes(model, tasks, seed=seed, tokenizer=tok, **kw)


@pytest.fixture(scope="module")
def base_trajs(shared_base_agent, tok):
    """Base-agent episodes: real calls of varied length, reads, tests, submits."""
    return _sample(shared_base_agent, tok, TRAIN[:8] * 4, seed=3)


def _calls(traj: Trajectory) -> list[list[int]]:
    """The policy segments (maximal runs of owner 2) of a trajectory, as id lists."""
    calls, cur = [], []
    for i, o in zip(traj.ids.tolist(), traj.owner.tolist()):
        if o == 2:
            cur.append(i)
        elif cur:
            calls.append(cur)
            cur = []
    return calls + ([cur] if cur else [])


def test_trajectory_fields_and_policy_mask(base_trajs):
    for tr in base_trajs:
        T = len(tr)
        assert tr.ids.shape == tr.owner.shape == (T,)
        for x in (tr.policy_mask, tr.sample_logp, tr.values, tr.token_rewards, tr.grammar_state):
            assert x.shape == (T - 1,)
        assert torch.equal(tr.policy_mask, (tr.owner[1:] == 2).float())  # mask = owner == 2, shifted
        assert tr.owner[0] == 1 and set(tr.owner.tolist()) <= {1, 2, 3}
        assert (tr.sample_logp[tr.policy_mask == 0] == 0).all() and (tr.sample_logp[tr.policy_mask == 1] < 0).all()
        assert (tr.grammar_state == -1).all()  # no grammar: unconstrained everywhere


def test_episodes_come_back_in_task_order(base_trajs):
    assert [t.task for t in base_trajs] == TRAIN[:8] * 4


def test_policy_segments_are_the_calls_the_env_received(base_trajs, tok):
    for tr in base_trajs:
        calls = _calls(tr)
        assert len(calls) == tr.info["n_turns"]
        assert [tok.decode(c) for c in calls] == tr.info["actions"]
        for c in calls:  # a call ends at <eoc> or at the length cap, never has <eoc> inside
            assert (c[-1] == tok.eoc_id or len(c) == 8) and tok.eoc_id not in c[:-1]


def test_tool_tokens_are_the_env_outputs(base_trajs, tok):
    """Replaying the calls through a fresh env gives the same token sequence."""
    for tr in base_trajs[:10]:
        env = bugfix_gym.BugFixEnv()
        env.reset(options={"task": tr.task})
        for action in tr.info["actions"]:
            env.step(action)
        ids, owner = bugfix_gym.episode_tokens(env.transcript, tok)
        assert np.array_equal(ids, tr.ids.numpy()) and np.array_equal(owner, tr.owner.numpy())


def test_sample_logp_and_values_match_recomputation(base_trajs, shared_base_agent, tok):
    batch = collate(base_trajs, tok.pad_id)
    with torch.no_grad():
        logp, values, _ = score_tokens(shared_base_agent, batch["ids"])
        logp2 = sequence_log_probs(shared_base_agent, batch["ids"])
    mask = batch["policy_mask"]
    assert mask.sum() > 100
    assert ((logp - batch["sample_logp"]) * mask).abs().max() < 1e-5  # first PPO ratio is 1 with sample_logp too
    assert ((logp2 - batch["sample_logp"]) * mask).abs().max() < 1e-5
    # values were computed for every token the sampler fed: all but the final tool output
    last_call = mask.shape[1] - 1 - torch.argmax(mask.flip(1), dim=1)  # [B]
    fed = (torch.arange(mask.shape[1])[None] <= last_call[:, None]).float()
    assert ((values - batch["values"]) * fed).abs().max() < 1e-5


def test_rewards_sit_on_the_position_predicting_each_calls_last_token(base_trajs):
    assert any(tr.reward > 0 for tr in base_trajs)
    for tr in base_trajs:
        assert abs(float(tr.token_rewards.sum()) - tr.reward) < 1e-6
        for t in torch.nonzero(tr.token_rewards).flatten().tolist():
            assert tr.owner[t + 1] == 2 and (t + 2 == len(tr) or tr.owner[t + 2] != 2)
        assert tr.reward == float(tr.info["submitted"] and tr.info["hidden_pass"])


def test_collate_pads_right(base_trajs, tok):
    batch = collate(base_trajs, tok.pad_id)
    B, T = batch["ids"].shape
    assert B == len(base_trajs) and T == max(len(t) for t in base_trajs)
    for k in ("policy_mask", "sample_logp", "values", "token_rewards", "grammar_state"):
        assert batch[k].shape == (B, T - 1)
    for b, tr in enumerate(base_trajs):
        n = len(tr)
        assert torch.equal(batch["ids"][b, :n], tr.ids) and (batch["ids"][b, n:] == tok.pad_id).all()
        assert (batch["owner"][b, n:] == 0).all() and (batch["policy_mask"][b, n - 1:] == 0).all()
        assert (batch["grammar_state"][b, n - 1:] == -1).all()
    assert torch.equal(batch["rewards"], torch.tensor([t.reward for t in base_trajs]))


def test_no_logit_gradient_outside_the_policy_mask(base_trajs, base_agent, tok):
    batch = collate(base_trajs, tok.pad_id)
    logits, _ = base_agent(batch["ids"])  # [B, T, V]
    logits.retain_grad()
    logp = F.log_softmax(logits[:, :-1], -1).gather(-1, batch["ids"][:, 1:, None]).squeeze(-1)  # [B, T-1]
    mask = batch["policy_mask"]
    (-(mask * logp).sum()).backward()
    direct = logits.grad.abs().sum(-1)  # [B, T]
    assert (direct[:, :-1][mask == 1] > 0).all()
    assert (direct[:, :-1][mask == 0] == 0).all() and (direct[:, -1] == 0).all()


def test_same_seed_same_trajectories_and_different_seed_differs(tok):
    torch.manual_seed(0)
    model = TinyAgent(tok.vocab_size)
    tasks = TRAIN[:3] * 2
    a, b, c = _sample(model, tok, tasks, seed=5), _sample(model, tok, tasks, seed=5), _sample(model, tok, tasks, seed=6)
    for x, y in zip(a, b):
        assert torch.equal(x.ids, y.ids) and torch.equal(x.sample_logp, y.sample_logp)
    assert any(not torch.equal(x.ids, z.ids) for x, z in zip(a, c))


def test_untrained_agent_makes_no_valid_call(tok):
    torch.manual_seed(0)
    stats = rollout_stats(_sample(TinyAgent(tok.vocab_size), tok, TRAIN[:4] * 2), summarise=bugfix_gym.episode_stats)
    assert stats["valid_calls"] == 0 and stats["turns"] == 6 and stats["pass_rate"] == 0


def test_rollout_stats_use_the_env_advertised_or_given_summary_else_returns_and_calls(tok):
    from agents.algorithms.registry import load_entry_point

    trajs = _sample(TinyAgent(tok.vocab_size), tok, TRAIN[:2])
    advertised = load_entry_point(bugfix_gym.BugFixEnv.metadata["agent_defaults"]["episode_summary"], "summary")
    assert rollout_stats(trajs, advertised)["valid_calls"] == 0  # BugFix-v0's own summary, as the env names it
    for t in trajs:
        t.info = {"score": t.reward}  # as another text env would report
    generic = rollout_stats(trajs)
    assert set(generic) == {"reward", "turns", "policy_tokens"} and generic["turns"] == 6
    mine = rollout_stats(trajs, summarise=lambda infos, rewards: {"best": max(i["score"] for i in infos)})
    assert mine == {"best": max(t.reward for t in trajs), "policy_tokens": generic["policy_tokens"]}


def test_the_grammar_makes_every_call_legal_and_is_recorded(tok):
    """Constrained decoding: even an untrained agent writes only the nine calls, and the recorded
    grammar states let the trainer recompute exactly the sampled (masked) log-probs."""
    torch.manual_seed(0)
    model = TinyAgent(tok.vocab_size).eval()
    grammar = CallGrammar(tok, bugfix_gym.CALLS)
    trajs = _sample(model, tok, TRAIN[:6] * 2, seed=2, grammar=grammar)
    for tr in trajs:
        assert all(a in bugfix_gym.CALLS for a in tr.info["actions"])
        on = tr.policy_mask > 0
        assert (tr.grammar_state[on] >= 0).all() and (tr.grammar_state[~on] == -1).all()
    batch = collate(trajs, tok.pad_id)
    with torch.no_grad():
        logp, _, _ = score_tokens(model, batch["ids"], batch["policy_mask"], grammar=grammar,
                                  grammar_state=batch["grammar_state"])
    assert ((logp - batch["sample_logp"]) * batch["policy_mask"]).abs().max() < 1e-5


def test_an_episode_longer_than_the_context_is_cut_and_keeps_parity(tok):
    torch.manual_seed(0)
    model = TinyAgent(TinyAgentConfig(vocab_size=tok.vocab_size, max_len=96)).eval()
    trajs = _sample(model, tok, TRAIN[:4], seed=1)
    assert all(len(t) <= 96 for t in trajs)
    assert any(t.info.get("context_cut") for t in trajs)
    batch = collate(trajs, tok.pad_id)
    with torch.no_grad():
        logp = sequence_log_probs(model, batch["ids"])
    assert ((logp - batch["sample_logp"]) * batch["policy_mask"]).abs().max() < 1e-5


def test_temperature_changes_the_sampling_distribution(tok):
    torch.manual_seed(0)
    model = TinyAgent(tok.vocab_size).eval()
    trajs = _sample(model, tok, TRAIN[:2], seed=0, temperature=0.5)
    batch = collate(trajs, tok.pad_id)
    with torch.no_grad():
        logits, _ = model(batch["ids"])
    ref = F.log_softmax(logits[:, :-1] / 0.5, -1).gather(-1, batch["ids"][:, 1:, None]).squeeze(-1)
    assert ((ref - batch["sample_logp"]) * batch["policy_mask"]).abs().max() < 1e-5


def test_scripted_rollout_matches_episode_tokens(tok):
    env = bugfix_gym.BugFixEnv()
    for kind in ("random", "blind", "oracle"):
        tr = scripted_rollout(bugfix_gym.scripted_policy(kind, seed=0), env, "clamp", tok)
        ids, owner = bugfix_gym.episode_tokens(env.transcript, tok)
        assert np.array_equal(tr.ids.numpy(), ids) and np.array_equal(tr.owner.numpy(), owner)
        assert torch.equal(tr.policy_mask, (tr.owner[1:] == 2).float())
        assert (tr.sample_logp == 0).all() and (tr.values == 0).all() and tr.task == "clamp"
        if kind == "oracle":
            assert tr.reward == 1.0
            (t,) = torch.nonzero(tr.token_rewards).flatten().tolist()
            assert tr.ids[t + 1] == tok.eoc_id and tok.decode(tr.ids[t:t + 2].tolist()) == "submit"


# ---------------------------------------------------------------------- the sampler on a VecEnv
def _monitored(n, seed=0, **kw):
    venv = DummyVecEnv([lambda: Monitor(bugfix_gym.BugFixEnv(**kw)) for _ in range(n)])
    venv.seed(seed)
    return venv


def test_fresh_batches_record_each_envs_next_episodes_all_sampled_now(shared_base_agent, tok):
    """The default, on-policy batches: every env records its next ceil(n / n_envs) episodes."""
    venv = _monitored(4, seed=1)
    sampler = EpisodeSampler(venv, tok)
    steps = []
    batch = sampler.collect(shared_base_agent, 6, generator=torch.Generator().manual_seed(0),
                            on_step=lambda d, i, r, rec: steps.append(rec.copy()) or True)
    assert len(batch) == 8 and sampler.episodes is None  # 2 per env; the next batch starts over
    assert np.sum(steps, axis=0).tolist() == [2, 2, 2, 2]
    for tr in batch:
        assert tr.owner[0] == 1 and tr.owner[-1] == 3
        assert len(_calls(tr)) == tr.info["n_turns"] == tr.info["episode"]["l"]
    # one episode per env per round: an env that is done waits with the filler (an invalid call) for at
    # most 5 steps, so its unrecorded episode never finishes and Monitor sees only the batch's episodes
    for _ in range(3):
        sampler.collect(shared_base_agent, 4, generator=torch.Generator().manual_seed(1))
    assert sum(len(m.get_episode_rewards()) for m in venv.envs) == 8 + 3 * 4


def test_collect_returns_whole_episodes_across_batches_and_every_finished_episode_once(shared_base_agent, tok):
    """fresh=False: 4 envs, batches of 6 episodes: episodes still running at the end of a batch finish in the
    next one, whole (prompt to terminal output); together the batches are exactly the Monitor's episodes."""
    venv = _monitored(4, seed=1)
    sampler = EpisodeSampler(venv, tok)
    gen = torch.Generator().manual_seed(0)
    seen = []
    for _ in range(3):
        batch = sampler.collect(shared_base_agent, 6, fresh=False, generator=gen)
        assert len(batch) >= 6
        seen += batch
    monitored = sum(len(m.get_episode_rewards()) for m in venv.envs)
    assert len(seen) == monitored
    for tr in seen:
        assert tr.owner[0] == 1 and tr.owner[-1] == 3  # starts at the prompt, ends with the last tool output
        assert len(_calls(tr)) == tr.info["n_turns"] == tr.info["episode"]["l"]
        assert tr.reward == pytest.approx(tr.info["episode"]["r"])
        ids, _ = bugfix_gym.episode_tokens([(3, tr.info["terminal_observation"])], tok)
        assert tr.ids[-len(ids):].tolist() == ids.tolist()


def test_max_steps_and_on_step_stop_the_collection(shared_base_agent, tok):
    sampler = EpisodeSampler(_monitored(3), tok)
    calls = []
    out = sampler.collect(shared_base_agent, 100, max_env_steps=6,
                          on_step=lambda d, i, r, rec: calls.append(len(d)) or True)
    assert calls == [3, 3] and len(out) <= 6
    stopped = sampler.collect(shared_base_agent, 100, on_step=lambda d, i, r, rec: False)
    assert len(stopped) <= 3


class LoudTools(gym.ObservationWrapper):
    """Changes what the agent sees: every observation gets a suffix."""

    def observation(self, observation):
        return observation + " extra words"


def test_tokens_come_from_the_observations_a_wrapper_returns(shared_base_agent, tok):
    venv = DummyVecEnv([lambda: LoudTools(bugfix_gym.BugFixEnv())])
    (tr,) = EpisodeSampler(venv, tok).collect(shared_base_agent, 1, generator=torch.Generator().manual_seed(0))
    suffix = bugfix_gym.encode_segment(tok, 3, "extra words")
    text = tok.decode(tr.ids.tolist(), stop_at_eoc=False)
    assert text.count(tok.decode(suffix, stop_at_eoc=False)) == tr.info["n_turns"] + 1  # prompt and every output


@pytest.mark.heavy
def test_subproc_and_dummy_vec_envs_give_the_same_trajectories(shared_base_agent, tok):
    def run(cls):
        venv = cls([lambda: bugfix_gym.BugFixEnv() for _ in range(3)])
        venv.seed(11)
        try:
            return EpisodeSampler(venv, tok).collect(shared_base_agent, 8, fresh=False,
                                                     generator=torch.Generator().manual_seed(4))
        finally:
            venv.close()

    dummy, subproc = run(DummyVecEnv), run(SubprocVecEnv)
    assert len(dummy) == len(subproc) >= 8
    for a, b in zip(dummy, subproc):
        assert torch.equal(a.ids, b.ids) and torch.equal(a.sample_logp, b.sample_logp) and a.reward == b.reward


def test_the_fresh_info_vec_env_steps_as_sb3s_and_a_later_step_leaves_earlier_infos_as_they_were():
    def make():
        return Monitor(bugfix_gym.BugFixEnv(max_turns=2))

    sb3, fresh = DummyVecEnv([make, make]), FreshInfoDummyVecEnv([make, make])
    for venv in (sb3, fresh):
        venv.seed(5)
    assert np.array_equal(sb3.reset(), fresh.reset())
    kept = []
    for actions in (["read", "test"], ["edit fix_init", "submit"], ["test", "read"]):  # auto-resets on the way
        for venv in (sb3, fresh):
            venv.step_async(actions)
        (o1, r1, d1, i1), (o2, r2, d2, i2) = sb3.step_wait(), fresh.step_wait()
        assert np.array_equal(o1, o2) and np.array_equal(r1, r2) and np.array_equal(d1, d2)
        assert [_shown(a) for a in i1] == [_shown(b) for b in i2] and d1.any() == ("terminal_observation" in i2[0])
        kept.append((i2, [_shown(b) for b in i2]))
    for infos, shown in kept:  # the later steps left what each step returned as it was
        assert [_shown(b) for b in infos] == shown


def _shown(info: dict) -> dict:
    """An info dict as text, Monitor's wall-clock time left out."""
    return {k: str({**v, "t": None} if k == "episode" else v) for k, v in info.items()}


def test_a_model_with_its_own_cache_kind_gets_a_new_cache_from_the_same_sampler(tok, shared_base_agent):
    """The sampler reuses its KV cache across batches of one model; a subclass that keeps another
    kind of cache (e.g. the benchmark's prefix re-runner) must get its own, not the last model's."""
    from agents.bugfix.evaluation import task_vec_env

    made = []

    class OwnCache(TinyAgent):
        def new_cache(self, batch_size):
            made.append(batch_size)
            return super().new_cache(batch_size)

    other = OwnCache(shared_base_agent.config)
    other.load_state_dict(shared_base_agent.state_dict())
    sampler = EpisodeSampler(task_vec_env(2), tok)
    tasks = ["clamp", "first"]
    sampler.play_tasks(shared_base_agent, tasks, generator=torch.Generator().manual_seed(0))
    sampler.play_tasks(shared_base_agent, tasks, generator=torch.Generator().manual_seed(0))
    assert made == []
    a = sampler.play_tasks(other, tasks, generator=torch.Generator().manual_seed(0))
    assert made == [2]

    class NoKeys:  # a cache kind without keys and values (the benchmark's prefix re-runner keeps tokens)
        def __init__(self, batch_size):
            self.lengths = torch.zeros(batch_size, dtype=torch.long)

    class OtherKind(OwnCache):
        def new_cache(self, batch_size):
            made.append(batch_size)
            return NoKeys(batch_size)

    other_kind = OtherKind(shared_base_agent.config)
    for _ in range(2):  # the second batch must not read keys the first cache does not have
        assert isinstance(sampler._cache_for(other_kind), NoKeys)
    assert made == [2, 2, 2]
    fresh = EpisodeSampler(task_vec_env(2), tok)
    b = fresh.play_tasks(shared_base_agent, tasks, generator=torch.Generator().manual_seed(0))
    assert [t.ids.tolist() for t in a] == [t.ids.tolist() for t in b]  # same weights, same episodes


def test_foresight_at_threshold_one_closes_nothing(tok):
    from agents.decoding.foresight import Foresight

    torch.manual_seed(0)
    model = TinyAgent(tok.vocab_size).eval()
    grammar = CallGrammar(tok, bugfix_gym.CALLS)
    plain = _sample(model, tok, TRAIN[:6], seed=4, grammar=grammar)
    seeing = _sample(model, tok, TRAIN[:6], seed=4, grammar=grammar, foresight=Foresight(grammar, tok, 1.0, **WORDS))
    for a, b in zip(plain, seeing):
        assert torch.equal(a.ids, b.ids) and torch.equal(a.grammar_state, b.grammar_state)


def test_foresight_closes_the_ops_expected_to_change_nothing_and_the_trainer_scores_the_same_mask(tok):
    """At a threshold below every prediction all but the op least expected to answer `no change` close:
    each op is then written with probability 1, and the recorded states reproduce that in scoring."""
    from agents.decoding.foresight import Foresight

    torch.manual_seed(0)
    model = TinyAgent(tok.vocab_size).eval()
    grammar = CallGrammar(tok, bugfix_gym.CALLS)
    foresight = Foresight(grammar, tok, 1e-12, **WORDS)
    trajs = _sample(model, tok, TRAIN[:8] * 2, seed=5, grammar=grammar, foresight=foresight)
    batch = collate(trajs, tok.pad_id)
    ops = set(foresight.ops.tolist())
    at_op = torch.isin(batch["ids"][:, 1:], torch.tensor(sorted(ops))) & (batch["policy_mask"] > 0)
    assert at_op.sum() >= 8  # edits were written
    assert batch["sample_logp"][at_op].abs().max() < 1e-6  # one op open: probability 1
    assert (batch["grammar_state"][at_op] >= grammar.n_nodes).all()  # the closed ops are in the recorded state
    with torch.no_grad():
        logp, _, _ = score_tokens(model, batch["ids"], batch["policy_mask"], grammar=grammar,
                                  grammar_state=batch["grammar_state"])
    assert ((logp - batch["sample_logp"]) * batch["policy_mask"]).abs().max() < 1e-5
    # which op stays open is the model's own choice: the one its next-token prediction after "op <eoc>"
    # gives the least probability of "no"
    cache = model.new_cache(1)
    prompt = torch.tensor([bugfix_gym.encode_segment(tok, bugfix_gym.OWNER_PROMPT, "fix the function f : x .")
                           + tok.encode("edit")])
    model.extend(prompt, torch.tensor([prompt.shape[1]]), cache)
    state = [grammar.step(grammar.start, tok.ids["edit"])]
    foresight.refine(model, cache, [0], state)
    p_no = [torch.softmax(model(torch.cat([prompt, torch.tensor([[op, tok.eoc_id]])], 1))[0][0, -1], -1)[tok.ids["no"]]
            for op in foresight.ops.tolist()]
    closed = state[0] // grammar.n_nodes
    open_ops = [k for k, call in enumerate(foresight.calls) if not closed >> call & 1]
    assert open_ops == [int(torch.stack(p_no).argmin())]


@pytest.mark.parametrize("threshold", [0.0, 1.5])
def test_foresight_threshold_outside_0_1_is_an_error(tok, threshold):
    from agents.decoding.foresight import Foresight

    with pytest.raises(ValueError, match="threshold"):
        Foresight(CallGrammar(tok, bugfix_gym.CALLS), tok, threshold, **WORDS)


def test_foresight_needs_edit_calls(tok):
    from agents.decoding.foresight import Foresight

    with pytest.raises(ValueError, match="edit <op>"):
        Foresight(CallGrammar(tok, ["read", "submit"]), tok, 0.5, **WORDS)


def test_foresight_reads_the_words_it_is_given_and_sums_the_no_change_words(tok):
    """Foresight knows no env's words: with ``no_change=("no", "nothing")`` an op closes on the two words'
    summed probability, and another op prefix than BugFix's is refused by name when the grammar lacks it."""
    from agents.decoding.foresight import Foresight

    torch.manual_seed(0)
    model = TinyAgent(tok.vocab_size).eval()
    grammar = CallGrammar(tok, bugfix_gym.CALLS)
    prompt = torch.tensor([bugfix_gym.encode_segment(tok, bugfix_gym.OWNER_PROMPT, "fix the function f : x .")
                           + tok.encode("edit")])
    with torch.no_grad():
        probs = [torch.softmax(model(torch.cat([prompt, torch.tensor([[op, tok.eoc_id]])], 1))[0][0, -1], -1)
                 for op in Foresight(grammar, tok, 0.5, **WORDS).ops.tolist()]
    both = sorted(float(p[tok.ids["no"]] + p[tok.ids["nothing"]]) for p in probs)
    threshold = (both[0] + both[1]) / 2  # all but the op least expected to say "no" or "nothing" close
    foresight = Foresight(grammar, tok, threshold, op_prefix="edit", no_change=("no", "nothing"))
    cache = model.new_cache(1)
    model.extend(prompt, torch.tensor([prompt.shape[1]]), cache)
    state = [grammar.step(grammar.start, tok.ids["edit"])]
    foresight.refine(model, cache, [0], state)
    open_ops = [k for k in foresight.calls if grammar.is_open(state[0], k)]
    assert len(open_ops) == 1 and len(foresight.calls) > 2
    with pytest.raises(ValueError, match="'test <op>'"):
        Foresight(grammar, tok, 0.5, op_prefix="test", no_change=("no",))


def test_the_policy_takes_foresight_words_from_the_env_and_saves_them(tmp_path):
    """TokenPPO hands BugFix-v0's advertised words to its policy, and a saved model keeps them; an env that
    advertises none gets a one-line error naming the policy keyword."""
    from agents.algorithms.ppo import TokenPPO

    model = TokenPPO("TinyAgentPolicy", gym.make("BugFix-v0"), base_agent=None, n_episodes=8,
                     policy_kwargs=dict(call_grammar=bugfix_gym.CALLS, foresight=0.5))
    assert model.policy.foresight_words == dict(WORDS) and model.policy.foresight.threshold == 0.5
    model.save(tmp_path / "m.zip")
    loaded = TokenPPO.load(tmp_path / "m.zip")
    assert loaded.policy.foresight_words == {"op_prefix": "edit", "no_change": ["no"]}
    assert torch.equal(loaded.policy.foresight.no_ids, model.policy.foresight.no_ids)
    with pytest.raises(ValueError, match="foresight_words"):
        loaded.policy.foresight_words = None
        loaded.policy.make_foresight(0.5)
    # a file saved before the words were advertised: the bugfix layer's upgrade gives it BugFix-v0's
    import agents.bugfix.aux_losses  # noqa: F401 (registers the upgrade)
    from agents.files import checkpoint

    data, params = model.model_file_contents()
    data["policy_kwargs"].pop("foresight_words")
    checkpoint.write(tmp_path / "old.zip", data, params)
    assert TokenPPO.load(tmp_path / "old.zip").policy.foresight_words == dict(WORDS)


# ---------------------------------------------------------------------- the one evaluator
def test_the_evaluator_plays_an_algorithm_as_its_rollouts_do_and_a_policy_at_temperature_one(shared_base_agent, tok):
    from agents.algorithms.ppo import TokenPPO
    from agents.bugfix.evaluation import evaluate

    model = TokenPPO("TinyAgentPolicy", gym.make("BugFix-v0"), base_agent=shared_base_agent, n_episodes=4, seed=0,
                     temperature=0.7, policy_kwargs=dict(tokenizer=tok, call_grammar=bugfix_gym.CALLS,
                                                         call_mask_key="call_mask"))
    tasks, bare = TRAIN[:6], model.policy.model
    settings = model.policy.sampler_kwargs()
    assert settings["grammar"] is not None and settings["call_mask_key"] == "call_mask"
    as_trained = evaluate(bare, tasks, 2, seed=4, tokenizer=tok, temperature=0.7, **settings)
    np.testing.assert_equal(evaluate(model, tasks, 2, seed=4), as_trained)  # nan == nan for the empty groups
    np.testing.assert_equal(evaluate(model.policy, tasks, 2, seed=4),
                            evaluate(bare, tasks, 2, seed=4, tokenizer=tok, **settings))
    trajs = sample_episodes(model, tasks, 2, seed=4)
    assert [t.task for t in trajs] == [t for t in tasks for _ in range(2)]
    assert all((t.grammar_state[t.policy_mask > 0] >= 0).all() for t in trajs)  # the policy's grammar was used


def test_the_evaluator_says_what_it_needs_in_one_line(tok):
    from agents.bugfix.evaluation import evaluate

    with pytest.raises(ValueError, match="pass tokenizer=tok"):
        evaluate(TinyAgent(tok.vocab_size), TRAIN[:1])
    with pytest.raises(TypeError, match="the tokenizer is a keyword now"):
        evaluate(TinyAgent(tok.vocab_size), tok, TRAIN[:1])
    with pytest.raises(TypeError, match="not a str"):
        sample_episodes("model", TRAIN[:1])


# ---------------------------------------------------------------------- grammar-forced tokens
def _write_each_token_with_the_model(model, cache, feed, eoc_id, grammar, states, generator, max_call_tokens=8):
    """The decoder without forced-token skipping: one model call per written token, every row
    feeding its pending tokens, one uniform draw per writing row per step (the reference)."""
    from agents.decoding.decoder import sample_tokens

    B = len(feed)
    tokens, logps = [[] for _ in range(B)], [[] for _ in range(B)]
    pending, active = [list(f) for f in feed], list(range(B))
    states = list(states)
    while active:
        S = max(len(p) for p in pending)
        chunk = torch.tensor([p + [0] * (S - len(p)) for p in pending])
        logits, _ = model.extend(chunk, torch.tensor([len(p) for p in pending]), cache)
        pending = [[] for _ in range(B)]
        rows = torch.tensor(active)
        masked = grammar.mask_logits(logits[rows].float(), torch.tensor([states[b] for b in active]))
        logp_all = F.log_softmax(masked, dim=-1)
        new = sample_tokens(logp_all.exp(), generator)
        lp = logp_all.gather(-1, new).squeeze(-1).tolist()
        writers, active = active, []
        for b, t, l in zip(writers, new.squeeze(-1).tolist(), lp):
            tokens[b].append(t)
            logps[b].append(l)
            states[b] = grammar.step(states[b], t)
            if t != eoc_id and len(tokens[b]) < max_call_tokens:
                pending[b].append(t)
                active.append(b)
    return tokens, logps


def test_forced_tokens_take_no_model_call_and_the_calls_equal_one_model_call_per_token(tok, shared_base_agent):
    """A forced token (the only one the grammar allows) gets log-prob 0 without the model; the random
    numbers each choice uses are unchanged, so the calls equal those of a decoder that runs the model
    for every token, and the tokens left unfed (the calls but their last token) are reported."""
    from agents.decoding.decoder import write_calls

    grammar = CallGrammar(tok, bugfix_gym.CALLS)
    prompt = tok.encode(bugfix_gym.BugFixEnv().reset(options={"task": "clamp"})[0])
    feed = [prompt[: 20 + 7 * b] for b in range(6)]
    starts = [grammar.start] * 5 + [grammar.start_for([c == "submit" for c in bugfix_gym.CALLS])]  # all forced
    calls_made = []
    model = shared_base_agent

    class Counting(TinyAgent):
        def extend(self, *args, **kwargs):
            calls_made.append(1)
            return super().extend(*args, **kwargs)

    counting = Counting(model.config)
    counting.load_state_dict(model.state_dict())
    for seed in range(4):
        calls_made.clear()
        got = write_calls(counting.eval(), counting.new_cache(6), feed, [True] * 6, tok.eoc_id, max_call_tokens=8,
                          grammar=grammar,
                          generator=torch.Generator().manual_seed(seed), start_states=starts)
        want, want_logp = _write_each_token_with_the_model(model, model.new_cache(6), feed, tok.eoc_id, grammar,
                                                           starts, torch.Generator().manual_seed(seed))
        assert got.tokens == want
        assert max(abs(a - b) for r, s in zip(got.logp, want_logp) for a, b in zip(r, s)) < 1e-5
        assert got.tokens[5] == tok.encode("submit") + [tok.eoc_id] and got.logp[5] == [0.0, 0.0]
        for b in range(6):  # every token is fed once or reported unfed, in order
            seq = feed[b] + got.tokens[b][:-1]
            assert len(got.fed_values[b]) + len(got.unfed[b]) == len(seq)
            assert got.unfed[b] == seq[len(seq) - len(got.unfed[b]):]
            assert grammar.forced(got.states[b][-1]) == tok.eoc_id and got.logp[b][-1] == 0.0  # <eoc> is forced
        longest = max(range(6), key=lambda b: len(got.tokens[b]))
        assert got.unfed[longest] == got.tokens[longest][-2:-1]  # the last step (all forced) fed nothing
        assert len(calls_made) < max(len(t) for t in want)  # the last step (<eoc> everywhere) made no call


def test_grammar_episodes_keep_logp_states_and_every_fed_value_of_the_full_forward(tok, shared_base_agent):
    """With forced tokens skipped and fed later (with the next tool output, or for a finished episode's
    last call before its row starts over), the stored sample_logp (0 for forced tokens), grammar states
    and critic values equal what one full forward over the episodes gives; in lockstep and across
    batches (fresh=False, where an env records episode after episode on one cache row)."""
    from agents.bugfix.evaluation import task_vec_env

    grammar = CallGrammar(tok, bugfix_gym.CALLS)
    lockstep = _sample(shared_base_agent, tok, TRAIN[:8] * 2, seed=4, grammar=grammar)
    venv = task_vec_env(3)
    venv.seed(0)
    sampler = EpisodeSampler(venv, tok, grammar=grammar, call_mask_key="useful_calls")
    across = sampler.collect(shared_base_agent, 5, fresh=False, generator=torch.Generator().manual_seed(1))
    across += sampler.collect(shared_base_agent, 5, fresh=False, generator=torch.Generator().manual_seed(2))
    for trajs in (lockstep, across):
        batch = collate(trajs, tok.pad_id)
        mask = batch["policy_mask"]
        with torch.no_grad():
            logp, values, _ = score_tokens(shared_base_agent, batch["ids"], mask, grammar=grammar,
                                           grammar_state=batch["grammar_state"])
            _, all_values, _ = score_tokens(shared_base_agent, batch["ids"])
        forced = torch.tensor([[grammar.forced(int(s)) is not None for s in row] for row in batch["grammar_state"]])
        forced &= mask > 0
        assert forced.sum() >= len(trajs)  # every call ends with a forced <eoc>
        assert (batch["sample_logp"][forced] == 0).all() and (logp[forced] == 0).all()
        assert ((logp - batch["sample_logp"]) * mask).abs().max() < 1e-5
        last_call = mask.shape[1] - 1 - torch.argmax(mask.flip(1), dim=1)  # [B]
        fed = (torch.arange(mask.shape[1])[None] <= last_call[:, None]).float()
        assert ((all_values - batch["values"]) * fed).abs().max() < 1e-5
