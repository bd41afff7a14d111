"""Tokenizer, episode tokens, owner codes and the action mask."""

from __future__ import annotations

import numpy as np
import pytest

from bugfix_gym import (CALLS, FIX_OPS, OWNER_POLICY, OWNER_PROMPT, OWNER_TOOL, BugFixEnv, Tokenizer, action_mask,
                        apply_op, build_tokenizer, encode_segment, episode_tokens, make_tasks)
from bugfix_gym.tools import VOCABULARY_TEXT, prompt

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
        seg = TOK.encode(text) + ([TOK.eoc_id] if code == OWNER_POLICY else [])
        expected_ids += seg
        expected_owner += [code] * len(seg)
    assert ids.tolist() == expected_ids and owner.tolist() == expected_owner
    assert owner[0] == OWNER_PROMPT and {*owner.tolist()} == {OWNER_PROMPT, OWNER_POLICY, OWNER_TOOL}
    # every policy segment ends with <eoc>, and <eoc> appears nowhere else
    eoc = np.flatnonzero(ids == TOK.eoc_id)
    assert len(eoc) == 3 and (owner[eoc] == OWNER_POLICY).all() and (owner[eoc + 1] != OWNER_POLICY).all()
    mask = action_mask(owner)
    assert mask.tolist() == (owner == OWNER_POLICY).astype(int).tolist() and mask.sum() == 3 + 4


def test_same_text_gets_different_owners_depending_on_who_wrote_it():
    transcript = [(OWNER_PROMPT, "read"), (OWNER_POLICY, "read"), (OWNER_TOOL, "read")]
    ids, owner = episode_tokens(transcript, TOK)
    read = TOK.ids["read"]
    assert ids.tolist() == [read, read, TOK.eoc_id, read]
    assert owner.tolist() == [1, 2, 2, 3] and action_mask(owner).tolist() == [0, 1, 1, 0]
    assert encode_segment(TOK, OWNER_TOOL, "read") == [read]
    with pytest.raises(ValueError, match="unknown owner code 0"):
        episode_tokens([(0, "read")], TOK)
