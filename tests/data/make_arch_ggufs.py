#!/usr/bin/env python3
"""Writes the tiny random-weight GGUF files of tests/data/arch/ with the PyPI
`gguf` package (not snapfill's own writer, so that a misreading shared by
snapfill's writer and reader cannot hide): one file per architecture that
snapfill loads besides llama, each exercising what sets it apart.

  qwen2.gguf  biases on Q, K and V; NeoX RoPE; an untied output head
  qwen3.gguf  RMSNorm on Q and K per head; head size 16 where dim / heads is 8;
              NeoX RoPE; tied embeddings
  llama3.gguf llama with rope_freqs.weight (Llama 3.1's RoPE frequency
              factors, one per rotated pair); one KV head for four query
              heads; an untied output head
  gemma3.gguf Gemma 3: embeddings scaled by sqrt(dim), Q/K norms, norms
              after attention and after the FFN, GELU-tanh gate, NeoX RoPE,
              one KV head for four query heads, tied embeddings, and
              sliding-window layers: a window of 8 positions in every layer
              but each second one, at RoPE base 10000 (the global layers at
              1e6), so that the 17- and 300-token prompts pass the window

Weights are F32 (exact reference math), drawn from numpy's PCG64 with a fixed
seed. The vocabulary is GPT-2's 256 byte tokens, a few merges and three
control tokens. llama.cpp's outputs for these files are in arch_logits.json
(see README.md).

Usage: python3 -m venv .venv && .venv/bin/pip install gguf==0.19.0 numpy
       .venv/bin/python tests/data/make_arch_ggufs.py [OUT_DIR]
"""
import os
import sys

import gguf
import numpy as np


def byte_tokens():
    # GPT-2's bytes_to_unicode: printable bytes stand for themselves, the
    # rest map to U+0100 on, in byte order.
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    table, n = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + n)
            n += 1
    return [table[b] for b in range(256)]


MERGES = ["Ġ t", "h e", "Ġt he", "i n", "Ġ a"]


def vocabulary():
    tokens = byte_tokens()
    for m in MERGES:
        tokens.append(m.replace(" ", ""))
    types = [gguf.TokenType.NORMAL] * len(tokens)
    for special in ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]:
        tokens.append(special)
        types.append(gguf.TokenType.CONTROL)
    return tokens, types


def write(path, arch, *, dim, heads, kv_heads, head_dim, ffn, layers, ctx, biases, qk_norm, tied, seed,
          rope_factors=None, pre="qwen2", rope_base=10000.0, window=0, window_pattern=0, post_norms=False):
    rng = np.random.default_rng(seed)
    tokens, types = vocabulary()
    vocab = len(tokens)
    w = gguf.GGUFWriter(path, arch)
    w.add_name(f"tiny {arch}")
    w.add_block_count(layers)
    w.add_embedding_length(dim)
    w.add_feed_forward_length(ffn)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_context_length(ctx)
    w.add_rope_freq_base(rope_base)
    if window:
        w.add_sliding_window(window)
        w.add_uint32(f"{arch}.attention.sliding_window_pattern", window_pattern)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(MERGES)
    w.add_bos_token_id(vocab - 3)
    w.add_eos_token_id(vocab - 1)
    w.add_add_bos_token(False)

    def mat(rows, cols):
        # Rows of `cols` values (GGUF ne = {cols, rows}); N(0, (0.5/sqrt(cols))^2)
        # keeps activations O(1) through the layers.
        return (rng.standard_normal((rows, cols)) * (0.5 / np.sqrt(cols))).astype(np.float32)

    def gain(n):
        return rng.uniform(0.8, 1.2, n).astype(np.float32)

    q_dim, kv_dim = heads * head_dim, kv_heads * head_dim
    # Small next to the layers' outputs, so that a tied head does not
    # mostly echo the input token.
    w.add_tensor("token_embd.weight", (0.1 * rng.standard_normal((vocab, dim))).astype(np.float32))
    if rope_factors is not None:
        w.add_rope_dimension_count(head_dim)
        w.add_tensor("rope_freqs.weight", np.array(rope_factors, dtype=np.float32))
    for i in range(layers):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", gain(dim))
        w.add_tensor(p + "attn_q.weight", mat(q_dim, dim))
        w.add_tensor(p + "attn_k.weight", mat(kv_dim, dim))
        w.add_tensor(p + "attn_v.weight", mat(kv_dim, dim))
        if biases:
            w.add_tensor(p + "attn_q.bias", (0.3 * rng.standard_normal(q_dim)).astype(np.float32))
            w.add_tensor(p + "attn_k.bias", (0.3 * rng.standard_normal(kv_dim)).astype(np.float32))
            w.add_tensor(p + "attn_v.bias", (0.3 * rng.standard_normal(kv_dim)).astype(np.float32))
        if qk_norm:
            w.add_tensor(p + "attn_q_norm.weight", gain(head_dim))
            w.add_tensor(p + "attn_k_norm.weight", gain(head_dim))
        w.add_tensor(p + "attn_output.weight", mat(dim, q_dim))
        if post_norms:
            w.add_tensor(p + "post_attention_norm.weight", gain(dim))
        w.add_tensor(p + "ffn_norm.weight", gain(dim))
        w.add_tensor(p + "ffn_gate.weight", mat(ffn, dim))
        w.add_tensor(p + "ffn_up.weight", mat(ffn, dim))
        w.add_tensor(p + "ffn_down.weight", mat(dim, ffn))
        if post_norms:
            w.add_tensor(p + "post_ffw_norm.weight", gain(dim))
    w.add_tensor("output_norm.weight", gain(dim))
    if not tied:
        w.add_tensor("output.weight", mat(vocab, dim))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "arch")
    os.makedirs(out, exist_ok=True)
    common = dict(dim=32, heads=4, kv_heads=2, ffn=64, layers=2, ctx=2048)
    write(os.path.join(out, "qwen2.gguf"), "qwen2", head_dim=8, biases=True, qk_norm=False, tied=False,
          seed=2, **common)
    write(os.path.join(out, "qwen3.gguf"), "qwen3", head_dim=16, biases=False, qk_norm=True, tied=True,
          seed=3, **common)
    # Factors over the 8 pairs of a head of 16, from none to 8x, so that they
    # move the angles of the middle pairs by radians within 300 positions
    # (base 10000; Llama 3.1's 500000 and 8192-token ramp would need longer
    # prompts to show).
    write(os.path.join(out, "llama3.gguf"), "llama", dim=32, heads=4, kv_heads=1, head_dim=16, ffn=64, layers=2,
          ctx=2048, biases=False, qk_norm=False, tied=False, seed=4, rope_factors=[1, 1, 1.5, 2, 3, 4, 6, 8],
          pre="llama-bpe")
    write(os.path.join(out, "gemma3.gguf"), "gemma3", dim=32, heads=4, kv_heads=1, head_dim=16, ffn=64, layers=4,
          ctx=2048, biases=False, qk_norm=True, tied=True, seed=5, rope_base=1e6, window=8, window_pattern=2,
          post_norms=True)


if __name__ == "__main__":
    main()
