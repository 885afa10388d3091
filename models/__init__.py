"""The model registry: HF `architectures` names -> model classes (vLLM's `ModelRegistry`).

Built-in and out-of-tree models alike register a class or a lazy "package.module:ClassName"
reference, imported on first use; plugins (models/plugins.py) register theirs at load time.
"""

from __future__ import annotations

import importlib
import logging

from compiled_llm.models.config import DecoderConfig

logger = logging.getLogger(__name__)


class _ModelRegistry:
    """Architecture name -> model class, or a "module:Class" str not yet imported.

    Invariant: every value is a class or a str with exactly one ':' and both halves non-empty.
    """

    def __init__(self, models: dict[str, type | str]) -> None:
        self.models: dict[str, type | str] = {}
        for arch, model_cls in models.items():
            self.register_model(arch, model_cls)

    def register_model(self, arch: str, model_cls: type | str) -> None:
        """Map `arch` to a class or to "package.module:ClassName" (imported on first use).
        Registering a name again overrides it, with a warning."""
        if not isinstance(arch, str) or not arch:
            raise ValueError(f"arch must be a non-empty str, got {arch!r}")
        if isinstance(model_cls, str):
            module, _, name = model_cls.partition(":")
            if not module or not name or ":" in name:
                raise ValueError(f'model_cls must be "package.module:ClassName", got {model_cls!r}')
        elif not isinstance(model_cls, type):
            raise ValueError(f"model_cls must be a class or a 'module:Class' str: {model_cls!r}")
        if arch in self.models:
            logger.warning("model architecture %s is already registered; %s overrides it",
                           arch, model_cls)
        self.models[arch] = model_cls

    def get_supported_archs(self) -> list[str]:
        """Every registered architecture name, sorted."""
        return sorted(self.models)

    def resolve_model_cls(self, architectures: list[str] | str) -> type:
        """The class of the first registered name; ValueError naming them all otherwise."""
        names = [architectures] if isinstance(architectures, str) else list(architectures)
        for arch in names:
            if arch in self.models:
                return self._load(arch)
        raise ValueError(f"architectures {names} not supported; "
                         f"supported: {self.get_supported_archs()}")

    def _load(self, arch: str) -> type:
        model_cls = self.models[arch]
        if isinstance(model_cls, str):
            module, _, name = model_cls.partition(":")
            model_cls = getattr(importlib.import_module(module), name)
            self.models[arch] = model_cls  # import once
        return model_cls


