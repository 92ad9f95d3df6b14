"""Prompt text of a chosen token length, and token counting.

With a tokenizer (`--tokenizer path/to/tokenizer.json` or a folder holding one) prompts have the
exact token count asked for: they are built from vocabulary entries that are whole words, then
re-encoded and trimmed or extended until the count matches. Without one, a prompt is a string of
common English words that are single tokens in the GPT-OSS (o200k) vocabulary, so the length is
exact for GPT-OSS text (tested with tiktoken) and a close estimate for other vocabularies; the
metrics use the server's `usage.prompt_tokens` whenever it is sent.
"""

from __future__ import annotations

import random
import re
from pathlib import Path
from typing import Protocol

from gossamer.bench.errors import BenchConfigError

# NOTE: each is one token (with its leading space) in o200k_base, the GPT-OSS vocabulary.
COMMON_WORDS: tuple[str, ...] = tuple(
    " " + word
    for word in (
        "the of and to in is that for it with as was on be by this are from at or have an they "
        "which one you had not but all were when we there can been has more if will would who "
        "so what their up out about into than them some time could these two may first then "
        "do any like my now over such our man me even most made after also did many before "
        "must through back years where much your way well down should because each just those "
        "people how too little state good very make world still own see men work long get here "
        "between both life being under never day same another know while last might us great "
        "old year off come since against go came right used take three"
    ).split()
)

# A vocabulary entry that is a lowercase word with its word-start marker (byte-level "Ġ",
# SentencePiece "▁" or a plain space).
_WORD_ENTRY = re.compile(r"[Ġ▁ ]([a-z]{3,8})")
_MAX_WORD_CANDIDATES = 4000
_MIN_WORDS = 16
_MAX_ADJUST_ROUNDS = 8


class PromptBuilder(Protocol):
    """Makes prompt text of a given token length and counts tokens in text."""

    exact: bool  # True when counts come from the model's tokenizer, False for estimates

    def make(self, num_tokens: int, rng: random.Random) -> str: ...

    def count(self, text: str) -> int: ...


class WordPromptBuilder:
    """No tokenizer: one common word is about one token; text counts are estimated."""

    exact = False

    def make(self, num_tokens: int, rng: random.Random) -> str:
        return "".join(rng.choice(COMMON_WORDS) for _ in range(num_tokens)).lstrip()

    def count(self, text: str) -> int:
        # About 4 characters per token for English text in BPE vocabularies.
        return max(1, round(len(text) / 4)) if text else 0


class TokenizerPromptBuilder:
    """Exact token counts with a Hugging Face `tokenizers` tokenizer."""

    exact = True

    def __init__(self, tokenizer) -> None:  # tokenizer: tokenizers.Tokenizer
        self.tokenizer = tokenizer
        self.words = _single_token_words(tokenizer)

    def count(self, text: str) -> int:
        return len(self.tokenizer.encode(text, add_special_tokens=False).ids)

    def make(self, num_tokens: int, rng: random.Random) -> str:
        if num_tokens <= 0:
            return ""
        words = [rng.choice(self.words) for _ in range(num_tokens)]
        for _ in range(_MAX_ADJUST_ROUNDS):
            missing = num_tokens - self.count("".join(words))
            if missing == 0:
                break
            if missing > 0:
                words += [rng.choice(self.words) for _ in range(missing)]
            else:
                words = words[: max(1, len(words) + missing)]
        return "".join(words)


def load_tokenizer(path: str | Path):
    """A `tokenizers.Tokenizer` from a tokenizer.json file or a folder holding one."""
    from tokenizers import Tokenizer  # imported here: only needed with --tokenizer

    path = Path(path)
    file = path / "tokenizer.json" if path.is_dir() else path
    if not file.is_file():
        raise BenchConfigError(
            f"no tokenizer at {file}: pass --tokenizer a tokenizer.json file or a model folder "
            "that contains one"
        )
    return Tokenizer.from_file(str(file))


def make_prompt_builder(tokenizer_path: str | None) -> PromptBuilder:
    if tokenizer_path is None:
        return WordPromptBuilder()
    return TokenizerPromptBuilder(load_tokenizer(tokenizer_path))


def _single_token_words(tokenizer) -> list[str]:
    """Words (with a leading space) that encode to exactly one token in the middle of text,
    so that a string of them has as many tokens as words."""
    vocab: dict[str, int] = tokenizer.get_vocab()
    # Low ids are the earliest merges: the most common, most stable words.
    candidates = sorted(
        (i, m.group(1)) for t, i in vocab.items() if (m := _WORD_ENTRY.fullmatch(t))
    )
    anchor = len(tokenizer.encode("the", add_special_tokens=False).ids)
    words = []
    for token_id, letters in candidates[:_MAX_WORD_CANDIDATES]:
        ids = tokenizer.encode("the " + letters, add_special_tokens=False).ids
        if len(ids) == anchor + 1 and ids[-1] == token_id:
            words.append(" " + letters)
    if len(words) < _MIN_WORDS:
        raise BenchConfigError(
            f"the tokenizer has only {len(words)} plain word tokens, too few to build random "
            "prompts of exact length; run without --tokenizer to use estimated lengths"
        )
    return words
