"""HFAgent: any Hugging Face causal LM with a value head, behind TinyAgent's interface.

The sampler, the decoder, foresight and the losses call a handful of TinyAgent's members:
``forward(ids) -> (logits, values)``, ``trunk`` / ``ln_f`` / ``lm_head`` / ``value_head`` (for
:func:`agents.model.tinyagent.score_tokens`), ``new_cache`` / ``extend`` / ``peek`` (incremental
decoding with per-row lengths), ``config.max_len`` / ``config.vocab_size`` and ``tok_emb.weight``
(the device and dtype). :class:`HFAgent` provides exactly those around a ``transformers`` causal LM
(an ``AutoModelForCausalLM``: a base model giving the last hidden state, and an output embedding),
with a value head on the last hidden state as TRL's old ``AutoModelForCausalLMWithValueHead``.

Decoding uses the LM's own KV cache (``DynamicCache``). Rows of a batch grow by different numbers
of tokens, and a finished episode's row starts over, so :class:`HFCache` keeps one shared column
axis plus a per-row mask of the columns that row holds (right-padded chunks leave masked columns,
a restarted row masks its old ones); each token gets its own position id. When the longest row holds
less than half of the columns, every row's live columns move to the front.

Dropout never runs: :meth:`HFAgent.train` keeps the wrapped LM in eval mode, so sampling, the
frozen pi_old pass and the first update compute the same function and the first PPO ratio is
exactly 1 whatever the HF config's dropout (trlx#107 is that bug). Importing this module does not
import ``transformers``; building an LM from a config does, lazily.
"""

from __future__ import annotations

import inspect
import json
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn

#: the most bytes an HF config may take as JSON (a saved model's ``hf_config``)
MAX_CONFIG_BYTES = 64 * 1024


@dataclass
class HFAgentConfig:
    """What the sampler and the decoder read of a policy model's config.

    :param vocab_size: rows of the LM's output embedding (the tokenizer's ``vocab_size``)
    :param max_len: the longest sequence (the LM's ``max_position_embeddings``)
    """

    vocab_size: int
    max_len: int


