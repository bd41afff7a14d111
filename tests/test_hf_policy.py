"""HF causal LMs as TokenPPO / GRPO policies (``make test-trl``; skipped without transformers): the adapter's
KV cache against its full forward, sampled log-probs against the trainer's scores, the first PPO ratio (dropout
in the config included), a few ``learn`` iterations of ``ppo`` and ``grpo``, save / load, and the one-line errors."""

from __future__ import annotations

import warnings

import pytest

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

import bugfix_gym  # noqa: E402,F401  (registers BugFix-v0)
import gymnasium as gym  # noqa: E402
from stable_baselines3.common.env_util import make_vec_env  # noqa: E402

from bugfix_gym.core.look import COLOURS, LookThenAnswerEnv  # noqa: E402

from agents import make_text_vec_env  # noqa: E402
from agents.algorithms.callbacks import StopAfterIterations  # noqa: E402
from agents.algorithms.ppo import TokenPPO  # noqa: E402
from agents.algorithms.presets import make_algorithm  # noqa: E402
from agents.cli import main  # noqa: E402
from agents.files import checkpoint  # noqa: E402
from agents.model.hf_adapter import HFAgent, config_dict  # noqa: E402
from agents.model.tinyagent import score_tokens  # noqa: E402

warnings.filterwarnings("ignore", message=".*past_key_values.*")


