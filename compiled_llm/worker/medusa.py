"""The Medusa proposer: vLLM's Medusa head checkpoint (config.json: num_heads, num_hidden_layers
ResBlocks per head, hidden_size, vocab_size, optional truncated_vocab_size with a token_map;
weights blocks.{h}.layers.{l}.weight[/bias] and lm_heads.{h}.weight) run on the target's last
hidden state (the final-norm output its lm_head reads) of each request that sampled. Head h's
argmax is draft h+1: a chain of k tokens from one pass, deterministic (one-hot q)."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from compiled_llm.core.scheduler import SchedulerOutput
from compiled_llm.sample.spec_decode.proposers import (
    Proposer,
    Sampled,
    register_proposer,
    spec_eligible,
)
from compiled_llm.sample.uploads import upload
from compiled_llm.speculative import SpeculativeConfig
from compiled_llm.worker.loader import checkpoint_files, iter_tensors, load_hf_config
from compiled_llm.worker.model_runner import ModelRunner

_FIELD = "speculative_config.model"


class MedusaResBlock(nn.Module):
    """num_layers residual steps x <- x + SiLU(Linear(x)) (vLLM's ResidualBlock)."""

    def __init__(self, hidden_size: int, num_layers: int, bias: bool) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(hidden_size, hidden_size, bias=bias)
                                    for _ in range(num_layers))

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """The block's output, same shape as hidden."""
        for layer in self.layers:
            hidden = hidden + nn.functional.silu(layer(hidden))
        return hidden


class MedusaHeads(nn.Module):
    """num_heads (ResBlock, lm_head) pairs; token_map maps a truncated vocabulary back to the
    target's token ids. Invariant: every parameter was read from the checkpoint."""

    def __init__(self, config: dict) -> None:
        super().__init__()
        hidden, heads = config["hidden_size"], config["num_heads"]
        self.vocab_size = config.get("truncated_vocab_size") or config["vocab_size"]
        self.blocks = nn.ModuleList(
            MedusaResBlock(hidden, config.get("num_hidden_layers", 1),
                           bool(config.get("medusa_fc_bias", False))) for _ in range(heads))
        # original_lm_head: one lm_head (lm_heads.0) shared by every head, as vLLM reads it
        num_lm_heads = 1 if config.get("original_lm_head", False) else heads
        self.lm_heads = nn.ModuleList(nn.Linear(hidden, self.vocab_size, bias=False)
                                      for _ in range(num_lm_heads))
        self.token_map: torch.Tensor | None = None

    def propose(self, hidden: torch.Tensor, k: int) -> torch.Tensor:
        """[R, k] draft token ids: the argmax of the first k heads at each row of hidden."""
        drafts = []
        for head in range(k):
            lm_head = self.lm_heads[min(head, len(self.lm_heads) - 1)]
            drafts.append(lm_head(self.blocks[head](hidden)).argmax(dim=-1))
        tokens = torch.stack(drafts, dim=1)
        return tokens if self.token_map is None else self.token_map[tokens]


def load_medusa(model_dir: str, target_hidden: int, target_vocab: int,
                dtype: torch.dtype, device: torch.device) -> MedusaHeads:
    """The heads of a vLLM Medusa checkpoint directory; ValueError naming the field when it is
    missing, incomplete or shaped unlike the target."""
    if not (Path(model_dir) / "config.json").is_file():
        raise ValueError(f"{_FIELD}: no Medusa config.json in {model_dir!r}")
    config = load_hf_config(model_dir)
    for name in ("num_heads", "hidden_size", "vocab_size"):
        if not isinstance(config.get(name), int):
            raise ValueError(f"{_FIELD}: config.json lacks {name} (not a Medusa checkpoint?)")
    for name, want in (("hidden_size", target_hidden), ("vocab_size", target_vocab)):
        if config[name] != want:
            raise ValueError(f"{_FIELD}: the Medusa heads' {name} {config[name]} differs from "
                             f"the target's {want}")
    heads = MedusaHeads(config)
    _load_weights(heads, model_dir)
    if heads.vocab_size < config["vocab_size"] and heads.token_map is None:
        raise ValueError(f"{_FIELD}: truncated_vocab_size needs a token_map tensor")
    return heads.to(device=device, dtype=dtype).eval()


def _load_weights(heads: MedusaHeads, model_dir: str) -> None:
    """Copy the checkpoint's tensors in (a "medusa_heads." prefix is dropped, as vLLM does)."""
    params = dict(heads.named_parameters())
    seen: set[str] = set()
    try:
        files = checkpoint_files(Path(model_dir), "auto")
    except ValueError as err:
        raise ValueError(f"{_FIELD}: {err}") from None
    for name, tensor, _ in iter_tensors(files):
        name = name.removeprefix("medusa_heads.")
        if name == "token_map":
            heads.token_map = tensor.to(torch.int64)
            continue
        param = params.get(name)
        if param is None:
            continue
        if tensor.shape != param.shape:
            raise ValueError(f"{_FIELD}: {name} has shape {tuple(tensor.shape)}, "
                             f"expected {tuple(param.shape)}")
        with torch.no_grad():
            param.copy_(tensor)
        seen.add(name)
    missing = sorted(set(params) - seen)
    if missing:
        raise ValueError(f"{_FIELD}: the Medusa checkpoint lacks {missing[:4]}")


@register_proposer("medusa")
class MedusaProposer(Proposer):
    """Proposes with Medusa heads from the target's hidden states, handed over by the
    speculative runner (take_hidden) before each propose; drafts are argmaxes (q one-hot)."""

    uses_target_hidden = True

    def __init__(self, cfg: SpeculativeConfig, target: ModelRunner, **context) -> None:
        super().__init__(cfg)
        config = target.model.config
        self.heads = load_medusa(cfg.model, config.hidden_size, config.vocab_size,
                                 target.dtype, target.device)
        if self.k > len(self.heads.blocks):
            raise ValueError(f"speculative_config.num_speculative_tokens ({self.k}) exceeds the "
                             f"Medusa checkpoint's num_heads ({len(self.heads.blocks)})")
        self.hidden: tuple[list[str], torch.Tensor] = ([], torch.empty(0))

    def take_hidden(self, request_ids: list[str], hidden: torch.Tensor) -> None:
        """The target's last hidden state of each request that sampled this step."""
        self.hidden = (request_ids, hidden)

    @torch.inference_mode()
    def propose(self, sched: SchedulerOutput, sampled: Sampled) -> dict[str, list[int]]:
        """k drafts per eligible request, from one pass of the heads (one host read)."""
        request_ids, hidden = self.hidden
        self.hidden = ([], torch.empty(0))
        reqs = {req.request_id: req for req, _ in sched.scheduled}
        rows = [i for i, rid in enumerate(request_ids)
                if rid in sampled and not reqs[rid].is_finished and spec_eligible(reqs[rid])]
        if not rows:
            return {}
        index = upload(rows, torch.int64, hidden.device)
        tokens = self.heads.propose(hidden.index_select(0, index), self.k).tolist()
        return {request_ids[row]: drafts for row, drafts in zip(rows, tokens)}
