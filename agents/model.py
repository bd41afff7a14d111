"""TinyAgent: a tiny decoder-only transformer with a policy (LM) head and a critic (value) head.

The policy reads one token sequence (prompt, then alternating policy and tool tokens) and
predicts the next token; the critic head gives ``V(ids[:t+1])`` at every position. Pre-LN
blocks, learned positions, tied LM head, no dropout (dropout would make the first PPO ratio
differ from 1). ``KVCache`` + :meth:`TinyAgent.extend` decode incrementally with per-row
lengths, so a batch of episodes of different lengths can be sampled in lockstep.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from .grammar import mask_logits


@dataclass
class TinyAgentConfig:
    """TinyAgent sizes. The defaults give ~148k parameters for the 229-word default vocabulary.

    :param vocab_size: number of token ids (``tok.vocab_size``)
    :param d_model: width of the residual stream
    :param n_layer: number of transformer blocks
    :param n_head: attention heads (``d_model`` must be divisible by it)
    :param d_ff: hidden width of each block's MLP
    :param max_len: longest sequence (learned positions; the KV cache holds this many tokens)
    :param bias: biases in linear layers
    :param value_init_std: std of the value head's weight at init (near zero: the critic starts at ~0)
    """

    vocab_size: int = 229
    d_model: int = 64
    n_layer: int = 2
    n_head: int = 4
    d_ff: int = 256
    max_len: int = 512
    bias: bool = True
    value_init_std: float = 1e-3


class KVCache:
    """Keys and values of every layer for ``batch_size`` rows, each row with its own length.

    ``k, v``: [n_layer, B, n_head, capacity, head_dim]; ``lengths`` [B]: tokens held per row.
    The capacity starts small and doubles (up to ``max_len``) as rows grow, so a batch of short
    episodes does not zero a full ``max_len`` cache. Positions at or beyond a row's length hold
    zeros or stale keys and are never read as valid.
    """

    def __init__(self, config: TinyAgentConfig, batch_size: int, device=None, dtype=torch.float32,
                 capacity: int = 256, buffers: tuple[torch.Tensor, torch.Tensor] | None = None):
        hs = config.d_model // config.n_head
        self.max_len = config.max_len
        cap = min(capacity, config.max_len)
        shape = (config.n_layer, batch_size, config.n_head, cap, hs)
        if buffers is not None and buffers[0].shape[:3] + buffers[0].shape[4:] == shape[:3] + shape[4:] \
                and buffers[0].shape == buffers[1].shape and buffers[0].shape[3] <= config.max_len \
                and buffers[0].dtype == dtype:
            # reuse a finished cache's memory (zeroing warm memory is ~8x cheaper than fresh zeros)
            self.k, self.v = buffers[0].zero_(), buffers[1].zero_()  # [L, B, nh, cap, hs]
        else:
            self.k = torch.zeros(shape, device=device, dtype=dtype)  # [L, B, nh, cap, hs]
            self.v = torch.zeros(shape, device=device, dtype=dtype)  # [L, B, nh, cap, hs]
        self.lengths = torch.zeros(batch_size, dtype=torch.long, device=device)  # [B]

    @property
    def batch_size(self) -> int:
        return self.lengths.shape[0]

    def reserve(self, n: int) -> None:
        """Make room for ``n`` positions per row (doubling the capacity, at most ``max_len``)."""
        cap = self.k.shape[3]
        if n <= cap:
            return
        new_cap = cap
        while new_cap < n:
            new_cap *= 2
        new_cap = min(max(new_cap, n), self.max_len)
        shape = self.k.shape[:3] + (new_cap,) + self.k.shape[4:]
        k = self.k.new_zeros(shape)
        v = self.v.new_zeros(shape)
        k[:, :, :, :cap] = self.k
        v[:, :, :, :cap] = self.v
        self.k, self.v = k, v


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention with an optional KV cache."""

    def __init__(self, config: TinyAgentConfig):
        super().__init__()
        if config.d_model % config.n_head:
            raise ValueError(f"d_model ({config.d_model}) must be divisible by n_head ({config.n_head})")
        self.n_head, self.hs = config.n_head, config.d_model // config.n_head
        self.qkv = nn.Linear(config.d_model, 3 * config.d_model, bias=config.bias)
        self.proj = nn.Linear(config.d_model, config.d_model, bias=config.bias)

    def forward(self, x: torch.Tensor, cache: KVCache | None = None, layer: int = 0,
                write: tuple[torch.Tensor, ...] | None = None, attn_mask: torch.Tensor | None = None,
                n_keys: int = 0, cache_rows: torch.Tensor | None = None) -> torch.Tensor:
        B, S, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)  # 3 x [B, S, C]
        q = q.view(B, S, self.n_head, self.hs).transpose(1, 2)  # [B, nh, S, hs]
        k = k.view(B, S, self.n_head, self.hs)  # [B, S, nh, hs]
        v = v.view(B, S, self.n_head, self.hs)  # [B, S, nh, hs]
        if cache is None:
            y = F.scaled_dot_product_attention(q, k.transpose(1, 2), v.transpose(1, 2), is_causal=True)  # [B, nh, S, hs]
        else:
            rows, local, steps, pos = write  # valid new tokens: cache row, row in x, index in chunk, position
            cache.k[layer, rows, :, pos] = k[local, steps]  # [N, nh, hs] into the cache
            cache.v[layer, rows, :, pos] = v[local, steps]  # [N, nh, hs]
            if cache_rows is None:
                keys = cache.k[layer, :, :, :n_keys]  # [B, nh, P, hs]
                vals = cache.v[layer, :, :, :n_keys]  # [B, nh, P, hs]
            else:  # only the rows being run
                keys = cache.k[layer, cache_rows, :, :n_keys]  # [B, nh, P, hs]
                vals = cache.v[layer, cache_rows, :, :n_keys]  # [B, nh, P, hs]
            y = F.scaled_dot_product_attention(q, keys, vals, attn_mask=attn_mask)  # [B, nh, S, hs]
        y = y.transpose(1, 2).reshape(B, S, C)  # [B, S, C]
        return self.proj(y)


