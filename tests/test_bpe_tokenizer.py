"""BugFix-v1's BPE tokenizer: any text encodes and decodes back, every legal call of a heldout task encodes without
an unknown token and the legal-call grammar writes it token by token, the saved dict loads back through the
registered format, a TinyAgent on it trains, saves and loads with it, and the committed file is what the train
split trains (``--check``)."""

from __future__ import annotations

import pickle
import random

import pytest

from agents.bugfix.v1 import one_task_per_problem, v1_policy_kwargs, v1_tokenizer
from agents.decoding.legal_calls import LegalCallGrammar
from bugfix_gym.contract.bpe_tokenizer import BPE_FORMAT, BPETokenizer, train_bpe
from bugfix_gym.contract.byte_tokenizer import ByteTokenizer
from bugfix_gym.contract.tokens import OWNER_POLICY, OWNER_TOOL, tokenizer_from_dict
from bugfix_gym.core.bpe_v1 import VOCAB_SIZE_V1, load_bpe_v1, main
from bugfix_gym.core.env_v1 import BugFixEnvV1

MAX_CALL_TOKENS = 24

TEXTS = ["", "x", "def f(x):\n\treturn x  +  1\r\n", "héllo wörld ✓ 😀 ∑", "<eoc><turn><pad> <unk>",
         "\x00\x01\x7f\u200b\ufffd", "   \n\n\t  trailing   ", "edit 4.1 op <=", "a" * 500]


@pytest.fixture(scope="module")
def tok() -> BPETokenizer:
    return load_bpe_v1()


@pytest.fixture(scope="module")
def heldout_legal() -> list[list[str]]:
    env = BugFixEnvV1(split="heldout")
    out = []
    for task in one_task_per_problem(env.tasks)[:3]:
        env.reset(seed=0, options={"task": f"{task.problem}:{task.name}"})
        legal = env.legal_calls()
        env.step(next(c for c in legal if c.startswith("edit ")))
        out.append(legal + env.legal_calls())  # revert is legal after the edit
    return out


def test_the_committed_tokenizer_has_the_byte_tokenizers_specials_and_its_size(tok):
    assert (tok.pad_id, tok.eoc_id, tok.turn_id, tok.unk_id) == (0, 1, 2, -1)
    assert tok.vocab_size == VOCAB_SIZE_V1
    assert v1_tokenizer("bpe") is tok and v1_tokenizer("byte") == ByteTokenizer()
    assert v1_policy_kwargs(max_len=512, tokenizer="bpe")["model_config"].vocab_size == VOCAB_SIZE_V1
    assert isinstance(v1_policy_kwargs()["tokenizer"], ByteTokenizer)  # the default is unchanged
    with pytest.raises(ValueError, match="unknown tokenizer"):
        v1_tokenizer("word")


def test_any_text_encodes_without_specials_and_decodes_back(tok):
    rng = random.Random(0)
    texts = TEXTS + ["".join(chr(rng.choice([rng.randrange(32, 127), rng.randrange(0x80, 0x3000), 9, 10]))
                             for _ in range(rng.randrange(1, 80))) for _ in range(200)]
    for text in texts:
        ids = tok.encode(text)
        assert all(3 <= i < tok.vocab_size for i in ids), text
        assert tok.decode(ids) == text and tok.decode(ids + [tok.eoc_id, 50]) == text
    assert tok.decode([tok.pad_id, tok.turn_id, -5, tok.vocab_size, *tok.encode("ok")]) == "ok"
    assert tok.decode(tok.encode("ab") + [tok.eoc_id] + tok.encode("cd"), stop_at_eoc=False) == "abcd"
    assert tok.decode(tok.encode("é")[:1] if len(tok.encode("é")) > 1 else []) in ("\ufffd", "")
    code = "def f(numbers):\n    return sorted(numbers)\n"
    assert len(tok.encode(code)) < len(code) / 2  # merges: about three bytes a token on this text


def test_segments_end_with_eoc_or_turn(tok):
    assert tok.segment_ids(OWNER_POLICY, "read") == tok.encode("read") + [tok.eoc_id]
    assert tok.segment_ids(OWNER_TOOL, "ok") == tok.encode("ok") + [tok.turn_id]


