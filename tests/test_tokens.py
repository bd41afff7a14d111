"""Tokenizer, episode tokens, owner codes and the action mask."""

from __future__ import annotations

import numpy as np
import pytest

from bugfix_gym import (CALLS, FIX_OPS, OWNER_POLICY, OWNER_PROMPT, OWNER_TOOL, BugFixEnv, Tokenizer,
                        apply_op, build_tokenizer, encode_segment, episode_tokens, make_tasks)
from bugfix_gym.contract.tokens import policy_mask
from bugfix_gym.core.tools import VOCABULARY_TEXT, prompt

TOK = build_tokenizer()


def test_specials_pad_is_zero_and_differs_from_end_of_call():
    assert TOK.pad_id == 0 and TOK.eoc_id != TOK.pad_id and TOK.unk_id not in (TOK.pad_id, TOK.eoc_id)
    assert TOK.words[TOK.eoc_id] == "<eoc>" and TOK.vocab_size == len(set(TOK.words))


def test_every_call_and_everything_the_tools_can_show_is_in_vocabulary():
    for call in CALLS:
        assert TOK.unk_id not in TOK.encode(call) and TOK.decode(TOK.encode(call)) == call
    assert TOK.unk_id not in TOK.encode(VOCABULARY_TEXT)
    for task in make_tasks("all"):
        texts = [prompt(task), task.source] + [apply_op(task.source, op) for op in FIX_OPS]
        for text in texts:
            assert TOK.unk_id not in TOK.encode(text), (task.name, text)


def test_unknown_words_map_to_unk_and_decode_stops_at_eoc():
    assert TOK.encode("read zyzzyva") == [TOK.ids["read"], TOK.unk_id]
    ids = TOK.encode("edit fix_init") + [TOK.eoc_id] + TOK.encode("read")
    assert TOK.decode(ids) == "edit fix_init"
    assert TOK.decode(ids, stop_at_eoc=False) == "edit fix_init <eoc> read"
    assert TOK.decode([TOK.pad_id, TOK.ids["read"], TOK.pad_id, 10**6]) == "read <unk>"


def test_tokenizer_is_deterministic_and_round_trips_through_dict_and_file(tmp_path):
    assert build_tokenizer() == TOK
    assert Tokenizer.from_dict(TOK.to_dict()) == TOK
    TOK.save(tmp_path / "tok.json")
    assert Tokenizer.load(tmp_path / "tok.json") == TOK
    with pytest.raises(ValueError, match="not a bugfix_gym tokenizer"):
        Tokenizer.from_dict({"words": ["a"]})
    smaller = build_tokenizer(make_tasks("train"))
    assert smaller.words == TOK.words[: smaller.vocab_size]  # first-seen order: train ids are a prefix


def test_episode_tokens_owner_codes_follow_the_transcript_segments():
    env = BugFixEnv()
    env.reset(options={"task": "clamp"})
    for call in ("read", "edit swap_minmax", "submit"):
        env.step(call)
    ids, owner = episode_tokens(env.transcript, TOK)
    assert ids.dtype == np.int64 and owner.dtype == np.int8 and ids.shape == owner.shape
    expected_ids, expected_owner = [], []
    for code, text in env.transcript:
        seg = TOK.encode(text) + ([TOK.eoc_id] if code == OWNER_POLICY else [TOK.turn_id])
        expected_ids += seg
        expected_owner += [code] * len(seg)
    assert ids.tolist() == expected_ids and owner.tolist() == expected_owner
    assert owner[0] == OWNER_PROMPT and {*owner.tolist()} == {OWNER_PROMPT, OWNER_POLICY, OWNER_TOOL}
    # every policy segment ends with <eoc>, and <eoc> appears nowhere else
    eoc = np.flatnonzero(ids == TOK.eoc_id)
    assert len(eoc) == 3 and (owner[eoc] == OWNER_POLICY).all() and (owner[eoc + 1] != OWNER_POLICY).all()
    mask = policy_mask(owner)
    assert mask.tolist() == (owner[1:] == OWNER_POLICY).astype(int).tolist() and mask.sum() == 3 + 4


