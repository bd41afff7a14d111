"""TinyAgent: sizes, causal right padding, critic init, KV-cache parity with the full forward."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from agents.model.tinyagent import TinyAgent, TinyAgentConfig, score_tokens, sequence_log_probs

V = 229


def _model(seed: int = 0, **kw) -> TinyAgent:
    torch.manual_seed(seed)
    return TinyAgent(TinyAgentConfig(vocab_size=V, **kw)).eval()


def test_default_size_is_about_150k_params():
    model = TinyAgent(V)  # book style: just the vocabulary size
    assert model.config == TinyAgentConfig(vocab_size=V)
    assert 130_000 <= model.num_params() <= 170_000
    assert model.lm_head.weight is model.tok_emb.weight  # tied policy head


def test_forward_shapes_and_no_dropout():
    model = _model().train()
    ids = torch.randint(V, (3, 17))
    logits, values = model(ids)
    assert logits.shape == (3, 17, V) and values.shape == (3, 17)
    logits2, values2 = model(ids)  # train mode: no dropout, so the same numbers
    assert torch.equal(logits, logits2) and torch.equal(values, values2)


def test_value_head_near_zero_at_init():
    _, values = _model()(torch.randint(V, (8, 40)))
    assert values.abs().max() < 0.05
    assert values.abs().max() > 0  # near zero, not degenerate (its weight still gets gradients)


def test_right_padding_does_not_change_earlier_positions():
    model = _model(value_init_std=0.5)
    ids = torch.randint(1, V, (2, 12))
    logits, values = model(ids)
    padded = torch.cat([ids, torch.zeros(2, 9, dtype=torch.long)], 1)  # right-pad with pad id 0
    junk = torch.cat([ids, torch.randint(V, (2, 9))], 1)
    for other in (padded, junk):
        lo, vo = model(other)
        torch.testing.assert_close(lo[:, :12], logits, atol=1e-5, rtol=0)
        torch.testing.assert_close(vo[:, :12], values, atol=1e-5, rtol=0)


def test_kv_cache_one_token_at_a_time_matches_full_forward():
    model = _model(seed=1, value_init_std=0.5)  # a visible critic so value parity means something
    B, T = 4, 30
    ids = torch.randint(V, (B, T))
    logits, values = model(ids)
    cache = model.new_cache(B)
    prompt = torch.tensor([3, 7, 1, 5])  # rows start with prompts of different lengths
    lo, vo = model.extend(ids[:, :7], prompt, cache, last_only=False)
    for b in range(B):
        n = int(prompt[b])
        torch.testing.assert_close(lo[b, :n], logits[b, :n], atol=1e-5, rtol=0)
        torch.testing.assert_close(vo[b, :n], values[b, :n], atol=1e-5, rtol=0)
    while int(cache.lengths.min()) < T:
        pos = cache.lengths.clone()
        active = pos < T
        step = ids[torch.arange(B), pos.clamp(max=T - 1)][:, None]  # [B, 1]
        last, v = model.extend(step, active.long(), cache)  # idle rows feed nothing
        for b in torch.nonzero(active).flatten().tolist():
            p = int(pos[b])
            torch.testing.assert_close(last[b], logits[b, p], atol=1e-5, rtol=0)
            torch.testing.assert_close(v[b, 0], values[b, p], atol=1e-5, rtol=0)
    assert cache.lengths.tolist() == [T] * B


def test_kv_cache_ragged_chunks_match_full_forward():
    model = _model(seed=2, value_init_std=0.5)
    B, T = 3, 40
    ids = torch.randint(V, (B, T))
    logits, values = model(ids)
    cache = model.new_cache(B)
    g = torch.Generator().manual_seed(0)
    while int(cache.lengths.min()) < T:
        start = cache.lengths.clone()
        n_new = torch.minimum(torch.randint(0, 9, (B,), generator=g), T - start)  # [B], 0 = idle row
        S = max(int(n_new.max()), 1)
        chunk = torch.zeros(B, S, dtype=torch.long)
        for b in range(B):
            chunk[b, : n_new[b]] = ids[b, start[b]: start[b] + n_new[b]]
        lo, vo = model.extend(chunk, n_new, cache, last_only=False)
        for b in range(B):
            s, n = int(start[b]), int(n_new[b])
            torch.testing.assert_close(lo[b, :n], logits[b, s: s + n], atol=1e-5, rtol=0)
            torch.testing.assert_close(vo[b, :n], values[b, s: s + n], atol=1e-5, rtol=0)


def test_feeds_of_very_different_widths_attend_in_groups_and_match_full_forward():
    """Prompts of 0 to 60 tokens (causal groups), then long tool outputs next to a few forced tokens and single
    tokens (groups split by width, short feeds over a view of the whole cache), then one token per row."""
    model = _model(seed=3, value_init_std=0.5)
    B, T = 8, 120
    ids = torch.randint(V, (B, T))
    logits, values = model(ids)
    cache = model.new_cache(B)
    for widths in ([60, 3, 45, 2, 0, 30, 1, 12], [1, 2, 40, 1, 3, 2, 25, 1], [1] * B, [2, 0, 2, 2, 2, 2, 2, 2]):
        start = cache.lengths.clone()
        n_new = torch.tensor(widths)
        chunk = torch.zeros(B, max(widths), dtype=torch.long)
        for b in range(B):
            chunk[b, : widths[b]] = ids[b, start[b]: start[b] + widths[b]]
        lo, vo = model.extend(chunk, n_new, cache, last_only=False)
        for b in range(B):
            s, n = int(start[b]), widths[b]
            torch.testing.assert_close(lo[b, :n], logits[b, s: s + n], atol=1e-5, rtol=0)
            torch.testing.assert_close(vo[b, :n], values[b, s: s + n], atol=1e-5, rtol=0)


def test_rows_starting_with_one_prompt_share_its_run_and_decode_as_the_full_forward():
    """Rows that start with the same tokens get the first such row's keys and outputs (it runs once);
    every row then decodes on its own as the full forward does."""
    model = _model(seed=5, value_init_std=0.5)
    a, b = torch.randint(V, (9,)), torch.randint(V, (6,))
    prompts = [a, b, a, a[:5], b]  # rows 2 and 4 repeat rows 0 and 1; row 3 is a shorter prompt
    cache = model.new_cache(len(prompts))
    chunk = torch.zeros(len(prompts), 9, dtype=torch.long)
    for r, p in enumerate(prompts):
        chunk[r, : len(p)] = p
    lo, vo = model.extend(chunk, torch.tensor([len(p) for p in prompts]), cache, last_only=False)
    assert cache.lengths.tolist() == [9, 6, 9, 5, 6]
    assert torch.equal(cache.k[:, 2, :, :9], cache.k[:, 0, :, :9]) and torch.equal(lo[4], lo[1])
    nxt = torch.randint(V, (len(prompts), 1))
    last, v = model.extend(nxt, torch.ones(len(prompts), dtype=torch.long), cache)
    for r, p in enumerate(prompts):
        full, values = model(torch.cat([p, nxt[r]])[None])
        torch.testing.assert_close(lo[r, : len(p)], full[0, :-1], atol=1e-5, rtol=0)
        torch.testing.assert_close(vo[r, : len(p)], values[0, :-1], atol=1e-5, rtol=0)
        torch.testing.assert_close(last[r], full[0, -1], atol=1e-5, rtol=0)
        torch.testing.assert_close(v[r, 0], values[0, -1], atol=1e-5, rtol=0)


def test_peek_gives_each_continuation_the_full_forwards_logits_and_leaves_the_cache():
    """Each of K continuations of a cached row scores as if it had been fed after the row's tokens."""
    model = _model(seed=3)
    lens = [5, 17, 1, 9]
    seqs = [torch.randint(V, (n,)) for n in lens]
    cache = model.new_cache(len(lens))
    chunk = torch.zeros(len(lens), max(lens), dtype=torch.long)
    for b, s in enumerate(seqs):
        chunk[b, : len(s)] = s
    model.extend(chunk, torch.tensor(lens), cache)
    keys = cache.k.clone()
    rows, cont = torch.tensor([3, 0, 2]), torch.randint(V, (3, 4, 3))  # [R], [R, K, S]
    got = model.peek(rows, cont, cache)  # [R, K, V]
    for r, b in enumerate(rows.tolist()):
        for k in range(4):
            full, _ = model(torch.cat([seqs[b], cont[r, k]])[None])
            torch.testing.assert_close(got[r, k], full[0, -1], atol=1e-5, rtol=0)
    assert cache.lengths.tolist() == lens and torch.equal(cache.k, keys)
    with pytest.raises(ValueError, match="overflow"):
        model.peek(rows, torch.zeros(3, 1, 600, dtype=torch.long), cache)


