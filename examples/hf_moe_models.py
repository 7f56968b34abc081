"""Tiny transformers 5 MoE models built from configs (random weights, nothing downloaded).

Shared by ``examples/moe_train.py --hf FAMILY`` and the TopoEP tests: each family is the model
class's own code at a size that runs in milliseconds on a CPU.
"""
from __future__ import annotations

FAMILIES = ("mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "deepseek_v3")


def tiny_config(family: str, experts: int = 8, top_k: int = 2, hidden: int = 32,
                ffn: int = 16, layers: int = 2, vocab: int = 64):
    """A small config of ``family`` with ``experts`` routed experts of which ``top_k`` per
    token; routing as the released models ship it (e.g. Qwen3's renormalised top-k)."""
    import transformers as tf
    common = dict(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=vocab, max_position_embeddings=64,
                  num_experts_per_tok=top_k)
    if family == "mixtral":
        return tf.MixtralConfig(intermediate_size=ffn, num_local_experts=experts, **common)
    if family == "qwen2_moe":
        return tf.Qwen2MoeConfig(moe_intermediate_size=ffn, intermediate_size=2 * ffn,
                                 shared_expert_intermediate_size=ffn, num_experts=experts,
                                 norm_topk_prob=False, **common)
    if family == "qwen3_moe":
        return tf.Qwen3MoeConfig(moe_intermediate_size=ffn, intermediate_size=2 * ffn,
                                 num_experts=experts, norm_topk_prob=True, head_dim=8,
                                 **common)
    if family == "olmoe":
        return tf.OlmoeConfig(intermediate_size=ffn, num_experts=experts, **common)
    if family == "deepseek_v3":
        return tf.DeepseekV3Config(moe_intermediate_size=ffn, intermediate_size=2 * ffn,
                                   n_routed_experts=experts, n_shared_experts=1,
                                   n_group=2, topk_group=1, first_k_dense_replace=0,
                                   q_lora_rank=None, kv_lora_rank=16, qk_rope_head_dim=4,
                                   qk_nope_head_dim=4, v_head_dim=8, **common)
    raise ValueError(f"unknown MoE family {family!r}; one of {', '.join(FAMILIES)}")


def moe_block(family: str, **kw):
    """One MoE block of ``family`` (the module a decoder layer holds as ``mlp``), its
    parameters left uninitialised as the class leaves them (the caller initialises)."""
    import importlib
    config = tiny_config(family, **kw)
    blocks = {
        "mixtral": "mixtral.modeling_mixtral.MixtralSparseMoeBlock",
        "qwen2_moe": "qwen2_moe.modeling_qwen2_moe.Qwen2MoeSparseMoeBlock",
        "qwen3_moe": "qwen3_moe.modeling_qwen3_moe.Qwen3MoeSparseMoeBlock",
        "olmoe": "olmoe.modeling_olmoe.OlmoeSparseMoeBlock",
        "deepseek_v3": "deepseek_v3.modeling_deepseek_v3.DeepseekV3MoE",
    }
    mod, _, cls = blocks[family].rpartition(".")
    return getattr(importlib.import_module(f"transformers.models.{mod}"), cls)(config)


def causal_lm(family: str, **kw):
    """A causal LM of ``family`` (random weights)."""
    import transformers as tf
    return tf.AutoModelForCausalLM.from_config(tiny_config(family, **kw))
