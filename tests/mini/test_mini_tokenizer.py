"""The mini tokenizer: exact size, Harmony specials by name, lossless bytes, o200k pre-splitting."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Regex, pre_tokenizers

from tools.mini.chat import ENDOFTEXT, SPECIAL_TOKENS
from tools.mini.tokenizer import O200K_PATTERN, encode_split, train_tokenizer

TEXT = (
    "def parse(self, data: bytes) -> dict[str, int]:\n"
    '    """Parse the header; it\'s UTF-8 (naïve café, 日本語, émoji 🎉)."""\n'
    "\tif   len(data)>=12345678:\r\n        return {'k': 0x1F}  # don't\n\n\n"
)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("corpus")
    documents = [{"kind": "code", "path": f"m{i}.py", "text": TEXT * (i + 1)} for i in range(20)]
    chat = "<|start|>user<|message|>What does parse do?<|end|><|start|>assistant<|channel|>final"
    documents.append(
        {"kind": "chat", "path": "m0.py", "text": chat + "<|message|>It parses.<|return|>"}
    )
    lines = "".join(json.dumps(d, ensure_ascii=False) + "\n" for d in documents)
    (folder / "train.jsonl").write_text(lines, encoding="utf-8")
    return folder


def test_vocabulary_has_the_requested_size_with_specials_last(corpus):
    tokenizer = train_tokenizer(corpus / "train.jsonl", vocab_size=360)
    assert tokenizer.get_vocab_size() == 360
    ids = [tokenizer.token_to_id(t) for t in SPECIAL_TOKENS]
    assert ids == list(range(360 - len(SPECIAL_TOKENS), 360))


def test_round_trip_is_lossless_and_specials_are_single_tokens(corpus):
    tokenizer = train_tokenizer(corpus / "train.jsonl", vocab_size=360)
    text = "<|start|>assistant<|channel|>analysis<|message|>" + TEXT + "<|end|>"
    encoding = tokenizer.encode(text)
    assert tokenizer.decode(encoding.ids, skip_special_tokens=False) == text
    for token in ("<|start|>", "<|channel|>", "<|message|>", "<|end|>"):
        assert encoding.ids.count(tokenizer.token_to_id(token)) == 1
    assert len(encoding.ids) < len(text.encode()) / 2  # merges were learned


def test_an_unknown_vocabulary_size_fails_loudly(corpus):
    with pytest.raises(RuntimeError, match="lower --vocab-size"):
        train_tokenizer(corpus / "train.jsonl", vocab_size=60000)


def test_split_stream_ends_each_document_with_endoftext(corpus):
    tokenizer = train_tokenizer(corpus / "train.jsonl", vocab_size=360)
    stream, stats = encode_split(tokenizer, corpus / "train.jsonl")
    end = tokenizer.token_to_id(ENDOFTEXT)
    assert stream.dtype == np.uint16 and len(stream) == stats["tokens"]
    assert stream[-1] == end and int((stream == end).sum()) == stats["documents"] == 21
    assert stats["code_tokens"] < stats["tokens"]


def test_pre_tokenizer_splits_like_tiktoken_o200k(monkeypatch):
    import regex
    from tiktoken_ext import openai_public

    # The o200k pattern without downloading the ranks.
    monkeypatch.setattr(openai_public, "load_tiktoken_bpe", lambda *args, **kwargs: {})
    expected = regex.findall(openai_public.o200k_base()["pat_str"], TEXT)
    split = pre_tokenizers.Split(Regex(O200K_PATTERN), behavior="isolated")
    assert [piece for piece, _ in split.pre_tokenize_str(TEXT)] == expected
