"""Write a tiny random Llama checkpoint (and an offline byte-level tokenizer) for real-SGLang tests.

    python dev/sglang_tiny_model.py DEST [--seed 0] [--layers 2]

Run it with the Python of an environment made by ``dev/sglang_env.sh`` (it needs torch,
transformers, tokenizers and safetensors, all there). Nothing is downloaded: the weights come
from ``torch.manual_seed(seed)`` and the tokenizer is built here, 256 byte tokens plus
``<s>``/``</s>``/``<pad>``, saved as a ``PreTrainedTokenizerFast``. The same seed gives the same
checkpoint for one torch version. Prints DEST. Idempotent: an existing complete DEST is kept.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

VOCAB_SIZE = 320  # 256 bytes + 3 specials, padded up to a multiple of 64
SPECIALS = ("<s>", "</s>", "<pad>")


def _bytes_to_unicode() -> dict[int, str]:
    # GPT-2's reversible byte -> printable character table, as tokenizers' ByteLevel expects.
    bs = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs)))


def build_tokenizer():
    from tokenizers import Tokenizer
    from tokenizers import decoders
    from tokenizers import models
    from tokenizers import pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {SPECIALS[i]: i for i in range(len(SPECIALS))}
    for byte, char in sorted(_bytes_to_unicode().items()):
        vocab[char] = len(SPECIALS) + byte
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], fuse_unk=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(list(SPECIALS))
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        model_max_length=4096,
    )


def write(dest: Path, seed: int = 0, layers: int = 2) -> Path:
    if (dest / ".complete").exists():
        return dest
    import torch
    from transformers import LlamaConfig
    from transformers import LlamaForCausalLM

    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=dest.name + ".", dir=dest.parent))
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=4096,
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=2,
        tie_word_embeddings=False,
        torch_dtype="float32",
    )
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():  # larger logits than the default init, so greedy top-2 gaps are wide
        model.lm_head.weight.mul_(20.0)
    model.save_pretrained(tmp, safe_serialization=True)
    build_tokenizer().save_pretrained(tmp)
    (tmp / ".complete").write_text(
        json.dumps({"seed": seed, "layers": layers, "torch": torch.__version__})
    )
    if dest.exists():
        import shutil

        shutil.rmtree(dest)
    os.replace(tmp, dest)
    return dest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dest", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--layers", type=int, default=2)
    args = parser.parse_args(argv)
    print(write(args.dest, args.seed, args.layers))
    return 0


if __name__ == "__main__":
    sys.exit(main())
