#!/usr/bin/env python3
"""Writes the transformers-made model directories that tests/test_model_hf_files.cpp reads: tiny
random models saved by transformers' own save_pretrained, so lockstep's reader is checked against
files no lockstep code wrote. Needs torch and transformers (PyPI); the output is committed.

Run: python3 tests/data/hf/make_fixtures.py   (writes beside this script)
"""
import os

import torch
import transformers
from transformers import Qwen3Config, Qwen3ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

HERE = os.path.dirname(os.path.abspath(__file__))


def randomize(model, seed):
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, p in model.named_parameters():
            p.copy_(torch.randn(p.shape, generator=gen))


def main():
    moe = Qwen3MoeForCausalLM(Qwen3MoeConfig(
        vocab_size=16, hidden_size=16, intermediate_size=16, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, head_dim=8, num_experts=2,
        num_experts_per_tok=1, moe_intermediate_size=8, mlp_only_layers=[1], norm_topk_prob=True,
        max_position_embeddings=64, rope_theta=5e5, tie_word_embeddings=False))
    randomize(moe, 1)
    moe.to(torch.bfloat16).save_pretrained(os.path.join(HERE, "qwen3_moe_bf16_sharded"),
                                           max_shard_size="1KB")
    dense = Qwen3ForCausalLM(Qwen3Config(
        vocab_size=16, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64,
        tie_word_embeddings=True))  # head_dim not given: transformers writes its default, 128
    randomize(dense, 2)
    dense.save_pretrained(os.path.join(HERE, "qwen3_f32_tied"))
    for d in ("qwen3_moe_bf16_sharded", "qwen3_f32_tied"):
        gen_cfg = os.path.join(HERE, d, "generation_config.json")
        if os.path.exists(gen_cfg):
            os.remove(gen_cfg)
    print(f"wrote fixtures with transformers {transformers.__version__}, torch {torch.__version__}")


if __name__ == "__main__":
    main()
