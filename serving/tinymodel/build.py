"""Build the tiny Llama used by tests and demos: deterministic, offline, ~3 MB.

Run with a Python that has torch, transformers and tokenizers (the vLLM venv has all three):

    .venv-vllm/bin/python serving/tinymodel/build.py OUT_DIR

- Tokenizer: byte-level BPE, vocabulary 2048, trained with `tokenizers` on `corpus.txt` (shipped
  in this folder, authored text) with special tokens for bos/eos and ChatML roles, plus a
  ChatML-style `chat_template`.
- Model: LlamaConfig(hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
  intermediate_size=256, max_position_embeddings=2048), weights drawn with torch seed 0,
  saved with `save_pretrained` as safetensors.

Same inputs, same bytes: training runs single-threaded and every seed is fixed, so
`serving.tinymodel.ensure_tiny_model` can cache the result under a hash of this file and the corpus.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ["TOKENIZERS_PARALLELISM"] = "false"
os.environ.setdefault("RAYON_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

HERE = Path(__file__).resolve().parent
VOCAB_SIZE = 2048
BOS, EOS, PAD = "<|begin_of_text|>", "<|endoftext|>", "<|pad|>"
IM_START, IM_END = "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS = [PAD, BOS, EOS, IM_START, IM_END]
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def build_tokenizer(out: Path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train([str(HERE / "corpus.txt")], trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        additional_special_tokens=[IM_START, IM_END],
        clean_up_tokenization_spaces=False,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)
    return fast


def build_model(out: Path, tokenizer) -> None:
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        intermediate_size=256,
        max_position_embeddings=2048,
        bos_token_id=tokenizer.convert_tokens_to_ids(BOS),
        eos_token_id=tokenizer.convert_tokens_to_ids(EOS),
        pad_token_id=tokenizer.convert_tokens_to_ids(PAD),
        tie_word_embeddings=False,
        torch_dtype="float32",
    )
    model = LlamaForCausalLM(config)
    model.generation_config = GenerationConfig(
        bos_token_id=config.bos_token_id, eos_token_id=config.eos_token_id, pad_token_id=config.pad_token_id
    )
    model.save_pretrained(out, safe_serialization=True)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: build.py OUT_DIR", file=sys.stderr)
        return 2
    out = Path(argv[0])
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(out)
    build_model(out, tokenizer)
    (out / "infermeter-tiny-model.json").write_text(
        json.dumps({"vocab_size": len(tokenizer), "built_by": "serving/tinymodel/build.py"}, indent=2)
    )
    print(f"tiny model written to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