def tiny_llama(vocab_size: int, dropout: float = 0.0, seed: int = 0, kv_heads: int = 4):
    """A random-init LlamaForCausalLM (28k parameters for the default 230-id vocabulary)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=kv_heads, max_position_embeddings=512,
                         attention_dropout=dropout, tie_word_embeddings=True, bos_token_id=None)
    torch.manual_seed(seed)
    return LlamaForCausalLM(config)


def vec(n=4, seed=0):
    return make_vec_env("BugFix-v0", n_envs=n, seed=seed)


def ppo(tok, lm=None, cls=TokenPPO, **kw):
    args = dict(n_episodes=8, n_minibatches=2, n_epochs=2, seed=0, critic_warmup_steps=0, target_kl=None)
    args.update(kw)
    return cls("TinyAgentPolicy", vec(), policy_kwargs={"model": lm or tiny_llama(tok.vocab_size)}, **args)


class RecordingPPO(TokenPPO):
    """Keeps the statistics of every minibatch, in order."""

    def _minibatch_loss(self, sample, clip_low, clip_high):
        loss, stats = super()._minibatch_loss(sample, clip_low, clip_high)
        self.seen = getattr(self, "seen", []) + [stats]
        return loss, stats


# ---------------------------------------------------------------------- the adapter
def _feed(model, cache, seqs, plan, fed):
    """Feed each row the next ``plan[b]`` tokens of ``seqs[b]``; per row the (logits, values) of each fed token."""
    out = [[] for _ in seqs]
    S = max(plan)
    chunk = torch.zeros(len(seqs), S, dtype=torch.long)
    for b, n in enumerate(plan):
        chunk[b, :n] = seqs[b][fed[b]: fed[b] + n]
    logits, values = model.extend(chunk, torch.tensor(plan), cache, last_only=False)
    for b, n in enumerate(plan):
        out[b] += [(logits[b, j], values[b, j]) for j in range(n)]
        fed[b] += n
    return out


def tiny_lm(arch: str, vocab_size: int = 50):
    """A random-init causal LM of another architecture: Llama with grouped-query attention, GPT-2 (absolute
    positions, dropout 0.1 in its config), Qwen2."""
    from transformers import GPT2Config, GPT2LMHeadModel, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    if arch == "gpt2":
        return GPT2LMHeadModel(GPT2Config(vocab_size=vocab_size, n_embd=32, n_layer=2, n_head=4, n_positions=128,
                                          bos_token_id=0, eos_token_id=1))
    if arch == "qwen2":
        return Qwen2ForCausalLM(Qwen2Config(vocab_size=vocab_size, hidden_size=32, intermediate_size=64,
                                            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                            max_position_embeddings=128))
    return tiny_llama(vocab_size, kv_heads=2)  # grouped-query attention: 2 key/value heads


@pytest.mark.parametrize("arch", ["llama", "gpt2", "qwen2"])
def test_the_kv_cache_gives_the_full_forward_with_ragged_rows_restarts_and_compaction(arch):
    model = HFAgent(tiny_lm(arch))
    seqs = [torch.randint(0, 50, (n,), generator=torch.Generator().manual_seed(n)) for n in (7, 12, 3)]
    cache, fed = model.new_cache(3), [0, 0, 0]
    got = [[] for _ in seqs]
    for plan in ([3, 5, 0], [2, 7, 3], [2, 0, 0]):  # rows grow by different counts, some idle
        for b, rows in enumerate(_feed(model, cache, seqs, plan, fed)):
            got[b] += rows
    for b, seq in enumerate(seqs):
        logits, values = model(seq[None])  # [1, T, V], [1, T]
        torch.testing.assert_close(torch.stack([g[0] for g in got[b]]), logits[0], atol=1e-5, rtol=0)
        torch.testing.assert_close(torch.stack([g[1] for g in got[b]]), values[0], atol=1e-6, rtol=0)
    again = seqs[2][:3]
    for _ in range(30):  # row 2 starts over again and again: its dead columns are compacted away
        cache.lengths[2] = 0
        last, _ = model.extend(torch.stack([torch.zeros(3, dtype=torch.long)] * 2 + [again]), torch.tensor([0, 0, 3]),
                               cache)
    assert cache.valid.shape[1] < 64
    torch.testing.assert_close(last[2], model(again[None])[0][0, -1], atol=1e-5, rtol=0)
    cont = torch.randint(0, 50, (2, 3, 2))  # peek: 3 continuations of 2 tokens after rows 0 and 1
    peeked = model.peek(torch.tensor([0, 1]), cont, cache)
    for r, k in ((0, 1), (1, 2)):
        full = model(torch.cat([seqs[r][: fed[r]], cont[r, k]])[None])[0][0, -1]
        torch.testing.assert_close(peeked[r, k], full, atol=1e-5, rtol=0)
    assert cache.lengths.tolist() == [7, 12, 3]  # peek left the cache alone


@pytest.mark.parametrize("arch", ["llama", "gpt2", "qwen2"])
def test_the_hf_parameter_estimate_is_a_lower_bound(arch):
    lm = tiny_lm(arch, vocab_size=230)
    estimate, real = checkpoint.estimated_hf_parameters(config_dict(lm)), lm.num_parameters()
    assert 0.25 * real < estimate <= real  # GPT-2 names no MLP width (n_inner=None: 4 x n_embd), so less there


def test_an_lm_whose_logits_are_not_its_head_of_the_hidden_state_is_refused():
    lm = tiny_llama(50)

    class Scaled(type(lm)):
        def forward(self, *a, **k):
            out = super().forward(*a, **k)
            out.logits = out.logits * 2
            return out

    lm.__class__ = Scaled
    with pytest.raises(ValueError, match="not its output embedding"):
        HFAgent(lm)


# ---------------------------------------------------------------------- sampling and the first update
def test_the_sampler_s_log_probs_are_the_trainer_s_scores(tok):
    model = ppo(tok)
    trajs = model.sample_episodes(n=8)
    ids = torch.nn.utils.rnn.pad_sequence([t.ids for t in trajs], batch_first=True, padding_value=tok.pad_id)
    mask = torch.nn.utils.rnn.pad_sequence([t.policy_mask for t in trajs], batch_first=True)
    with torch.no_grad():
        logp, values, _ = score_tokens(model.policy.model, ids, mask, grammar=model.policy.grammar)
    sampled = torch.nn.utils.rnn.pad_sequence([t.sample_logp for t in trajs], batch_first=True)
    critic = torch.nn.utils.rnn.pad_sequence([t.values for t in trajs], batch_first=True)
    where = mask > 0
    assert int(where.sum()) > 20
    torch.testing.assert_close(sampled[where], logp[where], atol=2e-5, rtol=0)
    torch.testing.assert_close(critic[where], values[where], atol=1e-6, rtol=0)


@pytest.mark.parametrize("dropout, foresight", [(0.0, None), (0.5, None), (0.0, 0.5)])
def test_the_first_ppo_ratio_is_exactly_one_even_with_dropout_in_the_config(tok, dropout, foresight, monkeypatch):
    peeks = []
    real_peek = HFAgent.peek
    monkeypatch.setattr(HFAgent, "peek", lambda self, *a: peeks.append(1) or real_peek(self, *a))
    grammar = {} if foresight is None else {"call_grammar": list(bugfix_gym.CALLS), "foresight": foresight}
    model = RecordingPPO("TinyAgentPolicy", vec(), n_episodes=8, n_minibatches=2, n_epochs=2, seed=0,
                         critic_warmup_steps=0, target_kl=None, learning_rate=3e-3,
                         policy_kwargs={"model": tiny_llama(tok.vocab_size, dropout=dropout), **grammar})
    model.train_on_batch(model.sample_episodes(n=8))
    assert bool(peeks) == (foresight is not None)  # foresight reads the edit ops through the HF cache
    first = model.seen[0]
    assert first["ratio_min"] == 1.0 and first["ratio_max"] == 1.0 and first["clip_frac"] == 0.0
    assert max(s["ratio_max"] for s in model.seen[1:]) > 1.0  # later minibatches see the updated policy
    assert not model.policy.model.lm.training  # the LM stays in eval mode: no dropout anywhere


# ---------------------------------------------------------------------- learning
@pytest.mark.parametrize("name", ["ppo", "grpo"])
def test_a_few_iterations_of_learn_train_the_hf_model(name):
    """Look-then-answer with 4 colours: a random policy's legal answers pass a quarter of the time, so
    the rewards vary within GRPO's groups and the policy gradient is not zero."""
    env = LookThenAnswerEnv(colours=COLOURS[:4])
    tok = bugfix_gym.Tokenizer(env.words)
    lm = tiny_llama(tok.vocab_size)
    before = {k: v.clone() for k, v in lm.state_dict().items()}
    model = make_algorithm(name, env=make_text_vec_env(lambda: LookThenAnswerEnv(colours=COLOURS[:4]), n_envs=4),
                           policy_kwargs={"model": lm, "tokenizer": tok, "call_grammar": list(env.calls)},
                           n_episodes=16, seed=0, base_agent=None, target_kl=None,
                           **({"critic_warmup_steps": 0} if name == "ppo" else {}))
    model.learn(10**6, callback=StopAfterIterations(2))
    assert model.iteration == 2 and model.policy.model.lm is lm  # the given LM is the one trained
    assert any(e["grad_norm"] > 0 and e["pg_loss"] != 0 for d in model.diagnostics for e in d["epochs"])
    moved = [k for k, v in lm.state_dict().items() if not torch.equal(v, before[k])]
    assert moved and all(torch.isfinite(v).all() for v in lm.state_dict().values())
    if name == "grpo":
        assert isinstance(model.ref_model, HFAgent) and model.ref_model.lm is not lm


