"""A deterministic random Llama, built offline, for the real-engine tests.

2 layers, hidden size 128, 4 attention heads (4 KV heads of 32), vocabulary 1,000, weights
drawn from a fixed seed: the same model, byte for byte, on every machine, with no hub access
and no tokenizer (the engine runs with ``skip_tokenizer_init`` on token-id prompts). One
KV block of 32 tokens is 2 layers x (K, V) x 4 heads x 32 x 32 tokens x 4 bytes = 64 KiB.
``python _tiny_llama.py DIR`` writes it to DIR.

The size parameters build larger models from the same recipe: ``benchmarks/engine_ttft.py``
uses 8 layers of hidden size 512 (8 heads of 64, MLP 1,536: about 28 M parameters), on which
prefill costs more than an offload copy does.
"""

from __future__ import annotations

import sys
from pathlib import Path

#: The vocabulary the prompts draw from.
VOCAB = 1000


def build_tiny_llama(
    directory: Path,
    seed: int = 0,
    *,
    layers: int = 2,
    hidden: int = 128,
    heads: int = 4,
    intermediate: int = 256,
) -> Path:
    """Write the model's ``config.json`` and safetensors weights to ``directory`` (the tests'
    model by default; larger ones through the size parameters)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        max_position_embeddings=4096,
        # Larger than the usual 0.02: logits far enough apart that greedy decoding does not
        # hinge on the last bits of a float (recompute and reload must agree token for token).
        initializer_range=0.2,
        bos_token_id=1,
        eos_token_id=2,
        torch_dtype="float32",
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory, safe_serialization=True)
    return directory


if __name__ == "__main__":
    build_tiny_llama(Path(sys.argv[1]))
