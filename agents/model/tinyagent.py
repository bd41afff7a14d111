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
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F


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
    zeros or stale keys and are never attended to.
    """

    def __init__(self, config: TinyAgentConfig, batch_size: int, device=None, dtype=torch.float32,
                 capacity: int = 256):
        hs = config.d_model // config.n_head
        self.max_len = config.max_len
        shape = (config.n_layer, batch_size, config.n_head, min(capacity, config.max_len), hs)
        self.k = torch.zeros(shape, device=device, dtype=dtype)  # [L, B, nh, cap, hs]
        self.v = torch.zeros(shape, device=device, dtype=dtype)  # [L, B, nh, cap, hs]
        self.lengths = torch.zeros(batch_size, dtype=torch.long, device=device)  # [B]

    @property
    def batch_size(self) -> int:
        return self.lengths.shape[0]

    def fits(self, config: TinyAgentConfig, batch_size: int, dtype: torch.dtype) -> bool:
        """Whether this cache can serve a model of ``config`` (weights of ``dtype``) over ``batch_size`` rows."""
        return self.k.shape[:3] == (config.n_layer, batch_size, config.n_head) and self.k.dtype == dtype \
            and self.max_len == config.max_len

    def reserve(self, n: int) -> None:
        """Make room for ``n`` positions per row (doubling the capacity, at most ``max_len``)."""
        cap = self.k.shape[3]
        if n <= cap:
            return
        new_cap = cap
        while new_cap < n:
            new_cap *= 2
        new_cap = min(max(new_cap, n), self.max_len)
        grow = self.k.shape[:3] + (new_cap - cap,) + self.k.shape[4:]
        self.k = torch.cat([self.k, self.k.new_zeros(grow)], dim=3)  # [L, B, nh, new_cap, hs]
        self.v = torch.cat([self.v, self.v.new_zeros(grow)], dim=3)


@dataclass
class _Group:
    """Rows of a packed chunk that attend together: their queries padded to ``[R, S]``.

    :param rows: cache rows read as keys, or None for all rows (a view, no copy)
    :param index: positions of the group's tokens in the packed chunk, or None for all of them
    :param q_row, q_col: where each of those tokens sits in the padded ``[R, S]`` queries, or None
        when the group is one token per row, in order (the queries need no scatter)
    :param n_rows, width, n_keys: R, S and the number of key positions P to read
    :param mask: [R, 1, S, P] bool, key ``j`` visible to query ``(r, s)`` iff ``j <= position`` (the first layer
        makes it additive: 0 or ``-inf``, in the model's dtype, for the other layers to reuse); None when
        every row of the group starts an empty row (a prompt): the mask is then plain causal (``is_causal``)
    """

    rows: torch.Tensor | None
    index: torch.Tensor | None
    q_row: torch.Tensor | None
    q_col: torch.Tensor | None
    n_rows: int
    width: int
    n_keys: int
    mask: torch.Tensor | None


@dataclass
class Packing:
    """Where the valid tokens of a right-padded chunk ``[B, S]`` (row ``b`` feeding ``n_new[b]``) go:
    packed row-major into ``[N]``, with their cache row, column in the chunk and position, and the
    attention groups (rows feeding one token, rows feeding several)."""

    rows: torch.Tensor  # [N] cache row of each packed token
    cols: torch.Tensor  # [N] its column in the chunk
    pos: torch.Tensor  # [N] its position in its row
    ends: torch.Tensor  # [B] the rows' lengths after the chunk
    last: torch.Tensor  # [R] packed index of each active row's last token
    active: torch.Tensor  # [R] the rows that feed at least one token
    groups: list[_Group]

    @classmethod
    def build(cls, n_new: list[int], start: list[int], device: torch.device) -> "Packing":
        B = len(n_new)
        row_l: list[int] = []
        col_l: list[int] = []
        pos_l: list[int] = []
        offsets: dict[int, int] = {}
        for b in range(B):
            if n_new[b]:
                offsets[b] = len(row_l)
                row_l += [b] * n_new[b]
                col_l += range(n_new[b])
                pos_l += range(start[b], start[b] + n_new[b])
        active = list(offsets)
        singles = [b for b in active if n_new[b] == 1]
        groups = [cls._group(singles, B, len(row_l), n_new, start, offsets, device, one=True)] if singles else []
        groups += [cls._group(g, B, len(row_l), n_new, start, offsets, device, one=False)
                   for g in _similar_rows([b for b in active if n_new[b] > 1], n_new, start)]
        rows, cols, pos, ends, last, act = _long_tensors(
            device, row_l, col_l, pos_l, [a + n for a, n in zip(start, n_new)],
            [offsets[b] + n_new[b] - 1 for b in active], active)
        return cls(rows=rows, cols=cols, pos=pos, ends=ends, last=last, active=act, groups=groups)

    @staticmethod
    def _group(grp: list[int], B: int, N: int, n_new: list[int], start: list[int], offsets: dict[int, int],
               device: torch.device, one: bool) -> _Group:
        # a group holding most rows attends over all B rows of the cache (a view: no copy of the
        # keys); the other rows then get dummy queries that see key 0 only, and are dropped: for short
        # feeds (one token, or a few forced ones) they cost less than copying the group's keys
        width = max(n_new[b] for b in grp)
        full = (B - len(grp)) * width <= 2 * len(grp) or (not one and 8 * len(grp) >= 7 * B)
        R = B if full else len(grp)
        q_start = [0] * R
        index: list[int] = []
        q_row: list[int] = []
        q_col: list[int] = []
        for r, b in enumerate(grp):
            rq = b if full else r
            q_start[rq] = start[b]
            index += range(offsets[b], offsets[b] + n_new[b])
            q_row += [rq] * n_new[b]
            q_col += range(n_new[b])
        n_keys = max(start[b] + n_new[b] for b in grp)
        direct = one and not full  # one token per row, rows in order: the queries are the packed tokens
        starts, rows, idx, qr, qc = _long_tensors(device, q_start, grp, index, q_row, q_col)
        keys = torch.arange(max(n_keys, width), device=device)
        q_pos = starts[:, None] + keys[:width]  # [R, S]
        mask: torch.Tensor | None = (keys[:n_keys] <= q_pos[:, :, None])[:, None]  # [R, 1, S, P]
        if not one and not full and not any(start[b] for b in grp):  # queries at 0..S-1 and P == S
            mask = None
        return _Group(rows=None if full else rows, index=None if len(index) == N else idx,
                      q_row=None if direct else qr, q_col=None if direct else qc,
                      n_rows=R, width=width, n_keys=n_keys, mask=mask)


def _similar_rows(rows: list[int], n_new: list[int], start: list[int], waste: float = 1.25) -> list[list[int]]:
    """``rows`` (each feeding several tokens) split into attention groups whose padded queries and keys cost
    at most ``waste`` times what the rows need on their own: a group pads its rows to its widest feed and
    longest row, so a prefill of one long tool output next to a few forced tokens would otherwise run every
    row at the longest width. Rows are taken widest first; a group ends when the next row would pass the limit."""
    groups: list[list[int]] = []
    need = width = keys = 0
    for b in sorted(rows, key=lambda r: (-n_new[r], -(start[r] + n_new[r]), r)):
        own = n_new[b] * (start[b] + n_new[b])  # query-key pairs of the row alone
        grown = (len(groups[-1]) + 1) * width * max(keys, start[b] + n_new[b]) if groups else 0
        if groups and grown <= waste * (need + own):
            groups[-1].append(b)
            need, keys = need + own, max(keys, start[b] + n_new[b])
        else:
            groups.append([b])
            need, width, keys = own, n_new[b], start[b] + n_new[b]
    return [sorted(g) for g in groups]


@dataclass
class Continuations:
    """``K`` continuations of ``S`` tokens after each of ``R`` cached rows, read against the cache
    without writing to it (:meth:`TinyAgent.peek`): each continuation attends to its row's cached
    tokens and to its own earlier tokens.

    :param rows: [R] the cache rows continued
    :param start: [R] their cached lengths (the continuations' first position)
    :param seen: [R, 1, 1, 1, P] bool, cached key ``j`` is the row's (``j < start``)
    :param causal: [S, S] bool, a continuation's token sees its own earlier tokens
    """

    rows: torch.Tensor
    start: torch.Tensor
    seen: torch.Tensor
    causal: torch.Tensor

    @classmethod
    def build(cls, rows: torch.Tensor, cache: "KVCache", width: int) -> "Continuations":
        start = cache.lengths[rows]  # [R]
        n_keys = int(start.max())
        if n_keys + width > cache.max_len:
            raise ValueError(f"KV cache overflow: a continuation needs {n_keys + width} positions, "
                             f"max_len={cache.max_len}")
        seen = (torch.arange(n_keys, device=rows.device) < start[:, None])[:, None, None, None, :]  # [R, 1, 1, 1, P]
        causal = torch.ones(width, width, dtype=torch.bool, device=rows.device).tril()  # [S, S]
        return cls(rows=rows, start=start, seen=seen, causal=causal)

    @property
    def n_keys(self) -> int:
        """P: the cached positions read (the longest row's)."""
        return self.seen.shape[-1]


def _long_tensors(device: torch.device, *lists: list[int]) -> tuple[torch.Tensor, ...]:
    """Several int lists -> long tensors, made with one ``torch.tensor`` call (each is a view)."""
    flat = torch.tensor([x for lst in lists for x in lst], dtype=torch.long, device=device)
    return tuple(torch.split(flat, [len(lst) for lst in lists]))


def _repeated_starts(ids: torch.Tensor, counts: list[int], start: list[int]) -> dict[int, int]:
    """Rows of a chunk that start an empty cache row with the same tokens as an earlier row (the same
    prompt on several envs): ``{row: the earlier row}``. Their keys, values and outputs are the earlier
    row's, so :meth:`TinyAgent.extend` runs each such prompt once."""
    first: dict[tuple[int, ...], int] = {}
    copies: dict[int, int] = {}
    for b in [b for b in range(len(counts)) if counts[b] > 1 and start[b] == 0]:
        key = tuple(ids[b, : counts[b]].tolist())
        copies[b] = first.setdefault(key, b)
    return {b: a for b, a in copies.items() if a != b}


def _copy_rows(copies: dict[int, int], cache: "KVCache", logits: torch.Tensor, values: torch.Tensor) -> None:
    """Give each row of ``copies`` the keys, values, length and outputs of its earlier row (``copies``:
    row -> earlier row, as :func:`_repeated_starts` found them)."""
    dst = torch.tensor(list(copies), dtype=torch.long, device=values.device)
    src = torch.tensor(list(copies.values()), dtype=torch.long, device=values.device)
    n = int(cache.lengths[src].max())
    cache.k[:, dst, :, :n] = cache.k[:, src, :, :n]
    cache.v[:, dst, :, :n] = cache.v[:, src, :, :n]
    cache.lengths[dst] = cache.lengths[src]
    logits[dst] = logits[src]
    values[dst] = values[src]


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention, over a full sequence or over a KV cache."""

    def __init__(self, config: TinyAgentConfig):
        super().__init__()
        if config.d_model % config.n_head:
            raise ValueError(f"d_model ({config.d_model}) must be divisible by n_head ({config.n_head})")
        self.n_head, self.hs = config.n_head, config.d_model // config.n_head
        self.qkv = nn.Linear(config.d_model, 3 * config.d_model, bias=config.bias)
        self.proj = nn.Linear(config.d_model, config.d_model, bias=config.bias)

    def forward(self, x: torch.Tensor, cache: KVCache | None = None, layer: int = 0,
                packing: Packing | Continuations | None = None) -> torch.Tensor:
        """Full causal attention over ``x`` [B, T, C]. With a cache and a :class:`Packing`, ``x`` is the
        packed new tokens [N, C]: their keys and values go into the cache, their queries attend to it.
        With :class:`Continuations`, ``x`` is [R, K, S, C]: each continuation attends to its row's cache
        (read only) and to itself."""
        if isinstance(packing, Continuations):
            assert cache is not None
            return self.proj(self._attend_continuations(x, cache, layer, packing))
        if cache is not None:
            assert packing is not None
            return self.proj(self._attend_cached(x, cache, layer, packing))
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)  # 3 x [B, T, C]
        q = q.view(B, T, self.n_head, self.hs).transpose(1, 2)  # [B, nh, T, hs]
        k = k.view(B, T, self.n_head, self.hs).transpose(1, 2)  # [B, nh, T, hs]
        v = v.view(B, T, self.n_head, self.hs).transpose(1, 2)  # [B, nh, T, hs]
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # [B, nh, T, hs]
        return self.proj(y.transpose(1, 2).reshape(B, T, C))  # [B, T, C]

    def _attend_cached(self, x: torch.Tensor, cache: KVCache, layer: int, packing: Packing) -> torch.Tensor:
        N, C = x.shape
        nh, hs = self.n_head, self.hs
        q, k, v = self.qkv(x).split(C, dim=-1)  # 3 x [N, C]
        cache.k[layer, packing.rows, :, packing.pos] = k.view(N, nh, hs)  # [N, nh, hs] into the cache
        cache.v[layer, packing.rows, :, packing.pos] = v.view(N, nh, hs)
        y = q.new_empty(N, C) if len(packing.groups) > 1 else None
        for g in packing.groups:
            if g.mask is not None and g.mask.dtype == torch.bool:  # additive, as SDPA would make it: once per call
                g.mask = torch.zeros(g.mask.shape, dtype=q.dtype, device=q.device).masked_fill_(~g.mask, float("-inf"))
            if g.rows is None:
                keys, vals = cache.k[layer, :, :, :g.n_keys], cache.v[layer, :, :, :g.n_keys]  # [B, nh, P, hs] views
            else:
                keys = cache.k[layer, g.rows, :, :g.n_keys]  # [R, nh, P, hs]
                vals = cache.v[layer, g.rows, :, :g.n_keys]  # [R, nh, P, hs]
            qg = q if g.index is None else q[g.index]  # [n_g, C]
            if g.q_row is None:  # one token per row, in order
                qp = qg.view(g.n_rows, 1, nh, hs).transpose(1, 2)  # [R, nh, 1, hs]
            else:
                qp = qg.new_zeros(g.n_rows, g.width, C)  # [R, S, C]
                qp[g.q_row, g.q_col] = qg
                qp = qp.view(g.n_rows, g.width, nh, hs).transpose(1, 2)  # [R, nh, S, hs]
            yg = F.scaled_dot_product_attention(qp, keys, vals, attn_mask=g.mask,
                                                is_causal=g.mask is None)  # [R, nh, S, hs]
            yg = yg.transpose(1, 2).reshape(g.n_rows, g.width, C)  # [R, S, C]
            yg = yg.view(g.n_rows, C) if g.q_row is None else yg[g.q_row, g.q_col]  # [n_g, C]
            if y is None:
                y = yg
            else:
                y[slice(None) if g.index is None else g.index] = yg
        assert y is not None
        return y

    def _attend_continuations(self, x: torch.Tensor, cache: KVCache, layer: int, cont: Continuations) -> torch.Tensor:
        R, K, S, C = x.shape
        nh, hs, P = self.n_head, self.hs, cont.n_keys
        q, k, v = self.qkv(x).split(C, dim=-1)  # 3 x [R, K, S, C]
        q, k, v = (t.view(R, K, S, nh, hs).permute(0, 3, 1, 2, 4) for t in (q, k, v))  # [R, nh, K, S, hs]
        keys, vals = cache.k[layer, cont.rows, :, :P], cache.v[layer, cont.rows, :, :P]  # [R, nh, P, hs]
        scale = 1.0 / math.sqrt(hs)
        to_cache = torch.einsum("rhksd,rhpd->rhksp", q, keys) * scale  # [R, nh, K, S, P]
        to_self = torch.einsum("rhksd,rhktd->rhkst", q, k) * scale  # [R, nh, K, S, S]
        to_cache = to_cache.masked_fill(~cont.seen, float("-inf"))
        to_self = to_self.masked_fill(~cont.causal, float("-inf"))
        w = torch.softmax(torch.cat([to_cache, to_self], dim=-1), dim=-1)  # [R, nh, K, S, P + S]
        y = torch.einsum("rhksp,rhpd->rhksd", w[..., :P], vals) + torch.einsum("rhkst,rhktd->rhksd", w[..., P:], v)
        return y.permute(0, 2, 3, 1, 4).reshape(R, K, S, C)  # [R, K, S, C]


class MLP(nn.Module):
    """The block's feed-forward network: ``proj(gelu(fc(x)))``."""

    def __init__(self, config: TinyAgentConfig):
        super().__init__()
        self.fc = nn.Linear(config.d_model, config.d_ff, bias=config.bias)
        self.proj = nn.Linear(config.d_ff, config.d_model, bias=config.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.gelu(self.fc(x)))


class Block(nn.Module):
    """Pre-LN transformer block: ``x + attn(ln(x))``, then ``x + mlp(ln(x))``."""

    def __init__(self, config: TinyAgentConfig):
        super().__init__()
        self.ln1 = nn.LayerNorm(config.d_model)
        self.attn = CausalSelfAttention(config)
        self.ln2 = nn.LayerNorm(config.d_model)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor, cache: KVCache | None = None, layer: int = 0,
                packing: Packing | Continuations | None = None) -> torch.Tensor:
        x = x + self.attn(self.ln1(x), cache, layer, packing)
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
        for block in self.blocks:  # GPT-2: scale the residual projections by depth
            assert isinstance(block, Block)
            for proj in (block.attn.proj, block.mlp.proj):
                nn.init.normal_(proj.weight, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))
        self.lm_head.weight = self.tok_emb.weight  # tied: the policy head reuses the embedding
        nn.init.normal_(self.value_head.weight, std=config.value_init_std)  # critic starts near zero
        nn.init.zeros_(self.value_head.bias)

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            bias = getattr(module, "bias", None)
            if bias is not None:
                nn.init.zeros_(bias)

    def num_params(self) -> int:
        """Number of distinct parameters (the tied head counted once)."""
        return sum(p.numel() for p in self.parameters())

    def embed(self, ids: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """Token + position embeddings: ids, pos [...] -> [..., C]."""
        return self.tok_emb(ids) + self.pos_emb(pos)

    def trunk(self, ids: torch.Tensor) -> torch.Tensor:
        """Embeddings and blocks of a full causal pass: ids [B, T] -> hidden states [B, T, C] (before ln_f)."""
        B, T = ids.shape
        if T > self.config.max_len:
            raise ValueError(f"sequence of {T} tokens is longer than max_len={self.config.max_len}; "
                             "raise TinyAgentConfig.max_len")
        x = self.embed(ids, torch.arange(T, device=ids.device).expand(B, T))  # [B, T, C]
        for block in self.blocks:
            x = block(x)
        return x

    def forward(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Full causal forward: ids [B, T] -> (logits [B, T, V], values [B, T]).

        Right padding never changes earlier positions (causal attention), so no mask is needed.
        """
        h = self.ln_f(self.trunk(ids))  # [B, T, C]
        return self.lm_head(h), self.value_head(h).squeeze(-1)

    # ------------------------------------------------------------------ incremental decoding
    def new_cache(self, batch_size: int) -> KVCache:
        """An empty KV cache for ``batch_size`` rows."""
        p = self.tok_emb.weight
        return KVCache(self.config, batch_size, device=p.device, dtype=p.dtype)

    @torch.no_grad()
    def extend(self, ids: torch.Tensor, n_new: torch.Tensor, cache: KVCache,
               last_only: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        """Append a right-padded chunk of new tokens to each row of ``cache`` and run them.

        Only the valid new tokens are computed, packed into one ``[N, C]`` batch (no padding) for
        every per-token op; attention reads each row's cached keys up to each token's position.

        :param ids: [B, S] new tokens; row ``b`` uses its first ``n_new[b]`` (0 = row idle)
        :param n_new: [B] long, number of valid new tokens per row
        :param cache: the rows' KV cache; its ``lengths`` advance by ``n_new``
        :param last_only: return logits only at each row's last new token
        :return: ``(logits [B, V] or [B, S, V], values [B, S])``; entries past ``n_new`` (and of
            idle rows) are zero
        """
        B, S = ids.shape
        start, counts = cache.lengths.tolist(), n_new.tolist()
        longest = max((a + n for a, n in zip(start, counts)), default=0)
        if longest > cache.max_len:
            raise ValueError(f"KV cache overflow: a row needs {longest} positions, max_len={cache.max_len}")
        V, dtype = self.config.vocab_size, self.tok_emb.weight.dtype
        values = ids.new_zeros((B, S), dtype=dtype)  # [B, S]
        logits = ids.new_zeros((B, V) if last_only else (B, S, V), dtype=dtype)
        if not any(counts):
            return logits, values
        cache.reserve(longest)
        copies = _repeated_starts(ids, counts, start)
        if copies:  # run each repeated row once, then copy its keys, values and outputs
            counts = [0 if b in copies else n for b, n in enumerate(counts)]
        packing = Packing.build(counts, start, ids.device)
        x = self.embed(ids[packing.rows, packing.cols], packing.pos)  # [N, C]
        for layer, block in enumerate(self.blocks):
            x = block(x, cache, layer, packing)
        cache.lengths = packing.ends
        h = self.ln_f(x)  # [N, C]
        values[packing.rows, packing.cols] = self.value_head(h).squeeze(-1)
        if last_only:
            logits[packing.active] = self.lm_head(h[packing.last])  # [R, V]
        else:
            logits[packing.rows, packing.cols] = self.lm_head(h)  # [N, V]
        if copies:
            _copy_rows(copies, cache, logits, values)
        return logits, values

    @torch.no_grad()
    def peek(self, rows: torch.Tensor, ids: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """Logits after each of ``K`` continuations of some cached rows, without changing the cache.

        Row ``rows[r]`` continues with ``ids[r, k]`` (``S`` tokens) after its cached tokens, for each
        ``k`` separately: every continuation attends to the row's cache and to its own earlier tokens,
        as if it had been fed. One pass for all of them; the cache's keys are read in place.

        :param rows: [R] long, cache rows
        :param ids: [R, K, S] continuations
        :param cache: the KV cache (read only)
        :return: logits [R, K, V] at each continuation's last token
        """
        S = ids.shape[2]
        cont = Continuations.build(rows, cache, S)
        x = self.embed(ids, cont.start[:, None, None] + torch.arange(S, device=ids.device))  # [R, K, S, C]
        for layer, block in enumerate(self.blocks):
            x = block(x, cache, layer, cont)  # the blocks' own path; attention reads the cache in place
        return self.lm_head(self.ln_f(x[:, :, -1]))  # [R, K, V]


def score_tokens(model: TinyAgent, ids: torch.Tensor, mask: torch.Tensor | None = None, *,
                 lengths: torch.Tensor | None = None, chunk: int | None = None, grammar: Any = None,
                 grammar_state: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Score a right-padded batch in one causal pass: ids [B, T] -> (logp, values, entropy), each [B, T-1].

    Aligned with the targets ``ids[1:]``: ``logp[t] = log pi(ids[t+1] | ids[:t+1])``,
    ``values[t] = V(ids[:t+1])``, ``entropy[t]`` the entropy of the next-token distribution at ``t``.
    Right padding never changes earlier positions (causal attention), so no attention mask is needed.

    :param model: the TinyAgent
    :param ids: [B, T] token ids, right-padded
    :param mask: optional [B, T-1] policy mask. The trunk still runs over every position (attention
        needs them all) but the final norm, LM head, log-softmax, entropy and value head run only
        where it is set; the outputs are zero elsewhere. The losses read only policy positions
        (a small share of an episode), so this skips most of the heads' cost.
    :param lengths: [B] real length of each row; with ``chunk``, rows run in length-sorted chunks
        of ``chunk`` rows, each trimmed to its own longest row (same result, far less padding)
    :param chunk: rows per chunk (None: one pass)
    :param grammar: an :class:`agents.decoding.grammar.CallGrammar`; with ``grammar_state`` [B, T-1] the
        logits at positions with a state >= 0 are masked to the tokens the grammar allowed there,
        so the scores are those of the distribution the sampler drew from (needs ``mask``)
    :param grammar_state: [B, T-1] grammar state of each position (-1: unconstrained)
    """
    B, T = ids.shape
    if chunk is not None and chunk < B and lengths is not None:
        return _score_in_chunks(model, ids, mask, lengths, chunk, grammar, grammar_state)
    if mask is None:
        if grammar is not None:
            raise ValueError("score_tokens with a grammar needs the policy mask")
        logits, values = model(ids)  # [B, T, V], [B, T]
        logp_all = F.log_softmax(logits[:, :-1].float(), dim=-1)  # [B, T-1, V]
        logp = logp_all.gather(-1, ids[:, 1:, None]).squeeze(-1)  # [B, T-1]
        entropy = -(logp_all.exp() * logp_all).sum(-1)  # [B, T-1]
        return logp, values[:, :-1], entropy
    if mask.shape != (B, T - 1):
        raise ValueError(f"mask must be [B, T-1] = {[B, T - 1]}, got {list(mask.shape)}")
    x = model.trunk(ids)  # [B, T, C]
    where = mask.bool()  # [B, T-1]
    h = model.ln_f(x[:, :-1][where])  # [N, C] hidden states at the masked positions
    logits = model.lm_head(h).float()  # [N, V]
    if grammar is not None and grammar_state is not None:
        logits = grammar.mask_logits(logits, grammar_state[where])
    logp_all = F.log_softmax(logits, dim=-1)  # [N, V]
    out_logp = logp_all.gather(-1, ids[:, 1:][where][:, None]).squeeze(-1)  # [N]
    p_all = logp_all.exp()
    out_ent = -(p_all * logp_all.masked_fill(p_all == 0, 0.0)).sum(-1)  # [N] (masked tokens: 0 * -inf -> 0)
    out_v = model.value_head(h).squeeze(-1)  # [N]

    def scatter(v: torch.Tensor) -> torch.Tensor:  # [N] -> [B, T-1], zero off the mask
        return torch.zeros(B, T - 1, device=v.device, dtype=v.dtype).masked_scatter(where, v)

    return scatter(out_logp), scatter(out_v), scatter(out_ent)


def _score_in_chunks(model: TinyAgent, ids: torch.Tensor, mask: torch.Tensor | None, lengths: torch.Tensor,
                     chunk: int, grammar: Any, grammar_state: torch.Tensor | None
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`score_tokens` over length-sorted chunks of ``chunk`` rows, each trimmed to its longest row,
    back in the batch's order: ids [B, T] -> (logp, values, entropy), each [B, T-1]."""
    B, T = ids.shape
    order = torch.argsort(lengths, descending=True)  # [B]
    parts: list[list[torch.Tensor]] = [[], [], []]
    for start in range(0, B, chunk):
        rows = order[start: start + chunk]
        L = max(int(lengths[rows].max()), 2)
        sub = (None if x is None else x[rows, : L - 1] for x in (mask, grammar_state))
        outs = score_tokens(model, ids[rows, :L], next(sub), grammar=grammar, grammar_state=next(sub))
        for part, out in zip(parts, outs):  # 3 x [c, L-1]
            part.append(F.pad(out, (0, T - L)))  # [c, T-1]
    inverse = torch.argsort(order)  # back to the batch's order
    return tuple(torch.cat(part)[inverse] for part in parts)  # type: ignore[return-value]


def sequence_log_probs(model: TinyAgent, ids: torch.Tensor) -> torch.Tensor:
    """Log-prob of each next token: ids [B, T] -> logp [B, T-1], ``logp[t] = log pi(ids[t+1] | ids[:t+1])``."""
    logits, _ = model(ids)  # [B, T, V]
    logp = F.log_softmax(logits[:, :-1].float(), dim=-1)  # [B, T-1, V]
    return logp.gather(-1, ids[:, 1:, None]).squeeze(-1)  # [B, T-1]