def test_every_legal_call_of_heldout_tasks_encodes_and_decodes_back(tok, heldout_legal):
    for legal in heldout_legal:
        assert "revert" in legal and len(legal) > 100
        for call in legal:
            ids = tok.encode(call)
            assert ids and tok.unk_id not in ids and tok.eoc_id not in ids and tok.decode(ids) == call
            assert len(ids) < MAX_CALL_TOKENS and tok.encode(call) == ids


def test_the_grammar_writes_a_heldout_call_token_by_token(tok, heldout_legal):
    grammar = LegalCallGrammar(tok, MAX_CALL_TOKENS)
    legal = sorted(set(heldout_legal[0]))
    for call in (legal[0], legal[len(legal) // 2], "revert", "submit"):
        state = grammar.start_for(legal)
        for token in tok.encode(call):
            assert token in grammar.allowed_tokens(state)
            state = grammar.step(state, token)
        assert tok.eoc_id in grammar.allowed_tokens(state)
    state = grammar.start_for(legal)
    with pytest.raises(ValueError, match="not allowed"):
        grammar.step(state, tok.encode(" nonsense")[0])


def test_to_dict_loads_back_through_the_registered_format_and_pickles(tok):
    data = tok.to_dict()
    assert data["format"] == BPE_FORMAT
    back = tokenizer_from_dict(data)
    assert isinstance(back, BPETokenizer) and back == tok and hash(back) == hash(tok)
    assert back.encode(TEXTS[3]) == tok.encode(TEXTS[3])
    assert pickle.loads(pickle.dumps(tok)).encode("<eoc>") == tok.encode("<eoc>")
    assert tok != ByteTokenizer()
    with pytest.raises(ValueError, match="not a BPE tokenizer"):
        BPETokenizer.from_dict({"format": "bugfix_gym.ByteTokenizer/1"})
    with pytest.raises(ValueError, match="not a tokenizer.json"):
        BPETokenizer.from_dict({"format": BPE_FORMAT, "tokenizer_json": "{"})


def test_training_is_deterministic_and_small_vocabularies_are_refused():
    texts = ["def f(x):\n    return x + 1\n", "edit 4.1 op <=", "visible tests : 0 / 1 passed"] * 3
    assert train_bpe(texts, 300) == train_bpe(list(texts), 300)
    with pytest.raises(ValueError, match="at least 259"):
        train_bpe(texts, 100)


@pytest.mark.slow
def test_the_committed_file_is_what_the_train_split_trains(capsys):
    assert main(["--check"]) == 0, capsys.readouterr().out


@pytest.mark.heavy
def test_a_tinyagent_on_the_bpe_trains_saves_and_loads_with_it(tmp_path, tok):
    import torch

    from agents.algorithms.presets import load_algorithm
    from agents.bugfix.v1 import evaluate_v1, new_v1_ppo

    torch.manual_seed(0)
    tasks = one_task_per_problem(BugFixEnvV1(split="heldout").tasks)[:2]
    sizes = dict(tokenizer="bpe", max_len=512, d_model=16, n_layer=1, n_head=2, d_ff=32)
    model = new_v1_ppo(n_envs=2, seed=0, env_kwargs=dict(tasks=tasks, max_turns=3), model_sizes=sizes,
                       n_episodes=4, batch_size=4, n_epochs=1, max_call_tokens=MAX_CALL_TOKENS)
    model.learn(12)  # 4 episodes of 3 turns: one update whatever the calls
    first = model.diagnostics[-1]["epochs"][0]
    assert abs(first["ratio_min"] - 1) < 1e-4 and abs(first["ratio_max"] - 1) < 1e-4
    model.save(tmp_path / "bpe_v1.zip")
    loaded = load_algorithm(tmp_path / "bpe_v1.zip")
    assert loaded.policy.tokenizer == tok and loaded.policy.model.config.vocab_size == tok.vocab_size
    stats = evaluate_v1(loaded, tasks, 1, env_kwargs=dict(max_turns=3))
    assert stats["episodes"] == 2 and stats["valid_calls"] == 1.0
