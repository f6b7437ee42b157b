"""A tiny TRL SFTTrainer run on CPU: a GPT-2-shaped model built from a config, a word-level
tokenizer built in memory, random sentences. Nothing is downloaded."""

import random

import torch

WORDS = "the a cat dog sat on mat ran fast slow big small red blue green under over near".split()


def tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<eos>": 1, "<unk>": 2, **{w: i + 3 for i, w in enumerate(WORDS)}}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tk, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")


def model(tied=True, dtype=torch.float32):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=1024,  # rows past the tokenizer's: a head big enough to see n_positions=32,
                        bos_token_id=1, eos_token_id=1, pad_token_id=0, tie_word_embeddings=tied)
    return GPT2LMHeadModel(config).to(dtype)


def dataset(n=64):
    from datasets import Dataset

    r = random.Random(0)
    return Dataset.from_dict({"text": [" ".join(r.choice(WORDS) for _ in range(12)) for _ in range(n)]})


def sft_trainer(output_dir, callback, *, max_steps=3, save_steps=100, tied=True, peft=False, lr=1e-3,
                dtype=torch.float32, run_name=None):
    from trl import SFTConfig, SFTTrainer

    peft_config = None
    if peft:
        from peft import LoraConfig

        peft_config = LoraConfig(r=4, lora_alpha=8, target_modules=["c_attn"], fan_in_fan_out=True,
                                 task_type="CAUSAL_LM")
    # save_steps None: no checkpoints at all (the Trainer otherwise saves one at the last step)
    args = SFTConfig(output_dir=str(output_dir), max_steps=max_steps, save_steps=save_steps or 100,
                     save_strategy="steps" if save_steps else "no",
                     per_device_train_batch_size=4, logging_steps=1, report_to=[], use_cpu=True, learning_rate=lr,
                     disable_tqdm=True, bf16=dtype == torch.bfloat16, run_name=run_name)
    callbacks = callback if isinstance(callback, list) else [callback]
    return SFTTrainer(model=model(tied, dtype), args=args, train_dataset=dataset(), processing_class=tokenizer(),
                      peft_config=peft_config, callbacks=callbacks)