def test_peek_runs_through_the_blocks_own_forward():
    """One attention path per kind of input, behind ``Block.forward``: peek calls every block once."""
    model = _model(seed=4)
    cache = model.new_cache(2)
    model.extend(torch.randint(V, (2, 6)), torch.tensor([6, 3]), cache)
    called = []
    for block in model.blocks:
        block.register_forward_hook(lambda module, args, out: called.append(tuple(out.shape)))
    model.peek(torch.tensor([1, 0]), torch.randint(V, (2, 5, 2)), cache)
    assert called == [(2, 5, 2, model.config.d_model)] * model.config.n_layer


def test_kv_cache_overflow_and_long_input_raise():
    model = _model(max_len=16)
    with pytest.raises(ValueError, match="max_len"):
        model(torch.zeros(1, 17, dtype=torch.long))
    cache = model.new_cache(1)
    model.extend(torch.zeros(1, 10, dtype=torch.long), torch.tensor([10]), cache)
    with pytest.raises(ValueError, match="overflow"):
        model.extend(torch.zeros(1, 7, dtype=torch.long), torch.tensor([7]), cache)


@torch.no_grad()
def test_sequence_log_probs_values_entropy_agree_with_logits():
    model = _model(seed=3)
    ids = torch.randint(V, (2, 15))
    logits, values = model(ids)
    ref = F.log_softmax(logits, -1)  # [B, T, V]
    logp = sequence_log_probs(model, ids)
    assert logp.shape == (2, 14)
    for b in range(2):
        for t in range(14):
            assert abs(float(logp[b, t] - ref[b, t, ids[b, t + 1]])) < 1e-5
    logp2, v, ent = score_tokens(model, ids)
    torch.testing.assert_close(logp2, logp)
    torch.testing.assert_close(v, values[:, :-1])
    manual = -(ref[:, :-1].exp() * ref[:, :-1]).sum(-1)
    torch.testing.assert_close(ent, manual, atol=1e-5, rtol=0)
    assert (ent <= math.log(V) + 1e-4).all() and (ent > 0).all()


