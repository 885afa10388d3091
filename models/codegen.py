"""CodeGen decoder (CodeGenForCausalLM: Salesforce codegen-350M/2B/6B/16B mono, multi, nl): GPT-J's
block (one ln_1 feeding attention and the MLP in parallel, interleaved RoPE on the leading
rotary_dim dims of each head, fc_in -> gelu_new -> fc_out, a biased lm_head) with q/k/v as one
bias-free qkv_proj stored in 4 model-parallel blocks of (q, v, k) rows, reordered at load into
[q; k; v]. Attention is the one opaque op."""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import torch
from torch import nn

from compiled_llm.attention import attention
from compiled_llm.models.gptj import GPTJBlock, GPTJConfig, GPTJForCausalLM, GPTJModel
from compiled_llm.models.rotary import apply_partial_rotary, apply_rotary_interleaved

MP_NUM = 4  # transformers' CodeGenAttention.mp_num: the row blocks of qkv_proj


@dataclasses.dataclass
class CodeGenConfig(GPTJConfig):
    """GPT-J's fields (GPT-2's spelling plus rotary_dim); n_head must split into the 4 blocks."""

    @classmethod
    def from_hf(cls, hf_config: dict[str, Any], **defaults: Any) -> CodeGenConfig:
        """GPT-J's keys; heads not a multiple of 4 (which transformers 5.17 cannot split into
        its qkv blocks) refused by name."""
        base = super().from_hf(hf_config, **defaults)
        if base.num_attention_heads % MP_NUM:
            raise ValueError(f"n_head {base.num_attention_heads} is not supported for "
                             f"CodeGenForCausalLM: qkv_proj holds {MP_NUM} blocks of whole heads")
        return base


class QKVBlocks(NamedTuple):
    """CodeGen's qkv_proj weight [3E, E], rows in 4 blocks of (q, v, k) parts: it fills our
    qkv_proj [q; k; v] (heads in order) once reordered."""

    name: str

    def select(self, param: torch.Tensor) -> torch.Tensor:
        """The whole parameter."""
        return param

    def prepare(self, tensor: torch.Tensor) -> torch.Tensor:
        """[4 * (q, v, k), E] rows -> [q, k, v] rows, each [E, E] its blocks' heads in order;
        a tensor-parallel rank's rows (fewer) come read in that order already."""
        if tensor.shape[0] != 3 * tensor.shape[1]:
            return tensor
        blocks = tensor.view(MP_NUM, 3, -1, tensor.shape[-1])  # [4, (q, v, k), E/4, E]
        return blocks[:, [0, 2, 1]].transpose(0, 1).reshape(tensor.shape)  # [(q, k, v)*E, E]


class CodeGenAttention(nn.Module):
    """GPT-J's attention over one qkv_proj (rows [q; k; v] once loaded), bias-free."""

    def __init__(self, cfg: CodeGenConfig, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads, self.head_dim = cfg.num_attention_heads, cfg.head_dim
        self.rotary_dim, self.embed_dim = cfg.rotary_dim, cfg.hidden_size
        self.scale = cfg.head_dim**-0.5
        self.qkv_proj = nn.Linear(cfg.hidden_size, 3 * cfg.hidden_size, bias=False)
        self.out_proj = nn.Linear(cfg.hidden_size, cfg.hidden_size, bias=False)

    def forward(self, hidden: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]):
        """hidden [T, hidden] -> [T, hidden]; writes this layer's K/V into the cache."""
        q, k, v = self.qkv_proj(hidden).split(self.embed_dim, -1)  # [T, hidden] each
        q = q.view(-1, self.num_heads, self.head_dim)  # [T, H, D]
        k = k.view(-1, self.num_heads, self.head_dim)
        v = v.view(-1, self.num_heads, self.head_dim)
        q, k = apply_partial_rotary(q, k, rope, self.rotary_dim, apply_rotary_interleaved)
        attn_out = attention(q, k, v, self.layer_idx, self.scale, -1)
        return self.out_proj(attn_out.flatten(1))  # [T, H*D] -> [T, hidden]

    def shard_for_tp(self, sharder, prefix: str) -> None:
        """This rank's heads: their rows of qkv_proj from each checkpoint block they fall in,
        q's (block by block), then k's, then v's (the order prepare gives a whole tensor);
        out_proj by their columns."""
        first, count = sharder.query_heads()
        dim, per_block = self.head_dim, self.num_heads // MP_NUM
        parts = []
        for part in (0, 2, 1):  # q, k, v of each block's (q, v, k) rows
            for block in range(MP_NUM):
                low = max(first, block * per_block)
                high = min(first + count, (block + 1) * per_block)
                if low < high:
                    parts.append(((3 * block + part) * per_block * dim,
                                  (low - block * per_block) * dim, (high - low) * dim))
        sharder.fused_column(f"{prefix}.qkv_proj", self.qkv_proj, parts)
        sharder.row(f"{prefix}.out_proj", self.out_proj, first * dim, count * dim)
        self.num_heads, self.embed_dim = count, count * dim


class CodeGenBlock(GPTJBlock):
    """GPT-J's parallel block around CodeGenAttention."""

    attention_cls = CodeGenAttention


class CodeGenModel(GPTJModel):
    """wte, CodeGen blocks (h), ln_f, the rotary table of the rotary dims."""

    block_cls = CodeGenBlock


class CodeGenForCausalLM(GPTJForCausalLM):
    """CodeGen for causal LM: GPT-J's contract (a biased lm_head, untied unless
    tie_word_embeddings); tensor parallelism by heads (each rank's qkv_proj rows read block by
    block); pipeline parallelism and LoRA refused by name."""

    config_cls = CodeGenConfig
    body_cls = CodeGenModel
    # transformers' CodeGenConfig defaults (its n_ctx is never read)
    hf_defaults = {**GPTJForCausalLM.hf_defaults, "n_ctx": 2048}
    hf_unread = (*GPTJForCausalLM.hf_unread, "n_ctx")
    # the mask buffers older checkpoints saved (causal_mask, masked_bias; GPT-J's bias)
    ignored_weights = (*GPTJForCausalLM.ignored_weights, ".attn.causal_mask")

    @classmethod
    def weight_name(cls, hf_name: str) -> str | QKVBlocks | None:
        """Our parameter name (qkv_proj's rows reordered); a CodeGenModel checkpoint's
        names gain the `transformer.` prefix."""
        name = super().weight_name(hf_name)
        if name is None:
            return None
        if not name.startswith(("transformer.", "lm_head.")):
            name = f"transformer.{name}"
        return QKVBlocks(name) if name.endswith(".qkv_proj.weight") else name
