"""The target's auxiliary hidden states (EAGLE-3 reads them): chosen decoder layers' inputs,
written inside the target's forward into persistent buffers, so eager runs, compiled graphs
(piecewise split included) and full CUDA graphs all leave the latest step's states there.
Installed at load time from outside the model files, before the target compiles."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from compiled_llm.compile.cache import source_hash
from compiled_llm.models.layers import RMSNorm


class TappedRMSNorm(RMSNorm):
    """A decoder layer's input_layernorm that also writes the layer's input hidden state
    (hidden + residual, the embeddings for layer 0) into rows [:T] of `aux_states`."""

    def __init__(self, norm: RMSNorm, states: torch.Tensor) -> None:
        super().__init__(norm.weight.shape[0], norm.eps)
        self.weight = norm.weight  # the same parameter: names and weights stay the layer's
        # a buffer, so Dynamo lifts it as a graph input and keeps the write in the graph
        self.register_buffer("aux_states", states, persistent=False)

    def forward(self, hidden: torch.Tensor, residual: torch.Tensor | None = None
                ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """RMSNorm's result; the sum it forms (or hidden alone) is copied into aux_states."""
        out = super().forward(hidden, residual)
        # the norm's own sum, not a second add: the add + RMSNorm fusion still matches
        state = hidden if residual is None else out[1]
        # rows by index, not a slice [:T]: torch 2.11 gives the traced slice a length of its
        # own that the copy cannot match to T (Inductor still writes the T rows in place)
        rows = torch.arange(state.shape[0], device=state.device)
        self.aux_states.index_copy_(0, rows, state)
        return out


class AuxHiddenStates:
    """The taps of one target. Invariant: each buffer keeps its address for the target's
    life (graphs captured the writes into it); `ids` may name a layer twice."""

    def __init__(self, ids: list[int], buffers: dict[int, torch.Tensor]) -> None:
        self.ids, self.buffers = list(ids), buffers

    @property
    def rows(self) -> int:
        """The most tokens a forward may write (the step buffers' size)."""
        return len(next(iter(self.buffers.values())))

    def states(self, num_rows: int) -> torch.Tensor:
        """[num_rows, len(ids) * hidden] of the latest target forward, in ids order."""
        return torch.cat([self.buffers[i][:num_rows] for i in self.ids], dim=-1)


def install_aux_taps(model: nn.Module, ids: list[int], rows: int, dtype: torch.dtype,
                     device: torch.device) -> AuxHiddenStates:
    """Tap the input of the layers `ids` of model (a decoder whose model.layers call
    input_layernorm(hidden, residual)) for forwards of up to `rows` tokens; kept as
    model.aux_hidden_states, and in the model's compile factors (its cache key)."""
    layers = getattr(getattr(model, "model", None), "layers", None)
    if not isinstance(layers, nn.ModuleList):
        raise ValueError("speculative_config.method 'eagle3' needs a decoder target with "
                         f"model.layers; {type(model).__name__} has none")
    buffers = {}
    for i in sorted(set(ids)):
        norm = getattr(layers[i], "input_layernorm", None)
        if not isinstance(norm, RMSNorm):
            raise ValueError("speculative_config.method 'eagle3' reads the input of layer "
                             f"{i}, but {type(layers[i]).__name__} has no RMSNorm "
                             "input_layernorm to read it from")
        width = norm.weight.shape[0]
        buffers[i] = torch.zeros(rows, width, dtype=dtype, device=device)
        layers[i].input_layernorm = TappedRMSNorm(norm, buffers[i])
    aux = AuxHiddenStates(ids, buffers)
    model.aux_hidden_states = aux
    # the taps change the compiled graph: on vs off, and which layers, are separate cache keys
    factors = dict(getattr(model, "extra_compile_factors", None) or {})
    factors["aux_hidden_states"] = (sorted(set(ids)), rows, source_hash(Path(__file__)))
    model.extra_compile_factors = factors
    return aux
