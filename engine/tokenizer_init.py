"""The random checkpoint's tokenizer: a byte-level BPE of the model's vocabulary size, trained at init.

Training is deterministic: the same vocabulary size gives the same
``tokenizer.json``, byte for byte.  The text is ``data/tokenizer_corpus.txt``,
shipped with the package (a frozen copy of the project's documentation:
changing it changes the tokenizer of every checkpoint written afterwards).

Layout of the vocabulary (``vocab_size`` ids in all, the model's own size):
the 256 byte-level symbols, then the merges in training order, then
``<|reserved_N|>`` special tokens if the text yields fewer merges than there
is room for (a large vocabulary), and the three special tokens of the chat
template last: ``<|endoftext|>``, ``<|im_start|>``, ``<|im_end|>``.

``tokenizer_config.json`` carries a ChatML chat template and, as ``moeslo
model init`` writes it, names ``<|endoftext|>`` the eos token
(:func:`eos_token_id`; the checkpoint's ``config.json`` and
``generation_config.json`` name it too, so the engine, vLLM and transformers
all stop there unless a request ignores eos).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tokenizers import Tokenizer as RustTokenizer

CORPUS = Path(__file__).parent / "data" / "tokenizer_corpus.txt"
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
EOS_TOKEN = "<|endoftext|>"
BYTE_SYMBOLS = 256
MIN_VOCAB_SIZE = BYTE_SYMBOLS + len(SPECIAL_TOKENS) + 1
"""Below this a vocabulary has no room for merges: such a checkpoint keeps the byte-level tokenizer."""

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
"""ChatML: each message as ``<|im_start|>role\\ncontent<|im_end|>\\n``, then the assistant's turn opening."""


def eos_token_id(vocab_size: int) -> int:
    """The id of ``<|endoftext|>`` in the tokenizer of ``vocab_size`` (the special tokens are the last ids)."""
    return vocab_size - len(SPECIAL_TOKENS) + SPECIAL_TOKENS.index(EOS_TOKEN)


def train_tokenizer(vocab_size: int) -> RustTokenizer:
    """A byte-level BPE with exactly ``vocab_size`` ids (see the module doc for the layout)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

    if vocab_size < MIN_VOCAB_SIZE:
        raise ValueError(f"a BPE tokenizer needs vocab_size >= {MIN_VOCAB_SIZE}, got {vocab_size}")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    room = vocab_size - len(SPECIAL_TOKENS)
    trainer = trainers.BpeTrainer(vocab_size=room, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(CORPUS.read_text(encoding="utf-8").splitlines(), trainer)
    trained = tok.get_vocab_size(with_added_tokens=True)
    reserved = [AddedToken(f"<|reserved_{i}|>", special=True) for i in range(room - trained)]
    specials = [AddedToken(text, special=True) for text in SPECIAL_TOKENS]
    tok.add_special_tokens([*reserved, *specials])
    assert tok.get_vocab_size(with_added_tokens=True) == vocab_size
    assert tok.token_to_id(EOS_TOKEN) == eos_token_id(vocab_size)
    return tok


def write_tokenizer(out_dir: Path, vocab_size: int, *, max_model_len: int, name_eos: bool = True) -> bool:
    """Write ``tokenizer.json`` and ``tokenizer_config.json``; False (nothing written) for a tiny vocabulary.

    ``name_eos``: ``tokenizer_config.json`` names ``<|endoftext|>`` the eos token (engines stop there)."""
    if vocab_size < MIN_VOCAB_SIZE:
        return False
    out = Path(out_dir)
    train_tokenizer(vocab_size).save(str(out / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "chat_template": CHAT_TEMPLATE,
        "bos_token": None,
        "eos_token": EOS_TOKEN if name_eos else None,
        "pad_token": EOS_TOKEN,
        "model_max_length": max_model_len,
        "clean_up_tokenization_spaces": False,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    return True


__all__ = ["CHAT_TEMPLATE", "CORPUS", "EOS_TOKEN", "MIN_VOCAB_SIZE", "SPECIAL_TOKENS", "eos_token_id",
           "train_tokenizer", "write_tokenizer"]