class ValueHead(nn.Linear):
    """The critic: ``Linear(hidden, 1)`` on the LM's last hidden state, in its own dtype (float32)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x.to(self.weight.dtype))


class HFCache:
    """An HF ``DynamicCache`` for ``batch_size`` rows of different lengths.

    ``valid`` [B, P]: which of the cache's P columns each row attends to; ``lengths`` [B]: tokens per row
    (the next token's position). Setting a row's length to 0 (the sampler does, when an episode starts
    over) drops its columns at the next :meth:`HFAgent.extend`.

    :param past: an empty ``transformers.DynamicCache``
    :param batch_size: B, the rows
    :param max_len: the most positions a row may hold
    :param device: where the masks live (the model's device)
    """

    def __init__(self, past: Any, batch_size: int, max_len: int, device: torch.device):
        self.past = past
        self.max_len = max_len
        self.valid = torch.zeros(batch_size, 0, dtype=torch.bool, device=device)  # [B, P]
        self.lengths = torch.zeros(batch_size, dtype=torch.long, device=device)  # [B]

    @property
    def batch_size(self) -> int:
        return self.lengths.shape[0]

    def sync(self) -> None:
        """Forget the columns of rows whose length was set back to 0; compact when over half is dead."""
        held = self.valid.sum(1)  # [B]
        restarted = (self.lengths == 0) & (held > 0)
        if bool(restarted.any()):
            self.valid[restarted] = False
            held = self.valid.sum(1)
        if not bool((held == self.lengths).all()):
            raise ValueError("HFCache lengths may only be set back to 0 (a row starting over)")
        P = self.valid.shape[1]
        if P > 64 and 2 * int(held.max()) < P:
            self.compact(held)

    def compact(self, held: torch.Tensor) -> None:
        """Move each row's live columns to the front: [B, P] -> [B, max(held)]."""
        width = int(held.max())
        order = torch.argsort((~self.valid).to(torch.int8), dim=1, stable=True)[:, :width]  # [B, P']: live first
        for layer in self.past.layers:
            idx = order[:, None, :, None].expand(-1, layer.keys.shape[1], -1, layer.keys.shape[3])
            layer.keys = layer.keys.gather(2, idx)  # [B, nkv, P', hs]
            layer.values = layer.values.gather(2, idx)
        self.valid = torch.arange(width, device=held.device) < held[:, None]  # [B, P']


class HFAgent(nn.Module):
    """A ``transformers`` causal LM with a value head, with TinyAgent's interface.

    :param lm: the causal LM (``AutoModelForCausalLM``-like: ``base_model`` returns
        ``last_hidden_state``, ``get_output_embeddings()`` maps it to the logits); trained in place
    :param max_len: the longest sequence (default: the config's ``max_position_embeddings``)
    :param value_init_std: std of the value head's weight at init (near zero: the critic starts at ~0)
    """

    def __init__(self, lm: nn.Module, max_len: int | None = None, value_init_std: float = 1e-3):
        super().__init__()
        self.lm = lm
        head, emb = lm.get_output_embeddings(), lm.get_input_embeddings()  # type: ignore[operator]
        if head is None or emb is None:
            raise ValueError(f"{type(lm).__name__} has no input or output embedding: give an AutoModelForCausalLM")
        cfg = lm.config
        positions = int(getattr(cfg, "max_position_embeddings", 0) or 0)
        if max_len is None and not positions:
            raise ValueError(f"{type(lm).__name__}'s config has no max_position_embeddings: pass max_len")
        self.config = HFAgentConfig(vocab_size=int(head.weight.shape[0]), max_len=int(max_len or positions))
        hidden = int(emb.weight.shape[1])
        self.value_head = ValueHead(hidden, 1)
        nn.init.normal_(self.value_head.weight, std=value_init_std)
        nn.init.zeros_(self.value_head.bias)
        self.value_head.to(emb.weight.device)
        self.ln_f = nn.Identity()  # the base model's last hidden state is already normalised
        forward_args = inspect.signature(lm.base_model.forward).parameters  # type: ignore[union-attr]
        self._cache_arg = "cache" if "cache" in forward_args else "past_key_values"  # transformers >= 5.2x: cache
        self.train(lm.training)
        self._check_head()

    @property
    def tok_emb(self) -> nn.Embedding:
        """The LM's input embedding (its ``weight`` gives the device and dtype)."""
        return self.lm.get_input_embeddings()  # type: ignore[operator]

    @property
    def lm_head(self) -> nn.Module:
        """The LM's output embedding: last hidden state [..., H] -> logits [..., V]."""
        return self.lm.get_output_embeddings()  # type: ignore[operator]

    def train(self, mode: bool = True) -> "HFAgent":
        """Set the value head's mode; the LM stays in eval mode (no dropout: the first PPO ratio is 1)."""
        super().train(mode)
        self.lm.eval()
        return self

    def num_params(self) -> int:
        """Number of distinct parameters (tied embeddings counted once)."""
        return sum(p.numel() for p in self.parameters())

    def _base(self, ids: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        """The base model's last hidden state: ids [B, T] -> [B, T, H]."""
        if "past" in kwargs:
            kwargs[self._cache_arg] = kwargs.pop("past")
        out = self.lm.base_model(input_ids=ids, **kwargs)  # type: ignore[operator]
        return out.last_hidden_state

    @torch.no_grad()
    def _check_head(self) -> None:
        """The LM's logits must be its output embedding of the last hidden state (no soft-capping or
        scaling that :meth:`forward` would miss)."""
        ids = torch.arange(min(4, self.config.vocab_size), device=self.tok_emb.weight.device)[None]  # [1, 4]
        want = self.lm(input_ids=ids).logits.float()
        got = self.lm_head(self._base(ids)).float()
        if not torch.allclose(want, got, atol=1e-4, rtol=1e-3):
            raise ValueError(f"{type(self.lm).__name__}'s logits are not its output embedding of the last hidden "
                             "state (soft-capping or scaling?): HFAgent cannot score it")

    def trunk(self, ids: torch.Tensor) -> torch.Tensor:
        """A full causal pass: ids [B, T] -> last hidden states [B, T, H] (right padding never changes earlier ones)."""
        if ids.shape[1] > self.config.max_len:
            raise ValueError(f"sequence of {ids.shape[1]} tokens is longer than max_len={self.config.max_len}")
        return self._base(ids, use_cache=False)

    def forward(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Full causal forward: ids [B, T] -> (logits [B, T, V], values [B, T])."""
        h = self.trunk(ids)  # [B, T, H]
        return self.lm_head(h), self.value_head(h).squeeze(-1)

    # ------------------------------------------------------------------ incremental decoding
    def new_cache(self, batch_size: int) -> HFCache:
        """An empty cache for ``batch_size`` rows."""
        from transformers import DynamicCache

        return HFCache(DynamicCache(), batch_size, self.config.max_len, self.tok_emb.weight.device)

    @torch.no_grad()
    def extend(self, ids: torch.Tensor, n_new: torch.Tensor, cache: HFCache,
               last_only: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        """Append a right-padded chunk of new tokens to each row of ``cache`` and run them
        (:meth:`agents.model.tinyagent.TinyAgent.extend`'s contract).

        :param ids: [B, S] new tokens; row ``b`` uses its first ``n_new[b]`` (0 = row idle)
        :param n_new: [B] long, number of valid new tokens per row
        :param cache: the rows' :class:`HFCache`; its ``lengths`` advance by ``n_new``
        :param last_only: return logits only at each row's last new token
        :return: ``(logits [B, V] or [B, S, V], values [B, S])``, zero past ``n_new`` and for idle rows
        """
        B, S = ids.shape
        V = self.config.vocab_size
        cache.sync()
        n_new = n_new.to(cache.lengths.device)
        ends = cache.lengths + n_new  # [B]
        if B and int(ends.max()) > cache.max_len:
            raise ValueError(f"KV cache overflow: a row needs {int(ends.max())} positions, max_len={cache.max_len}")
        if not bool(n_new.any()):
            return ids.new_zeros((B, V) if last_only else (B, S, V), dtype=torch.float), ids.new_zeros(
                (B, S), dtype=torch.float)
        new = torch.arange(S, device=ids.device) < n_new[:, None]  # [B, S] valid new tokens
        pos = (cache.lengths[:, None] + torch.arange(S, device=ids.device)).clamp(max=cache.max_len - 1)  # [B, S]
        mask = torch.cat([cache.valid, new], dim=1)  # [B, P + S]
        h = self._base(ids, attention_mask=mask.long(), position_ids=pos, past=cache.past, use_cache=True)  # [B, S, H]
        for layer in cache.past.layers:  # padded columns may hold NaN (a row with nothing to attend to): zero them
            keep = new[:, None, :, None]
            layer.keys[:, :, -S:] = torch.where(keep, layer.keys[:, :, -S:], 0.0)
            layer.values[:, :, -S:] = torch.where(keep, layer.values[:, :, -S:], 0.0)
        cache.valid, cache.lengths = mask, ends
        values = torch.where(new, self.value_head(h).squeeze(-1).float(), 0.0)  # [B, S]
        if not last_only:
            return torch.where(new[..., None], self.lm_head(h).float(), 0.0), values  # [B, S, V]
        last = (n_new - 1).clamp(min=0)  # [B]
        logits = self.lm_head(h[torch.arange(B, device=ids.device), last]).float()  # [B, V]
        return torch.where(n_new[:, None] > 0, logits, 0.0), values

    @torch.no_grad()
    def peek(self, rows: torch.Tensor, ids: torch.Tensor, cache: HFCache) -> torch.Tensor:
        """Logits after each of ``K`` continuations of some cached rows, the cache unchanged
        (:meth:`agents.model.tinyagent.TinyAgent.peek`'s contract): the rows' keys and values are copied
        K times into a scratch cache.

        :param rows: [R] long, cache rows
        :param ids: [R, K, S] continuations
        :param cache: the :class:`HFCache` (read only)
        :return: logits [R, K, V] at each continuation's last token
        """
        from transformers import DynamicCache

        R, K, S = ids.shape
        cache.sync()
        if int(cache.lengths[rows].max()) + S > cache.max_len:
            raise ValueError(f"KV cache overflow: a continuation needs more than max_len={cache.max_len} positions")
        scratch = DynamicCache()
        for i, layer in enumerate(cache.past.layers):
            scratch.update(layer.keys[rows].repeat_interleave(K, 0), layer.values[rows].repeat_interleave(K, 0), i)
        seen = cache.valid[rows].repeat_interleave(K, 0)  # [R*K, P]
        mask = torch.cat([seen, seen.new_ones(R * K, S)], dim=1)  # [R*K, P + S]
        pos = cache.lengths[rows].repeat_interleave(K)[:, None] + torch.arange(S, device=ids.device)  # [R*K, S]
        h = self._base(ids.reshape(R * K, S), attention_mask=mask.long(), position_ids=pos, past=scratch,
                       use_cache=True)  # [R*K, S, H]
        return self.lm_head(h[:, -1]).float().view(R, K, -1)  # [R, K, V]


# ---------------------------------------------------------------------- configs and files
def config_dict(lm: nn.Module) -> dict[str, Any]:
    """The LM's config as plain JSON data (what a model file keeps to rebuild it).

    :param lm: a ``transformers`` model
    """
    text = lm.config.to_json_string(use_diff=False)  # type: ignore[union-attr,operator]
    if len(text.encode()) > MAX_CONFIG_BYTES:
        raise ValueError(f"the HF config takes {len(text.encode())} bytes as JSON, more than a model file keeps "
                         f"({MAX_CONFIG_BYTES})")
    return json.loads(text)


#: the attention implementations and dtypes a saved config may ask for (anything else needs a package or a
#: dtype torch lacks, and failed with a traceback when the model was built)
HF_ATTENTION = (None, "eager", "sdpa")
HF_DTYPES = (None, "float32", "bfloat16", "float16")
#: the structural sizes a saved config may name, under every name configs give them, and their bounds
HF_STRUCTURE = {
    "heads": (("num_attention_heads", "n_head", "num_heads"), 1, 4096),
    "kv_heads": (("num_key_value_heads", "num_kv_heads"), 1, 4096),
    "layers": (("num_hidden_layers", "n_layer", "num_layers"), 1, 512),
    "experts": (("num_local_experts", "num_experts", "n_routed_experts"), 0, 256),
    "experts_per_token": (("num_experts_per_tok",), 0, 256),
    "head_dim": (("head_dim",), 1, 1 << 16),
    "positions": (("max_position_embeddings", "n_positions", "n_ctx"), 1, 1 << 24),
}
MAX_HF_BUFFER_BYTES = 256 << 20  # a config whose model would allocate more than this in buffers (masks, caches)


def check_hf_config(data: dict[str, Any]) -> None:
    """The fields of a saved HF config that decide how its model is built, checked before anything is built:
    its attention implementation and dtype (one of :data:`HF_ATTENTION`, :data:`HF_DTYPES`), and each
    structural size (:data:`HF_STRUCTURE`: a whole number within bounds, key-value heads dividing the
    heads, at most 4096 expert blocks in all). A bad field is a one-line ``ValueError``.

    :param data: the config as JSON data
    """
    for key in ("attn_implementation", "_attn_implementation"):
        if data.get(key) not in HF_ATTENTION:
            raise ValueError(f"hf_config's {key} is {str(data.get(key))[:40]!r}; a model file may use "
                             f"{', '.join(str(a) for a in HF_ATTENTION[1:])} (or none)")
    for key in ("dtype", "torch_dtype"):
        if data.get(key) not in HF_DTYPES:
            raise ValueError(f"hf_config's {key} is {str(data.get(key))[:40]!r}; a model file may use "
                             f"{', '.join(str(d) for d in HF_DTYPES[1:])} (or none)")
    found: dict[str, int] = {}
    for size, (names, low, high) in HF_STRUCTURE.items():
        for key in names:
            value = data.get(key)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise ValueError(f"hf_config's {key} is {repr(value)[:40]}, not a whole number from {low} to {high}")
            found.setdefault(size, value)
    heads, kv = found.get("heads"), found.get("kv_heads")
    if heads is not None and kv is not None and heads % kv:
        raise ValueError(f"hf_config's {kv} key-value heads do not divide its {heads} attention heads")
    if found.get("layers", 1) * max(found.get("experts", 1), 1) > 4096:
        raise ValueError("hf_config asks for more than 4096 expert blocks (layers x experts)")


def _hf_config(data: dict[str, Any]) -> Any:
    """The ``transformers`` config of saved JSON data: built-in model types only, never remote code."""
    try:
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING
    except ImportError:
        raise ValueError("this policy is an HF model (hf_config): install transformers (make trl-venv) "
                         "to build it") from None
    model_type = data.get("model_type")
    if not isinstance(model_type, str) or model_type not in CONFIG_MAPPING:
        raise ValueError(f"hf_config's model_type {str(model_type)[:40]!r} is not one transformers knows")
    if data.get("auto_map"):
        raise ValueError("hf_config asks for remote code (auto_map); only built-in model types are rebuilt")
    check_hf_config(data)
    return CONFIG_MAPPING[model_type].from_dict(dict(data))


def lm_from_config(data: dict[str, Any]) -> nn.Module:
    """A randomly initialised causal LM of a saved config (:func:`config_dict`); built-in model types only,
    never remote code.

    :param data: the config as JSON data, with its ``model_type``
    """
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_config(_hf_config(data))


def meta_model_size(data: dict[str, Any]) -> tuple[int, int]:
    """``(parameters, buffer bytes)`` of the model a saved config builds, counted on torch's meta device, where
    nothing is allocated: every parameter-bearing field counts (learned positions, experts, an untied head),
    tied weights once. Any failure to build (a field transformers refuses, a zero it divides by) is a
    one-line ``ValueError``.

    :param data: the config as JSON data
    """
    try:
        config = _hf_config(data)
        from transformers import AutoModelForCausalLM

        with torch.device("meta"):
            lm = AutoModelForCausalLM.from_config(config)
    except ValueError as err:
        if "hf_config" in str(err):
            raise
        raise ValueError(f"hf_config does not build a model ({type(err).__name__}: {_first_line(err)})") from None
    except Exception as err:  # noqa: BLE001 - whatever transformers raises for a field it cannot use
        raise ValueError(f"hf_config does not build a model ({type(err).__name__}: {_first_line(err)})") from None
    return sum(p.numel() for p in lm.parameters()), sum(b.numel() * b.element_size() for b in lm.buffers())


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0][:120] if text else ""