ModelRegistry = _ModelRegistry({
    "CohereForCausalLM": "compiled_llm.models.cohere:CohereForCausalLM",
    "Cohere2ForCausalLM": "compiled_llm.models.cohere2:Cohere2ForCausalLM",
    "Exaone4ForCausalLM": "compiled_llm.models.exaone4:Exaone4ForCausalLM",
    "HunYuanDenseV1ForCausalLM": "compiled_llm.models.hunyuan:HunYuanDenseV1ForCausalLM",
    "GPTJForCausalLM": "compiled_llm.models.gptj:GPTJForCausalLM",
    "GPTNeoForCausalLM": "compiled_llm.models.gpt_neo:GPTNeoForCausalLM",
    "CodeGenForCausalLM": "compiled_llm.models.codegen:CodeGenForCausalLM",
    "NanoChatForCausalLM": "compiled_llm.models.nanochat:NanoChatForCausalLM",
    "Cohere2MoeForCausalLM": "compiled_llm.models.cohere2_moe:Cohere2MoeForCausalLM",
    "SolarOpenForCausalLM": "compiled_llm.models.solar_open:SolarOpenForCausalLM",
    "YoutuForCausalLM": "compiled_llm.models.youtu:YoutuForCausalLM",
    "MellumForCausalLM": "compiled_llm.models.mellum:MellumForCausalLM",
    "HyperCLOVAXForCausalLM": "compiled_llm.models.hyperclovax:HyperCLOVAXForCausalLM",
    "HYV3ForCausalLM": "compiled_llm.models.hy_v3:HYV3ForCausalLM",
    "GraniteSWAForCausalLM": "compiled_llm.models.granite_swa:GraniteSWAForCausalLM",
    "AfmoeForCausalLM": "compiled_llm.models.afmoe:AfmoeForCausalLM",
    "MiMoV2FlashForCausalLM": "compiled_llm.models.mimo_v2_flash:MiMoV2FlashForCausalLM",
    "LongcatFlashForCausalLM": "compiled_llm.models.longcat_flash:LongcatFlashForCausalLM",
    "LagunaForCausalLM": "compiled_llm.models.laguna:LagunaForCausalLM",
    "GraniteMoeSWAForCausalLM": "compiled_llm.models.granitemoe_swa:GraniteMoeSWAForCausalLM",
    "HrmTextForCausalLM": "compiled_llm.models.hrm_text:HrmTextForCausalLM",
    "FalconForCausalLM": "compiled_llm.models.falcon:FalconForCausalLM",
    "GlmForCausalLM": "compiled_llm.models.glm:GlmForCausalLM",
    "Glm4ForCausalLM": "compiled_llm.models.glm:Glm4ForCausalLM",
    "GraniteMoeForCausalLM": "compiled_llm.models.granitemoe:GraniteMoeForCausalLM",
    "GraniteMoeSharedForCausalLM":
        "compiled_llm.models.granitemoeshared:GraniteMoeSharedForCausalLM",
    "Glm4MoeForCausalLM": "compiled_llm.models.glm4_moe:Glm4MoeForCausalLM",
    "Dots1ForCausalLM": "compiled_llm.models.dots1:Dots1ForCausalLM",
    "DeepseekV2ForCausalLM": "compiled_llm.models.deepseek:DeepseekV2ForCausalLM",
    "DeepseekV3ForCausalLM": "compiled_llm.models.deepseek:DeepseekV3ForCausalLM",
    "DeepseekV32ForCausalLM": "compiled_llm.models.deepseek_v32:DeepseekV32ForCausalLM",
    "GlmMoeDsaForCausalLM": "compiled_llm.models.deepseek_v32:GlmMoeDsaForCausalLM",
    "AXK1ForCausalLM": "compiled_llm.models.axk1:AXK1ForCausalLM",
    "AXK2ForCausalLM": "compiled_llm.models.axk2:AXK2ForCausalLM",
    "BitNetForCausalLM": "compiled_llm.models.bitnet:BitNetForCausalLM",
    "Glm4MoeLiteForCausalLM": "compiled_llm.models.glm4_moe_lite:Glm4MoeLiteForCausalLM",
    "MiniCPM3ForCausalLM": "compiled_llm.models.minicpm3:MiniCPM3ForCausalLM",
    "ExaoneMoeForCausalLM": "compiled_llm.models.exaone_moe:ExaoneMoeForCausalLM",
    "Ernie4_5_MoeForCausalLM": "compiled_llm.models.ernie4_5_moe:Ernie4_5_MoeForCausalLM",
    "GemmaForCausalLM": "compiled_llm.models.gemma:GemmaForCausalLM",
    "Gemma2ForCausalLM": "compiled_llm.models.gemma2:Gemma2ForCausalLM",
    "Gemma3ForCausalLM": "compiled_llm.models.gemma3:Gemma3ForCausalLM",
    "Gemma4ForCausalLM": "compiled_llm.models.gemma4:Gemma4ForCausalLM",
    "Gemma3nForCausalLM": "compiled_llm.models.gemma3n:Gemma3nForCausalLM",
    "GptOssForCausalLM": "compiled_llm.models.gpt_oss:GptOssForCausalLM",
    "GPTNeoXForCausalLM": "compiled_llm.models.gpt_neox:GPTNeoXForCausalLM",
    "GraniteForCausalLM": "compiled_llm.models.granite:GraniteForCausalLM",
    "LlamaForCausalLM": "compiled_llm.models.llama:LlamaForCausalLM",
    "MistralForCausalLM": "compiled_llm.models.llama:MistralForCausalLM",
    "MixtralForCausalLM": "compiled_llm.models.mixtral:MixtralForCausalLM",
    "OlmoForCausalLM": "compiled_llm.models.olmo:OlmoForCausalLM",
    "Olmo2ForCausalLM": "compiled_llm.models.olmo2:Olmo2ForCausalLM",
    "Olmo3ForCausalLM": "compiled_llm.models.olmo3:Olmo3ForCausalLM",
    "OlmoeForCausalLM": "compiled_llm.models.olmoe:OlmoeForCausalLM",
    "FlexOlmoForCausalLM": "compiled_llm.models.flex_olmo:FlexOlmoForCausalLM",
    "DbrxForCausalLM": "compiled_llm.models.dbrx:DbrxForCausalLM",
    "PhimoeForCausalLM": "compiled_llm.models.phimoe:PhimoeForCausalLM",
    "HunYuanMoEV1ForCausalLM": "compiled_llm.models.hunyuan_v1_moe:HunYuanMoEV1ForCausalLM",
    "MiniMaxM2ForCausalLM": "compiled_llm.models.minimax_m2:MiniMaxM2ForCausalLM",
    "OPTForCausalLM": "compiled_llm.models.opt:OPTForCausalLM",
    "GPT2LMHeadModel": "compiled_llm.models.gpt2:GPT2LMHeadModel",
    "BloomForCausalLM": "compiled_llm.models.bloom:BloomForCausalLM",
    "MptForCausalLM": "compiled_llm.models.mpt:MptForCausalLM",
    "GPTBigCodeForCausalLM": "compiled_llm.models.gpt_bigcode:GPTBigCodeForCausalLM",
    "PhiForCausalLM": "compiled_llm.models.phi:PhiForCausalLM",
    "Phi3ForCausalLM": "compiled_llm.models.phi3:Phi3ForCausalLM",
    "Qwen2ForCausalLM": "compiled_llm.models.llama:Qwen2ForCausalLM",
    "SmolLM3ForCausalLM": "compiled_llm.models.smollm3:SmolLM3ForCausalLM",
    "StableLmForCausalLM": "compiled_llm.models.stablelm:StableLmForCausalLM",
    "Starcoder2ForCausalLM": "compiled_llm.models.starcoder2:Starcoder2ForCausalLM",
    "Qwen2MoeForCausalLM": "compiled_llm.models.qwen2_moe:Qwen2MoeForCausalLM",
    "Qwen3ForCausalLM": "compiled_llm.models.qwen3:Qwen3ForCausalLM",
    "Qwen3MoeForCausalLM": "compiled_llm.models.qwen3_moe:Qwen3MoeForCausalLM",
    "MinistralForCausalLM": "compiled_llm.models.ministral:MinistralForCausalLM",
    "SeedOssForCausalLM": "compiled_llm.models.seed_oss:SeedOssForCausalLM",
    "HeliumForCausalLM": "compiled_llm.models.helium:HeliumForCausalLM",
    "ArceeForCausalLM": "compiled_llm.models.arcee:ArceeForCausalLM",
    "Ernie4_5ForCausalLM": "compiled_llm.models.ernie4_5:Ernie4_5ForCausalLM",
    "NemotronForCausalLM": "compiled_llm.models.nemotron:NemotronForCausalLM",
    "PersimmonForCausalLM": "compiled_llm.models.persimmon:PersimmonForCausalLM",
    "VaultGemmaForCausalLM": "compiled_llm.models.vaultgemma:VaultGemmaForCausalLM",
    "ApertusForCausalLM": "compiled_llm.models.apertus:ApertusForCausalLM",
    "Ministral3ForCausalLM": "compiled_llm.models.ministral3:Ministral3ForCausalLM",
    "CwmForCausalLM": "compiled_llm.models.cwm:CwmForCausalLM",
    "Jais2ForCausalLM": "compiled_llm.models.jais2:Jais2ForCausalLM",
    "Llama4ForCausalLM": "compiled_llm.models.llama4:Llama4ForCausalLM",
    "AriaTextForCausalLM": "compiled_llm.models.aria:AriaTextForCausalLM",
    "Emu3ForCausalLM": "compiled_llm.models.emu3:Emu3ForCausalLM",
    "DiffLlamaForCausalLM": "compiled_llm.models.diffllama:DiffLlamaForCausalLM",
    "JetMoeForCausalLM": "compiled_llm.models.jetmoe:JetMoeForCausalLM",
    "CohereCompassForCausalLM": "compiled_llm.models.cohere_compass:CohereCompassForCausalLM",
    # image-text-to-text checkpoints served text-only: their text_config's model picks the
    # class (models/multimodal.py; Gemma 4's maps on there)
    **dict.fromkeys(("Gemma3ForConditionalGeneration", "Qwen2VLForConditionalGeneration",
                     "Qwen2_5_VLForConditionalGeneration", "Qwen3VLForConditionalGeneration",
                     "Qwen3VLMoeForConditionalGeneration", "Mistral3ForConditionalGeneration",
                     "LlavaForConditionalGeneration", "Gemma4ForConditionalGeneration",
                     "Llama4ForConditionalGeneration", "AriaForConditionalGeneration",
                     "Emu3ForConditionalGeneration", "CohereCompassForConditionalGeneration",
                     "Gemma3nForConditionalGeneration"),
                    "compiled_llm.models.multimodal:ConditionalGeneration"),
    # pooling models (runner="pooling"): embeddings and classifiers
    "BertModel": "compiled_llm.models.bert:BertModel",
    "BertForSequenceClassification": "compiled_llm.models.bert:BertForSequenceClassification",
    "ModernBertModel": "compiled_llm.models.modernbert:ModernBertModel",
    "ModernBertForSequenceClassification":
        "compiled_llm.models.modernbert:ModernBertForSequenceClassification",
    "RobertaModel": "compiled_llm.models.roberta:RobertaModel",
    "XLMRobertaModel": "compiled_llm.models.roberta:RobertaModel",
    "RobertaForSequenceClassification":
        "compiled_llm.models.roberta:RobertaForSequenceClassification",
    "XLMRobertaForSequenceClassification":
        "compiled_llm.models.roberta:RobertaForSequenceClassification",
    "LlamaForSequenceClassification":
        "compiled_llm.models.llama_cls:LlamaForSequenceClassification",
    "Qwen2ForSequenceClassification":
        "compiled_llm.models.llama_cls:Qwen2ForSequenceClassification",
    "Qwen3ForSequenceClassification":
        "compiled_llm.models.llama_cls:Qwen3ForSequenceClassification",
    "MistralForSequenceClassification":
        "compiled_llm.models.llama_cls:MistralForSequenceClassification",
    "LlamaModel": "compiled_llm.models.llama_cls:LlamaEmbeddingModel",
    "MistralModel": "compiled_llm.models.llama_cls:MistralEmbeddingModel",
    "Qwen2Model": "compiled_llm.models.llama_cls:Qwen2EmbeddingModel",
    "Qwen3Model": "compiled_llm.models.llama_cls:Qwen3EmbeddingModel",
    "Gemma3TextModel": "compiled_llm.models.llama_cls:Gemma3EmbeddingModel",
})

__all__ = ["DecoderConfig", "ModelRegistry"]