def _policy_like_mask(B: int, T: int, seed: int) -> torch.Tensor:
    """[B, T-1] float 0/1: a random ~15% of positions, every row with at least one."""
    g = torch.Generator().manual_seed(seed)
    mask = (torch.rand(B, T - 1, generator=g) < 0.15).float()
    mask[:, -1] = 1.0
    return mask


def test_masked_scoring_equals_full_scoring_on_masked_positions():
    model = _model(seed=5, max_len=64)
    ids = torch.randint(V, (4, 33))
    mask = _policy_like_mask(4, 33, seed=1)
    with torch.no_grad():
        full = score_tokens(model, ids)
        masked = score_tokens(model, ids, mask)
        masked_bool = score_tokens(model, ids, mask.bool())
    on = mask.bool()
    for f, m, mb in zip(full, masked, masked_bool):
        assert m.shape == f.shape == (4, 32)
        torch.testing.assert_close(m[on], f[on], atol=1e-6, rtol=0)
        assert (m[~on] == 0).all()
        assert torch.equal(m, mb)
    with pytest.raises(ValueError, match="mask"):
        score_tokens(model, ids, mask[:, :-1])


def test_masked_scoring_gradients_equal_full_scoring():
    """A loss read only at masked positions has the same gradient through either path."""
    model = _model(seed=6, max_len=64).train()
    ids = torch.randint(V, (3, 29))
    mask = _policy_like_mask(3, 29, seed=2)
    adv = torch.randn(3, 28)

    def grads(m: torch.Tensor | None) -> list[torch.Tensor]:
        model.zero_grad()
        logp, values, ent = score_tokens(model, ids, m)
        loss = ((-logp * adv + 0.5 * (values - adv) ** 2 - 0.01 * ent) * mask).sum() / mask.sum()
        loss.backward()
        return [p.grad.clone() if p.grad is not None else torch.zeros_like(p) for p in model.parameters()]

    for g_full, g_masked in zip(grads(None), grads(mask)):
        torch.testing.assert_close(g_masked, g_full, atol=1e-5, rtol=0)