class Block(nn.Module):
    """Pre-LN transformer block: ``x + attn(ln(x))``, then ``x + mlp(ln(x))``."""

    def __init__(self, config: TinyAgentConfig):
        super().__init__()
        self.ln1 = nn.LayerNorm(config.d_model)
        self.attn = CausalSelfAttention(config)
        self.ln2 = nn.LayerNorm(config.d_model)
        self.mlp = nn.Sequential(nn.Linear(config.d_model, config.d_ff, bias=config.bias), nn.GELU(),
                                 nn.Linear(config.d_ff, config.d_model, bias=config.bias))

    def forward(self, x: torch.Tensor, **attn_kwargs) -> torch.Tensor:
        x = x + self.attn(self.ln1(x), **attn_kwargs)
        return x + self.mlp(self.ln2(x))


class TinyAgent(nn.Module):
    """Decoder-only transformer policy with a scalar critic head.

    :param config: a :class:`TinyAgentConfig`, or just the vocabulary size (book style:
        ``TinyAgent(tok.vocab_size)``) for the default sizes
    """

    def __init__(self, config: TinyAgentConfig | int):
        super().__init__()
        if isinstance(config, int):
            config = TinyAgentConfig(vocab_size=config)
        self.config = config
        self.tok_emb = nn.Embedding(config.vocab_size, config.d_model)
        self.pos_emb = nn.Embedding(config.max_len, config.d_model)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.ln_f = nn.LayerNorm(config.d_model)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self.value_head = nn.Linear(config.d_model, 1)
        self.apply(self._init_weights)
        for name, p in self.named_parameters():  # GPT-2: scale residual projections by depth
            if name.endswith("attn.proj.weight") or name.endswith("mlp.2.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))
        self.lm_head.weight = self.tok_emb.weight  # tied: the policy head reuses the embedding
        nn.init.normal_(self.value_head.weight, std=config.value_init_std)  # critic starts near zero
        nn.init.zeros_(self.value_head.bias)

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if getattr(module, "bias", None) is not None:
                nn.init.zeros_(module.bias)

    def num_params(self) -> int:
        """Number of distinct parameters (the tied head counted once)."""
        return sum(p.numel() for p in self.parameters())

    def embed(self, ids: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """Token + position embeddings: ids, pos [B, T] -> [B, T, C]."""
        return self.tok_emb(ids) + self.pos_emb(pos)

    def heads(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Final hidden states [B, T, C] -> (logits [B, T, V], values [B, T])."""
        h = self.ln_f(h)
        return self.lm_head(h), self.value_head(h).squeeze(-1)

    def trunk(self, ids: torch.Tensor) -> torch.Tensor:
        """Embeddings and blocks of a full causal pass: ids [B, T] -> hidden states [B, T, C] (before ln_f)."""
        B, T = ids.shape
        if T > self.config.max_len:
            raise ValueError(f"sequence of {T} tokens is longer than max_len={self.config.max_len}; "
                             "raise TinyAgentConfig.max_len")
        pos = torch.arange(T, device=ids.device).expand(B, T)  # [B, T]
        x = self.embed(ids, pos)  # [B, T, C]
        for block in self.blocks:
            x = block(x)
        return x

    def forward(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Full causal forward: ids [B, T] -> (logits [B, T, V], values [B, T]).

        Right padding never changes earlier positions (causal attention), so no mask is needed.
        """
        return self.heads(self.trunk(ids))

    # ------------------------------------------------------------------ incremental decoding
    def new_cache(self, batch_size: int, buffers: tuple[torch.Tensor, torch.Tensor] | None = None) -> KVCache:
        """An empty KV cache for ``batch_size`` rows.

        :param buffers: optional ``(k, v)`` of a cache that is no longer used, zeroed and reused
            if their shapes fit (else ignored)
        """
        p = self.tok_emb.weight
        return KVCache(self.config, batch_size, device=p.device, dtype=p.dtype, buffers=buffers)

    @torch.no_grad()
    def extend(self, ids: torch.Tensor, n_new: torch.Tensor, cache: KVCache,
               last_only: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        """Append a right-padded chunk of new tokens to each row of ``cache`` and run them.

        Only the valid new tokens are computed, packed into one ``[N, C]`` batch (no padding) for
        every per-token op; attention runs per group of rows (rows feeding one token, rows
        feeding several), each key masked per row (``key <= position``), so rows of different
        lengths share one call.

        :param ids: [B, S] new tokens; row ``b`` uses its first ``n_new[b]`` (0 = row idle)
        :param n_new: [B] long, number of valid new tokens per row
        :param cache: the rows' KV cache; its ``lengths`` advance by ``n_new``
        :param last_only: return logits only at each row's last new token
        :return: ``(logits [B, V] or [B, S, V], values [B, S])``; entries past ``n_new`` (and of
            idle rows) are zero
        """
        B, S = ids.shape
        dev = ids.device
        n_list = n_new.tolist()
        start_list = cache.lengths.tolist()
        end_list = [a + n for a, n in zip(start_list, n_list)]
        max_end = max(end_list) if end_list else 0
        if max_end > cache.max_len:
            raise ValueError(f"KV cache overflow: a row needs {max_end} positions, max_len={cache.max_len}")
        V = self.config.vocab_size
        dtype = self.tok_emb.weight.dtype
        values = torch.zeros(B, S, device=dev, dtype=dtype)  # [B, S]
        logits = torch.zeros((B, V) if last_only else (B, S, V), device=dev, dtype=dtype)
        active = [b for b in range(B) if n_list[b] > 0]
        if not active:
            return logits, values
        cache.reserve(max_end)
        # packed valid tokens, row-major: token i is (row_of[i], col[i]) at position pos[i]
        row_list, col_list, pos_list = [], [], []
        singles, multis = [], []  # rows feeding one token / several (attention groups)
        for b in active:
            n = n_list[b]
            row_list += [b] * n
            col_list += range(n)
            pos_list += range(start_list[b], start_list[b] + n)
            (singles if n == 1 else multis).append(b)
        N = len(row_list)
        row_of = torch.tensor(row_list, device=dev)  # [N]
        col = torch.tensor(col_list, device=dev)  # [N]
        pos = torch.tensor(pos_list, device=dev)  # [N]
        offsets, acc = {}, 0
        for b in active:
            offsets[b] = acc
            acc += n_list[b]
        # attention groups: rows feeding one token, rows feeding several. A group holding most
        # rows attends over all B rows of the cache (a view: no gather copy of the keys); the
        # other rows get dummy queries that see only keys <= their column, and are dropped.
        groups = []  # (cache rows or None for all, packed index or None, q row, q col, R, S_g, P_g, mask)
        for grp in (singles, multis):
            if not grp:
                continue
            P_g = max(end_list[b] for b in grp)
            S_g = max(n_list[b] for b in grp)
            # one token per row: attending over all rows costs about what gathering the group's
            # keys does; several tokens per row: only when nearly every row is in the group
            full = 2 * len(grp) > B if grp is singles else 8 * len(grp) >= 7 * B
            R = B if full else len(grp)
            q_start = [0] * R
            idx_l, row_l, col_l = [], [], []
            for r, b in enumerate(grp):
                n, rq = n_list[b], (b if full else r)
                q_start[rq] = start_list[b]
                idx_l += range(offsets[b], offsets[b] + n)
                row_l += [rq] * n
                col_l += range(n)
            q_pos = torch.tensor(q_start, device=dev)[:, None] + torch.arange(S_g, device=dev)  # [R, S]
            mask = (torch.arange(P_g, device=dev) <= q_pos[:, :, None])[:, None]  # [R, 1, S, P]
            idx = None if len(idx_l) == N else torch.tensor(idx_l, device=dev)
            # with one token per row, rows in the group's order, the queries need no scatter
            direct = S_g == 1 and not full
            groups.append((None if full else torch.tensor(grp, device=dev), idx,
                           None if direct else torch.tensor(row_l, device=dev),
                           None if direct else torch.tensor(col_l, device=dev), R, S_g, P_g, mask))
        x = self.embed(ids[row_of, col], pos)  # [N, C]
        C = x.shape[-1]
        for layer, block in enumerate(self.blocks):
            attn = block.attn
            nh, hs = attn.n_head, attn.hs
            q, k, v = attn.qkv(block.ln1(x)).split(C, dim=-1)  # 3 x [N, C]
            cache.k[layer, row_of, :, pos] = k.view(N, nh, hs)  # [N, nh, hs] into the cache
            cache.v[layer, row_of, :, pos] = v.view(N, nh, hs)
            y = q.new_empty(N, C) if len(groups) > 1 else None
            for rows_t, idx, qr, qc, R, S_g, P_g, mask in groups:
                if rows_t is None:
                    kk, vv = cache.k[layer, :, :, :P_g], cache.v[layer, :, :, :P_g]  # [B, nh, P, hs] views
                else:
                    kk, vv = cache.k[layer, rows_t, :, :P_g], cache.v[layer, rows_t, :, :P_g]  # [R, nh, P, hs]
                qg = q if idx is None else q[idx]  # [n_g, C]
                if qr is None:  # one token per row, in order
                    qp = qg.view(R, 1, nh, hs).transpose(1, 2)  # [R, nh, 1, hs]
                else:
                    qp = qg.new_zeros(R, S_g, C)
                    qp[qr, qc] = qg
                    qp = qp.view(R, S_g, nh, hs).transpose(1, 2)  # [R, nh, S, hs]
                yg = F.scaled_dot_product_attention(qp, kk, vv, attn_mask=mask)  # [R, nh, S, hs]
                yg = yg.transpose(1, 2).reshape(R, S_g, C)  # [R, S, C]
                yg = yg.view(R, C) if qr is None else yg[qr, qc]  # [n_g, C]
                if y is None:
                    y = yg
                else:
                    y[slice(None) if idx is None else idx] = yg
            x = x + attn.proj(y)
            x = x + block.mlp(block.ln2(x))
        cache.lengths = torch.tensor(end_list, device=dev)
        h = self.ln_f(x)  # [N, C]
        values[row_of, col] = self.value_head(h).squeeze(-1)
        if last_only:
            last = torch.tensor([offsets[b] + n_list[b] - 1 for b in active], device=dev)  # [R]
            logits[torch.tensor(active, device=dev)] = self.lm_head(h[last])  # [R, V]
        else:
            logits[row_of, col] = self.lm_head(h)  # [N, V]
        return logits, values


def sequence_log_probs(model: TinyAgent, ids: torch.Tensor) -> torch.Tensor:
    """Log-prob of each next token: ids [B, T] -> logp [B, T-1], ``logp[t] = log pi(ids[t+1] | ids[:t+1])``."""
    logits, _ = model(ids)  # [B, T, V]
    logp = F.log_softmax(logits[:, :-1].float(), dim=-1)  # [B, T-1, V]
    return logp.gather(-1, ids[:, 1:, None]).squeeze(-1)  # [B, T-1]


def sequence_logp_values_entropy(model: TinyAgent, ids: torch.Tensor, mask: torch.Tensor | None = None,
                                 grammar_state: torch.Tensor | None = None, allowed: torch.Tensor | None = None
                                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One forward -> (logp [B, T-1], values [B, T-1], entropy [B, T-1]), aligned with ``ids[1:]``.

    ``values[t] = V(ids[:t+1])``; ``entropy[t]`` is the entropy of the next-token distribution at ``t``.

    :param mask: optional [B, T-1] (bool or 0/1), aligned with the outputs. When given, the trunk
        still runs over every position (attention needs them all) but the final norm, LM head,
        log-softmax, entropy and value head run only where ``mask`` is set; the outputs are
        zero elsewhere and equal the unmasked path where it is set. PPO's losses read only
        policy positions (~10% of a BugFix episode), so this skips most of the head's cost.
    :param grammar_state: optional [B, T-1] long call-grammar state of each position (``-1``: none),
        with ``allowed`` ([S, V] bool, :attr:`agents.grammar.CallGrammar.allowed`): the logits are
        masked to the grammar where a state is given, so logp and entropy are those of the masked
        distribution the constrained sampler drew from
    """
    if (grammar_state is None) != (allowed is None):
        raise ValueError("grammar_state and allowed go together (both or neither)")
    if mask is None:
        logits, values = model(ids)  # [B, T, V], [B, T]
        logits = logits[:, :-1].float()  # [B, T-1, V]
        if allowed is not None:
            logits = mask_logits(logits, grammar_state, allowed)
        logp_all = F.log_softmax(logits, dim=-1)  # [B, T-1, V]
        logp = logp_all.gather(-1, ids[:, 1:, None]).squeeze(-1)  # [B, T-1]
        entropy = -(logp_all.exp() * logp_all).sum(-1)  # [B, T-1]
        return logp, values[:, :-1], entropy
    B, T = ids.shape
    if mask.shape != (B, T - 1):
        raise ValueError(f"mask must be [B, T-1] = {[B, T - 1]}, got {list(mask.shape)}")
    x = model.trunk(ids)  # [B, T, C]
    where = mask.bool()  # [B, T-1]
    h = model.ln_f(x[:, :-1][where])  # [N, C] hidden states at the masked positions
    logits = model.lm_head(h).float()  # [N, V]
    if allowed is not None:
        logits = mask_logits(logits, grammar_state[where], allowed)
    logp_all = F.log_softmax(logits, dim=-1)  # [N, V]
    targets = ids[:, 1:][where]  # [N]
    out_logp = logp_all.gather(-1, targets[:, None]).squeeze(-1)  # [N]
    out_ent = -(logp_all.exp() * logp_all).sum(-1)  # [N]
    out_v = model.value_head(h).squeeze(-1)  # [N]

    def scatter(v: torch.Tensor) -> torch.Tensor:  # [N] -> [B, T-1], zero off the mask
        return torch.zeros(B, T - 1, device=v.device, dtype=v.dtype).masked_scatter(where, v)

    return scatter(out_logp), scatter(out_v), scatter(out_ent)
