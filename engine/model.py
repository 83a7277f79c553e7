"""Qwen3-MoE decoder in plain torch, driven by a :class:`~engine.batch.StepPlan`.

The layers follow transformers' ``Qwen3MoeForCausalLM`` exactly: RMSNorm,
grouped-query attention with RoPE and per-head q/k RMSNorm, a softmax top-k
router honouring ``norm_topk_prob``, SwiGLU experts, and ``lm_head`` tied or
not as the config says.  Attention reads and writes a paged KV cache.

This module holds everything except the expert weights: the expert MLPs run
wherever the placement puts them, behind the ``ExpertCompute`` callable that
the executor passes in (in-process, or dispatched to EP ranks).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import torch
import torch.nn.functional as F  # noqa: N812

from contracts.errors import ValidationError
from engine.batch import StepPlan
from engine.checkpoint import CheckpointReader
from engine.config import ModelConfig

BUCKET_MIN_KEYS = 256
"""Decode contexts up to this many keys share one bucket, so that short contexts cost one gather and attention call."""

ExpertCompute = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
"""(moe_layer_index, hidden (T,H), top-k weights (T,k), top-k logical expert ids (T,k)) -> (T,H)."""


@dataclass(slots=True)
class LayerWeights:
    input_norm: torch.Tensor
    qkv: torch.Tensor
    """q, k and v projections stacked on the output dim: one matmul instead of three."""
    q_norm: torch.Tensor
    k_norm: torch.Tensor
    o_proj: torch.Tensor
    post_norm: torch.Tensor
    router: torch.Tensor | None
    """(experts, hidden) for a sparse layer; None for a dense one."""
    dense_gate_up: torch.Tensor | None
    dense_down: torch.Tensor | None


@dataclass(frozen=True, slots=True)
class PrefillChunk:
    """One multi-token chunk of a step, with what attention needs precomputed once per step."""

    row: int
    """First row of the chunk in the step's tokens."""
    length: int
    cached: int
    """Tokens of the sequence already in the KV cache before this chunk."""
    blocks: torch.Tensor | None
    """Block ids holding positions 0..cached+length-1 (None when nothing was cached)."""
    mask: torch.Tensor | None
    """(length, cached+length) causal mask over cached and new keys (None when nothing was cached)."""


@dataclass(frozen=True, slots=True)
class DecodeBucket:
    """Decoding sequences of similar context length, attended together over one gathered width."""

    rows: torch.Tensor
    """Rows of these sequences in the step's tokens, in step order."""
    block_tables: torch.Tensor
    """(sequences, width) block ids; width is the widest context of the bucket, in blocks."""
    mask: torch.Tensor
    """(sequences, 1, 1, width x block_size): which gathered keys each sequence may see."""