def test_chunked_scoring_with_mask_matches_full_on_a_padded_batch():
    """The trainers' length-sorted chunked scoring of a right-padded batch agrees on policy positions."""
    model = _model(seed=7, max_len=64)
    lengths = [40, 12, 27, 33, 5, 19]
    B, T = len(lengths), max(lengths)
    ids = torch.randint(1, V, (B, T))
    for b, n in enumerate(lengths):
        ids[b, n:] = 0
    real = torch.arange(T)[None] < torch.tensor(lengths)[:, None]  # [B, T]
    mask = _policy_like_mask(B, T, seed=3) * real[:, 1:]  # no policy tokens on padding
    on = mask.bool()
    with torch.no_grad():
        full = score_tokens(model, ids)
        for chunk in (None, 2, 4):
            masked = score_tokens(model, ids, mask, lengths=torch.tensor(lengths), chunk=chunk)
            for f, m in zip(full, masked):
                torch.testing.assert_close(m[on], f[on], atol=1e-6, rtol=0)
                assert (m[~on] == 0).all()


def test_grammar_masked_scoring_is_the_renormalised_allowed_distribution():
    """With a grammar, a policy position's log-prob is the log-softmax over the allowed tokens only."""
    from agents.decoding.grammar import CallGrammar
    from bugfix_gym import CALLS, build_tokenizer

    tok = build_tokenizer()
    grammar = CallGrammar(tok, CALLS)
    model = _model(seed=8)
    model = TinyAgent(TinyAgentConfig(vocab_size=tok.vocab_size)).eval()
    edit, op = tok.encode("edit fix_init")
    ids = torch.tensor([[5, 9, edit, op, tok.eoc_id]])  # prompt-ish tokens, then a call
    mask = torch.tensor([[0.0, 1.0, 1.0, 1.0]])
    states = torch.tensor([[-1, grammar.start, grammar.step(0, edit), grammar.step(grammar.step(0, edit), op)]])
    with torch.no_grad():
        logits, _ = model(ids)
        logp, _, ent = score_tokens(model, ids, mask, grammar=grammar, grammar_state=states)
    for t in (1, 2, 3):
        allowed = grammar.allowed[states[0, t]]
        ref = torch.log_softmax(logits[0, t].masked_fill(~allowed, float("-inf")), -1)
        torch.testing.assert_close(logp[0, t], ref[ids[0, t + 1]], atol=1e-5, rtol=0)
        p = ref.exp()
        torch.testing.assert_close(ent[0, t], -(p[allowed] * ref[allowed]).sum(), atol=1e-5, rtol=0)
    # after the op only <eoc> is legal: probability one, entropy zero
    assert abs(float(logp[0, 3])) < 1e-6 and abs(float(ent[0, 3])) < 1e-6