def test_an_hf_model_with_an_hf_chat_tokenizer_samples_trains_saves_and_loads(tmp_path):
    """The real-model path on the CPU: a Qwen2 ChatML tokenizer through ChatTemplateTokenizer and an LM of its
    vocabulary; the sampler's log-probs are the trainer's, the first ratio is 1, and the file loads back."""
    from bugfix_gym.integrations.hf_tokenizer import ChatTemplateTokenizer, chatml_tokenizer

    tok = ChatTemplateTokenizer(chatml_tokenizer())
    model = RecordingPPO("TinyAgentPolicy", vec(), n_episodes=8, n_minibatches=2, n_epochs=1, seed=0,
                         critic_warmup_steps=0, target_kl=None, base_agent=None, recompute_old_logp=False,
                         policy_kwargs={"model": tiny_llama(tok.vocab_size), "tokenizer": tok,
                                        "call_grammar": list(bugfix_gym.CALLS)})
    model.train_on_batch(model.sample_episodes(n=8))
    first = model.seen[0]  # old_logp are the sampler's own: KV cache vs full forward
    assert abs(first["ratio_min"] - 1) < 1e-5 and abs(first["ratio_max"] - 1) < 1e-5
    model.save(tmp_path / "chat.zip")
    loaded = RecordingPPO.load(tmp_path / "chat.zip")
    ids = torch.tensor([tok.segment_ids(1, "fix the function clamp")])
    with torch.no_grad():
        assert torch.equal(model.policy.model(ids)[0], loaded.policy.model(ids)[0])