@dataclass(slots=True)
class StepMetadata:
    """Tensors derived from a StepPlan once per step and shared by every layer."""

    token_ids: torch.Tensor
    positions: torch.Tensor
    slot_mapping: torch.Tensor
    logits_rows: torch.Tensor
    decode_buckets: list[DecodeBucket]
    """Decoding sequences by context width, so that a short context is not padded to the longest."""
    prefills: list[PrefillChunk]

    @property
    def decode_only(self) -> bool:
        """Every row of the step decodes, in one bucket: attention needs no gather of q, no scatter of o."""
        return not self.prefills and len(self.decode_buckets) == 1


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    if x.dtype == torch.float32:
        return F.rms_norm(x, (x.shape[-1],), weight, eps)
    # transformers normalizes in float32 and multiplies by the weight in the input dtype.
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Qwen3MoeModel:
    """The non-expert part of Qwen3-MoE: embeddings, attention, routers, dense MLPs, lm_head."""

    def __init__(self, config: ModelConfig, reader: CheckpointReader, dtype: torch.dtype) -> None:
        self.config = config
        self.dtype = dtype
        hidden, vocab = config.hidden_size, config.vocab_size
        self.embed = reader.get("model.embed_tokens.weight", (vocab, hidden))
        self.layers = [_layer_weights(config, reader, i) for i in range(config.num_hidden_layers)]
        self.norm = reader.get("model.norm.weight", (hidden,))
        if config.tie_word_embeddings:  # else a missing lm_head.weight is an error, not the embeddings
            self.lm_head = self.embed
        else:
            self.lm_head = reader.get("lm_head.weight", (vocab, hidden))
        inv_freq = 1.0 / (
            config.rope_theta ** (torch.arange(0, config.head_dim, 2, dtype=torch.float32) / config.head_dim)
        )
        freqs = torch.outer(torch.arange(config.max_position_embeddings, dtype=torch.float32), inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        self.rope_cos = emb.cos().to(dtype)
        self.rope_sin = emb.sin().to(dtype)
        self.q_size = config.num_attention_heads * config.head_dim
        self.kv_size = config.num_key_value_heads * config.head_dim
        self.scale = config.head_dim**-0.5

    # ----------------------------------------------------------------- metadata
    def step_metadata(self, plan: StepPlan, block_size: int, num_blocks: int | None = None) -> StepMetadata:
        """The step's index tensors, built with numpy in a few vectorized operations (no per-token Python).

        Refuses a malformed plan (token ids, positions or blocks out of range) with ValidationError,
        before any tensor reaches the model (or an EP rank).
        """
        chunks = plan.chunks
        lens = np.fromiter((len(c.token_ids) for c in chunks), dtype=np.int64, count=len(chunks))
        starts = np.fromiter((c.num_computed for c in chunks), dtype=np.int64, count=len(chunks))
        total = int(lens.sum())
        tokens = np.fromiter(itertools.chain.from_iterable(c.token_ids for c in chunks), dtype=np.int64, count=total)
        widths = [len(c.block_table) for c in chunks]
        tables = np.zeros((len(chunks), max(widths, default=1) or 1), dtype=np.int64)
        for i, chunk in enumerate(chunks):
            tables[i, : widths[i]] = chunk.block_table
        row_start = np.cumsum(lens) - lens
        which = np.repeat(np.arange(len(chunks)), lens)
        positions = np.arange(total) - row_start[which] + starts[which]
        self._check(tokens, positions, tables, widths, num_blocks)
        if total and (positions // block_size >= np.asarray(widths)[which]).any():
            raise ValidationError("a block table does not cover its chunk's positions")
        slots = tables[which, positions // block_size] * block_size + positions % block_size
        needs = np.fromiter((c.needs_logits for c in chunks), dtype=bool, count=len(chunks))
        logits_rows = (row_start + lens - 1)[needs]
        if any(c.all_logits for c in chunks):  # only these chunks pay for every position's logits
            logits_rows = np.concatenate([np.arange(row_start[i], row_start[i] + lens[i]) if c.all_logits
                                          else (row_start[i : i + 1] + lens[i] - 1)[: int(c.needs_logits)]
                                          for i, c in enumerate(chunks)])
        decode = lens == 1
        prefills = []
        for i in np.flatnonzero(~decode).tolist():
            row, n, start = int(row_start[i]), int(lens[i]), int(starts[i])
            if start == 0:
                prefills.append(PrefillChunk(row, n, 0, None, None))
                continue
            span = start + n
            mask = torch.arange(span).unsqueeze(0) <= (start + torch.arange(n)).unsqueeze(1)
            prefills.append(PrefillChunk(row, n, start, torch.from_numpy(tables[i, : -(-span // block_size)]), mask))
        return StepMetadata(
            token_ids=torch.from_numpy(tokens),
            positions=torch.from_numpy(positions),
            slot_mapping=torch.from_numpy(slots),
            logits_rows=torch.from_numpy(logits_rows),
            decode_buckets=_decode_buckets(row_start[decode], starts[decode] + 1, tables[decode], block_size),
            prefills=prefills,
        )

    def _check(self, tokens: npt.NDArray[np.int64], positions: npt.NDArray[np.int64], tables: npt.NDArray[np.int64],
               widths: list[int], num_blocks: int | None) -> None:
        cfg = self.config
        problems = []
        if tokens.size and (tokens.min() < 0 or tokens.max() >= cfg.vocab_size):
            problems.append(f"token ids must be in [0, {cfg.vocab_size})")
        if positions.size and positions.max() >= cfg.max_position_embeddings:
            problems.append(f"positions must be < max_position_embeddings ({cfg.max_position_embeddings})")
        used = [tables[i, :w] for i, w in enumerate(widths) if w]
        if num_blocks is not None and used:
            flat = np.concatenate(used)
            if flat.min() < 0 or flat.max() >= num_blocks:
                problems.append(f"block tables must use blocks in [0, {num_blocks})")
        if problems:
            raise ValidationError(problems)

    # ------------------------------------------------------------------ forward
    def forward(
        self,
        meta: StepMetadata,
        kv_cache: torch.Tensor,
        experts: ExpertCompute,
    ) -> torch.Tensor:
        """Run every layer; return float32 logits for ``meta.logits_rows``.

        ``kv_cache`` is (layers, 2, kv_heads, blocks, block_size, head_dim): head-major, so that a
        sequence's gathered keys are one contiguous run per head, which CPU attention reads up to 3x
        faster than keys interleaved by head (docs/engine.md).
        """
        cfg = self.config
        h = self.embed.index_select(0, meta.token_ids)
        cos = self.rope_cos.index_select(0, meta.positions).unsqueeze(1)
        sin = self.rope_sin.index_select(0, meta.positions).unsqueeze(1)
        moe_index = 0
        for i, layer in enumerate(self.layers):
            x = rms_norm(h, layer.input_norm, cfg.rms_norm_eps)
            h = h + self._attention(x, layer, meta, kv_cache[i], cos, sin)
            x = rms_norm(h, layer.post_norm, cfg.rms_norm_eps)
            if layer.router is not None:
                weights, expert_ids = self.route(x, layer.router)
                h = h + experts(moe_index, x, weights, expert_ids)
                moe_index += 1
            else:
                assert layer.dense_gate_up is not None and layer.dense_down is not None
                gate, up = F.linear(x, layer.dense_gate_up).chunk(2, dim=-1)
                h = h + F.linear(F.silu(gate) * up, layer.dense_down)
        if meta.logits_rows.shape[0] != h.shape[0]:
            h = h.index_select(0, meta.logits_rows)
        last = rms_norm(h, self.norm, cfg.rms_norm_eps)
        return F.linear(last, self.lm_head).float()

    def route(self, x: torch.Tensor, router: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Softmax top-k routing as transformers does it: (weights (T,k), logical ids (T,k))."""
        probs = torch.softmax(F.linear(x, router), dim=-1, dtype=torch.float32)
        top_v, top_i = torch.topk(probs, self.config.num_experts_per_tok, dim=-1)
        if self.config.norm_topk_prob:
            top_v = top_v / top_v.sum(dim=-1, keepdim=True)
        return top_v.to(x.dtype), top_i

    def _attention(
        self,
        x: torch.Tensor,
        layer: LayerWeights,
        meta: StepMetadata,
        cache: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
    ) -> torch.Tensor:
        cfg = self.config
        n_tokens = x.shape[0]
        d = cfg.head_dim
        n_heads, n_kv = cfg.num_attention_heads, cfg.num_key_value_heads
        qkv = F.linear(x, layer.qkv)
        q = qkv[:, : self.q_size].reshape(n_tokens, n_heads, d)
        k = qkv[:, self.q_size : self.q_size + self.kv_size].reshape(n_tokens, n_kv, d)
        v = qkv[:, self.q_size + self.kv_size :].reshape(n_tokens, n_kv, d)
        q = rms_norm(q, layer.q_norm, cfg.rms_norm_eps)
        k = rms_norm(k, layer.k_norm, cfg.rms_norm_eps)
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        k_cache, v_cache = cache[0], cache[1]  # (kv_heads, blocks, block_size, head_dim)
        k_cache.view(n_kv, -1, d).index_copy_(1, meta.slot_mapping, k.transpose(0, 1))
        v_cache.view(n_kv, -1, d).index_copy_(1, meta.slot_mapping, v.transpose(0, 1))
        out = torch.empty_like(q)
        for chunk in meta.prefills:
            row, n = chunk.row, chunk.length
            qs = q[row : row + n].transpose(0, 1).unsqueeze(0)
            if chunk.blocks is None:
                ks = k[row : row + n].transpose(0, 1).unsqueeze(0)
                vs = v[row : row + n].transpose(0, 1).unsqueeze(0)
                o = F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, scale=self.scale, enable_gqa=True)
            else:
                total = chunk.cached + n
                ks = k_cache.index_select(1, chunk.blocks).view(n_kv, -1, d)[:, :total].unsqueeze(0)
                vs = v_cache.index_select(1, chunk.blocks).view(n_kv, -1, d)[:, :total].unsqueeze(0)
                o = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=chunk.mask, scale=self.scale,
                                                   enable_gqa=True)
            out[row : row + n] = o.squeeze(0).transpose(0, 1)
        if meta.decode_only:  # every row decodes, in one bucket: no gather of q, no scatter of o
            o = self._decode_attention(q.unsqueeze(2), meta.decode_buckets[0], k_cache, v_cache)
            return F.linear(o.reshape(n_tokens, n_heads * d), layer.o_proj)
        for bucket in meta.decode_buckets:
            o = self._decode_attention(q.index_select(0, bucket.rows).unsqueeze(2), bucket, k_cache, v_cache)
            out[bucket.rows] = o.squeeze(2)
        return F.linear(out.reshape(n_tokens, n_heads * d), layer.o_proj)

    def _decode_attention(self, q: torch.Tensor, bucket: DecodeBucket, k_cache: torch.Tensor,
                          v_cache: torch.Tensor) -> torch.Tensor:
        """One bucket's decode attention: q (sequences, heads, 1, head_dim) over its gathered KV blocks."""
        n_kv, d = k_cache.shape[0], k_cache.shape[-1]
        batch = bucket.block_tables.shape[0]
        # index_select copies whole blocks (block_size x head_dim each, per head); advanced indexing
        # gathers element by element and measured 4x slower.  The result is (kv_heads, batch, keys,
        # head_dim): each sequence's keys of a head are one contiguous run.
        flat = bucket.block_tables.reshape(-1)
        ks = k_cache.index_select(1, flat).view(n_kv, batch, -1, d).transpose(0, 1)
        vs = v_cache.index_select(1, flat).view(n_kv, batch, -1, d).transpose(0, 1)
        return F.scaled_dot_product_attention(q, ks, vs, attn_mask=bucket.mask, scale=self.scale, enable_gqa=True)


def _layer_weights(config: ModelConfig, reader: CheckpointReader, i: int) -> LayerWeights:
    """Layer ``i``'s weights, each checked against the shape the config gives it."""
    p = f"model.layers.{i}"
    hidden, head_dim = config.hidden_size, config.head_dim
    q_rows, kv_rows = config.num_attention_heads * head_dim, config.num_key_value_heads * head_dim

    def get(name: str, *shape: int) -> torch.Tensor:
        return reader.get(f"{p}.{name}.weight", shape)

    qkv = torch.cat([get("self_attn.q_proj", q_rows, hidden), get("self_attn.k_proj", kv_rows, hidden),
                     get("self_attn.v_proj", kv_rows, hidden)], dim=0)
    sparse, inter = config.is_sparse_layer(i), config.intermediate_size
    return LayerWeights(
        input_norm=get("input_layernorm", hidden),
        qkv=qkv.contiguous(),
        q_norm=get("self_attn.q_norm", head_dim),
        k_norm=get("self_attn.k_norm", head_dim),
        o_proj=get("self_attn.o_proj", hidden, q_rows),
        post_norm=get("post_attention_layernorm", hidden),
        router=get("mlp.gate", config.num_experts, hidden) if sparse else None,
        dense_gate_up=None if sparse else torch.cat(
            [get("mlp.gate_proj", inter, hidden), get("mlp.up_proj", inter, hidden)], dim=0
        ).contiguous(),
        dense_down=None if sparse else get("mlp.down_proj", hidden, inter),
    )


def _decode_buckets(rows: npt.NDArray[np.int64], seen: npt.NDArray[np.int64], tables: npt.NDArray[np.int64],
                    block_size: int) -> list[DecodeBucket]:
    """Decoding sequences grouped by context width in blocks, each group padded only to its widest.

    Padding every sequence to the step's longest context made one long context cost every short one
    its whole width (docs/engine.md).  A bucket's widest context is at most twice its narrowest, or
    at most ``BUCKET_MIN_KEYS``: a batch of similar contexts stays one gather and one attention call
    per layer.  Rows keep step order within a bucket; masked padding keys weigh 0, so the bucket a
    sequence lands in does not change its attention.
    """
    if not rows.size:
        return []
    widths = -(-seen // block_size)
    floor = max(1, BUCKET_MIN_KEYS // block_size)
    widest = int(widths.max())
    if widest <= max(floor, 2 * int(widths.min())):  # the common case, checked first: it costs two reductions
        return [_decode_bucket(rows, seen, tables, widest, block_size)]
    # Class k holds widths in (2^(k-1), 2^k] x floor, class 0 those up to floor: the bit length of (w-1) // floor.
    classes = np.frexp((np.maximum(widths, floor) - 1) // floor)[1]
    groups = [np.flatnonzero(classes == cls) for cls in np.unique(classes).tolist()]
    return [_decode_bucket(rows[g], seen[g], tables[g], int(widths[g].max()), block_size) for g in groups]


def _decode_bucket(rows: npt.NDArray[np.int64], seen: npt.NDArray[np.int64], tables: npt.NDArray[np.int64],
                   width: int, block_size: int) -> DecodeBucket:
    keys = torch.arange(width * block_size)
    mask = keys.unsqueeze(0) < torch.from_numpy(seen).unsqueeze(1)
    block_tables = torch.from_numpy(np.ascontiguousarray(tables[:, :width]))
    return DecodeBucket(rows=torch.from_numpy(rows), block_tables=block_tables, mask=mask[:, None, None, :])
