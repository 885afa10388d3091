"""This stop's encoders on CUDA (GPU only): ModernBERT's and EmbeddingGemma's local layers
through the Triton kernel's bidirectional window, RoBERTa's offset positions and a Dense
projection, compiled, each equal to transformers' float32 run on the CPU."""

from __future__ import annotations

import pytest
import torch

from compiled_llm import LLM
from compiled_llm.pooling_params import PoolingParams
from tests.entrypoints.pooling.checkpoints import hf_encoder, st_bert
from tests.entrypoints.pooling.test_bare_decoders import embedding_gemma
from tests.entrypoints.pooling.test_modernbert import modernbert
from tests.entrypoints.pooling.test_roberta import roberta

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

TEXTS = ["a short one", "A somewhat longer sentence, with punctuation! And a second clause, "
         "long enough that the local layers' window matters on either side of every token.",
         "ok"]


@pytest.mark.parametrize("kind", ["modernbert", "embedding_gemma", "roberta"])
def test_encoder_on_cuda_matches_transformers(kind):
    ckpt = {"modernbert": modernbert, "embedding_gemma": embedding_gemma,
            "roberta": lambda: roberta("xlm")}[kind]()
    pooling = "MEAN" if kind == "embedding_gemma" else "CLS"
    texts = TEXTS if kind != "roberta" else [TEXTS[0], TEXTS[2]]  # its 77-token positions
    with LLM(str(ckpt), dtype="float32", pooler_config={"pooling_type": pooling}) as llm:
        assert llm.engine.device.type == "cuda"
        ours = torch.tensor([o.outputs.embedding for o in
                             llm.embed(texts, PoolingParams(normalize=False))])
    hf, tok = hf_encoder(ckpt, classifier=False)
    for row, text in zip(ours, texts, strict=True):
        with torch.no_grad():
            hidden = hf(**tok(text, return_tensors="pt")).last_hidden_state[0]
        ref = hidden.mean(0) if pooling == "MEAN" else hidden[0]
        torch.testing.assert_close(row, ref, atol=1e-2, rtol=1e-2)  # TF32 matmuls


def test_dense_projection_on_cuda_matches_sentence_transformers():
    pytest.importorskip("sentence_transformers")
    from sentence_transformers import SentenceTransformer

    model = st_bert("cls", dense=(48, 32))
    ref = SentenceTransformer(str(model), device="cpu").encode(TEXTS, convert_to_tensor=True)
    with LLM(str(model), dtype="float32") as llm:
        ours = torch.tensor([o.outputs.embedding for o in llm.embed(TEXTS)])
    torch.testing.assert_close(ours, ref.float(), atol=1e-2, rtol=1e-2)
