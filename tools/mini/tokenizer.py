"""The gpt-oss-mini tokenizer: a byte-level BPE trained on the corpus's train split.

Same pipeline shape as the GPT-OSS tokenizer.json (o200k split regex, then byte-level mapping, no
normaliser, no BOS), a much smaller vocabulary, and the Harmony special tokens appended last,
in o200k_harmony's relative order. The engine looks special tokens up by name, never by id.

    python -m tools.mini.tokenizer --corpus /tmp/mini/corpus --out /tmp/mini/data --vocab-size 8192
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

from gossamer.tokenizer import O200K_PATTERN
from tools.mini.chat import ENDOFTEXT, SPECIAL_TOKENS
from tools.mini.corpus import SPLITS, read_documents

SPECIAL_SPLIT = re.compile("|".join(re.escape(token) for token in SPECIAL_TOKENS))


def new_tokenizer() -> Tokenizer:
    """An untrained byte-level BPE with GPT-OSS's pre-tokeniser and decoder."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(O200K_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer


def text_segments(train_jsonl: Path) -> Iterator[str]:
    """Document text between special tokens: merges never learn across (or into) a special token."""
    for document in read_documents(train_jsonl):
        for segment in SPECIAL_SPLIT.split(document["text"]):
            if segment:
                yield segment


def train_tokenizer(train_jsonl: Path, vocab_size: int) -> Tokenizer:
    """BPE over the train split; the result has exactly `vocab_size` tokens, specials last."""
    tokenizer = new_tokenizer()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(SPECIAL_TOKENS),
        min_frequency=2,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(text_segments(train_jsonl), trainer)
    tokenizer.add_special_tokens(
        [AddedToken(token, special=True, normalized=False) for token in SPECIAL_TOKENS]
    )
    if tokenizer.get_vocab_size() != vocab_size:
        raise RuntimeError(
            f"the corpus only supports {tokenizer.get_vocab_size()} tokens; lower --vocab-size"
        )
    return tokenizer


def encode_split(tokenizer: Tokenizer, jsonl: Path) -> tuple[np.ndarray, dict[str, int]]:
    """All documents of a split as one uint16 stream, each followed by <|endoftext|>."""
    documents = list(read_documents(jsonl))
    encodings = tokenizer.encode_batch([d["text"] for d in documents], add_special_tokens=False)
    end = tokenizer.token_to_id(ENDOFTEXT)
    stats = {"documents": len(documents), "tokens": 0, "bytes": 0, "code_tokens": 0}
    pieces = []
    for document, encoding in zip(documents, encodings, strict=True):
        ids = encoding.ids + [end]
        pieces.append(np.asarray(ids, dtype=np.uint16))
        stats["tokens"] += len(ids)
        stats["bytes"] += len(document["text"].encode("utf-8"))
        if document["kind"] == "code":
            stats["code_tokens"] += len(ids)
    stream = np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.uint16)
    return stream, stats


def build_token_data(corpus_dir: Path, out_dir: Path, vocab_size: int) -> dict:
    """tokenizer.json + {split}.npy token streams + tokens.json (counts) under out_dir."""
    _check_fits_uint16(vocab_size)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = train_tokenizer(corpus_dir / "train.jsonl", vocab_size)
    tokenizer.save(str(out_dir / "tokenizer.json"))
    return encode_corpus(tokenizer, corpus_dir, out_dir)


def build_token_data_with(tokenizer_file: Path, corpus_dir: Path, out_dir: Path) -> dict:
    """As build_token_data, but with an existing tokenizer.json, copied byte for byte instead of
    training one: a draft model must share its target's tokenizer."""
    out_dir.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(tokenizer_file, out_dir / "tokenizer.json")
    return encode_corpus(Tokenizer.from_file(str(tokenizer_file)), corpus_dir, out_dir)


def encode_corpus(tokenizer: Tokenizer, corpus_dir: Path, out_dir: Path) -> dict:
    """{split}.npy token streams and tokens.json (counts) under out_dir."""
    vocab_size = tokenizer.get_vocab_size()
    _check_fits_uint16(vocab_size)
    summary: dict = {"vocab_size": vocab_size, "splits": {}}
    for split in SPLITS:
        stream, stats = encode_split(tokenizer, corpus_dir / f"{split}.jsonl")
        np.save(out_dir / f"{split}.npy", stream)
        summary["splits"][split] = stats
    (out_dir / "tokens.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def _check_fits_uint16(vocab_size: int) -> None:
    if vocab_size > 1 << 16:
        raise ValueError("token streams are uint16: vocab_size must be at most 65536")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--corpus", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--vocab-size", type=int, default=8192)
    args = parser.parse_args(argv)
    summary = build_token_data(args.corpus, args.out, args.vocab_size)
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