# ---------------------------------------------------------------------- files
def test_save_and_load_rebuild_the_hf_model_with_identical_predictions(tok, tmp_path, capsys):
    model = ppo(tok)
    model.learn(10**6, callback=StopAfterIterations(1))
    model.save(tmp_path / "hf.zip")
    loaded = TokenPPO.load(tmp_path / "hf.zip")
    assert type(loaded.policy.model.lm) is type(model.policy.model.lm)
    saved = checkpoint.read(tmp_path / "hf.zip").data["policy_kwargs"]
    assert "model" not in saved and saved["hf_config"]["model_type"] == "llama"
    obs, _ = gym.make("BugFix-v0").reset(seed=3)
    for m in (model, loaded):
        m.policy.set_training_mode(False)
    a, _ = model.predict(obs, deterministic=True)
    b, _ = loaded.predict(obs, deterministic=True)
    assert a == b
    ids = torch.tensor([tok.encode(obs)[:40]])
    with torch.no_grad():
        for x, y in zip(model.policy.model(ids), loaded.policy.model(ids)):
            assert torch.equal(x, y)
    real = model.policy.model.lm.num_parameters()
    assert 0.5 * real < checkpoint.estimated_hf_parameters(saved["hf_config"]) <= real  # a lower bound
    assert main(["eval", str(tmp_path / "hf.zip"), "--generated", "test", "--n", "2", "--episodes", "1"]) == 0
    assert "pass" in capsys.readouterr().out


def test_a_model_file_whose_hf_config_asks_for_more_than_its_weights_is_refused(tok, tmp_path, monkeypatch):
    model = ppo(tok)
    with monkeypatch.context() as patch:  # weights over the model file's limit: refused at saving, not loading
        patch.setitem(checkpoint.ENTRY_LIMITS, "policy.pth", 1000)
        with pytest.raises(ValueError, match=r"save_pretrained\(DIR\)"):
            model.save(tmp_path / "too_big.zip")
    assert not (tmp_path / "too_big.zip").exists()
    data, params = model.model_file_contents()
    data["policy_kwargs"]["hf_config"]["num_hidden_layers"] = 100_000
    checkpoint.write(tmp_path / "big.zip", data, params)
    with pytest.raises(checkpoint.ModelFileError, match="hf_config asks for at least"):
        TokenPPO.load(tmp_path / "big.zip")
    data["policy_kwargs"]["hf_config"].update(num_hidden_layers=2, model_type="no-such-model")
    checkpoint.write(tmp_path / "odd.zip", data, params)
    with pytest.raises(checkpoint.ModelFileError, match="model_type 'no-such-model'"):
        TokenPPO.load(tmp_path / "odd.zip")


# ---------------------------------------------------------------------- errors
def test_a_vocabulary_that_is_not_the_tokenizer_s_is_a_one_line_error(tok):
    with pytest.raises(ValueError, match=r"resize_token_embeddings") as err:
        ppo(tok, tiny_llama(tok.vocab_size + 3))
    assert "\n" not in str(err.value)


def test_a_tinyagent_base_agent_or_model_config_with_an_hf_model_is_a_one_line_error(tok, shared_base_agent):
    with pytest.raises(ValueError, match="base_agent=None") as err:
        ppo(tok, base_agent=shared_base_agent)
    assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match="leave it out") as err:
        TokenPPO("TinyAgentPolicy", vec(), policy_kwargs={"model": tiny_llama(tok.vocab_size),
                                                          "model_config": {"d_model": 32}})
    assert "\n" not in str(err.value)


def test_importing_agents_and_the_adapter_imports_no_trainer_library():
    import subprocess
    import sys

    probe = ("import sys, bugfix_gym, agents, agents.model.hf_adapter, agents.algorithms.ppo, agents.cli, "
             "agents.cli.serve, bugfix_gym.integrations.conformance, bugfix_gym.integrations.shims; "
             "print(sorted(m for m in ('trl', 'transformers', 'tokenizers', 'datasets', 'verifiers') "
             "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stderr


def test_the_benchmark_runs_and_reports_both_models(capsys):
    import importlib.util
    import math
    import pathlib

    path = pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / "hf_policy.py"
    spec = importlib.util.spec_from_file_location("benchmark_hf_policy", path)
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = bench.main(["--quick", "--envs", "2"])
    assert {"tiny_steps_per_s", "hf_steps_per_s", "steps_per_s_ratio"} <= set(out)
    assert all(math.isfinite(v) and v > 0 for v in out.values())
    assert "Tiny / HF" in capsys.readouterr().out