def test_same_text_gets_different_owners_depending_on_who_wrote_it():
    transcript = [(OWNER_PROMPT, "read"), (OWNER_POLICY, "read"), (OWNER_TOOL, "read")]
    ids, owner = episode_tokens(transcript, TOK)
    read = TOK.ids["read"]
    turn = TOK.turn_id
    assert ids.tolist() == [read, turn, read, TOK.eoc_id, read, turn]
    assert owner.tolist() == [1, 1, 2, 2, 3, 3] and policy_mask(owner).tolist() == [0, 1, 1, 0, 0]
    assert encode_segment(TOK, OWNER_TOOL, "read") == [read, turn]
    with pytest.raises(ValueError, match="unknown owner code 0"):
        episode_tokens([(0, "read")], TOK)


def test_every_policy_turn_starts_right_after_a_turn_marker_that_no_policy_token_can_be():
    env = BugFixEnv()
    env.reset(options={"task": "clamp"})
    for call in ("", "revert", "read", "edit swap_minmax", "submit"):  # an empty turn, nothing to revert, ...
        env.step(call)
    ids, owner = episode_tokens(env.transcript, TOK)
    starts = [t for t in range(1, len(ids)) if owner[t] == OWNER_POLICY and owner[t - 1] != OWNER_POLICY]
    assert len(starts) == 5 and all(ids[t - 1] == TOK.turn_id for t in starts)
    turns = np.flatnonzero(ids == TOK.turn_id)
    # one <turn> closes each prompt / tool segment and is owned by it; the policy never owns one
    assert len(turns) == 1 + 5 and set(owner[turns].tolist()) == {OWNER_PROMPT, OWNER_TOOL}
    assert turns[-1] == len(ids) - 1
    # tool outputs that end in a call word ('nothing to revert', the '| submit' menu) end in <turn> now
    assert env.transcript[2][1].endswith("submit") and env.transcript[4][1].endswith("revert")


def test_a_tokenizer_saved_before_the_turn_marker_is_a_clear_error():
    old = {"format": "bugfix_gym.Tokenizer/1", "words": ["<pad>", "<unk>", "<eoc>", "<nl>", "read"]}
    with pytest.raises(ValueError, match="before the <turn> marker"):
        Tokenizer.from_dict(old)


def test_fixed_vocabulary_knows_code_and_train_templates_but_not_names_or_unseen_templates():
    import re

    from bugfix_gym import fixed_tokenizer, generate_tasks
    from bugfix_gym.tasks.generator import TEMPLATES, WORDS
    from bugfix_gym.core.vocabulary import PYTHON_WORDS, split_words

    fixed = fixed_tokenizer()
    assert fixed == fixed_tokenizer() and fixed.words[:5] == ["<pad>", "<unk>", "<eoc>", "<nl>", "<turn>"]
    for word in split_words(PYTHON_WORDS + " " + VOCABULARY_TEXT) + [str(i) for i in range(129)]:
        assert word in fixed.ids, word
    for word in ("//", "%", "**", "sorted", "while", "128"):
        assert word in fixed.ids
    assert set(TOK.words) <= set(fixed.words)  # the book tasks' words
    assert all(w in fixed.ids for pool in WORDS.values() for w in pool)
    train_words = set()
    for t in TEMPLATES["train"]:
        statements = (t.statement,) if isinstance(t.statement, str) else t.statement
        train_words |= set(split_words(re.sub(r"[{}]", " ", " ".join(statements) + " " + t.source)))
    assert train_words <= set(fixed.words)
    # exactly these sources, nothing else: words that only the unseen templates use are unknown
    pools = {w for pool in WORDS.values() for w in pool}
    known = set(split_words(VOCABULARY_TEXT + " " + PYTHON_WORDS)) | {str(i) for i in range(129)}
    known |= set(TOK.words) | pools | train_words
    assert set(fixed.words) == known
    unseen = set()
    for split in ("heldout", "test"):
        for t in TEMPLATES[split]:
            statements = (t.statement,) if isinstance(t.statement, str) else t.statement
            unseen |= set(split_words(re.sub(r"[{}]", " ", " ".join(statements))))
    assert unseen - known and all(fixed.encode(w) == [fixed.unk_id] for w in unseen - known)
    # a generated task: its function name (and only unknown words) become <unk>, the code reads as code
    task = generate_tasks("test", 1, seed=0)[0]
    ids = fixed.encode(task.source)
    assert ids[1] == fixed.unk_id and task.name not in fixed.ids
    assert fixed.unk_id not in ids[2:]  # the rest of the code is all known words
    assert fixed.encode("2.3333333333333335 129") == [fixed.unk_id, fixed.unk_id]
