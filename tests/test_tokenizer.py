"""gossamer.tokenizer against tiktoken's and openai-harmony's o200k_harmony encodings."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gossamer.tokenizer import (
    O200K_PATTERN,
    IncrementalDetokenizer,
    Tokenizer,
    TokenizerError,
    UnknownSpecialTokenError,
    build_byte_level_tokenizer,
)

CORPUS = [
    "Hello world",
    "The quick brown fox jumps over the lazy dog.",
    "  leading spaces\n\n\ttabs   and trailing   ",
    "I'm here, you're there, they'll come, we'd go, it's HIS'S DON'T",
    "12345678901234567890 3.14159 1,000,000 -42 0x1F 1e-10 2024-06-28",
    "def fib(n: int) -> int:\n    if n < 2:\n        return n\n"
    "    return fib(n - 1) + fib(n - 2)\n",
    "for (int i = 0; i < n; ++i) { a[i] += b[i] * 2; }  // C++",
    '{"location": "San Francisco, CA", "unit": "celsius", "days": [1, 2, 3]}',
    "日本語のテキスト、中文文本，한국어 텍스트, Ελληνικά, русский текст, עברית, العربية",
    "emoji 👩‍👩‍👧‍👦 🇫🇷 ✨🤔🎉 👍🏽",
    "Ünïcödé ŝtrïñĝ with combining e\u0301 and ﬁ ligature",
    "a\r\nb\rc\n\n\n   \n\t\n",
    "\u00a0non-breaking\u2003em space\u200bzero width\ufeffbom",
    "http://example.com/a/b?c=d&e=f#frag  path/to/file.py:12",
    "MixedCASE camelCase snake_case SCREAMING_CASE kebab-case",
    "        deeply indented\n                more\n",
    "!!!??? ... --- ___ *** ### $$$ %%% ^^^ &&& ||| ~~~",
    "<|start|>user<|message|>not special here<|end|>",
    "",
    " ",
    "\n",
]


def test_encode_equals_tiktoken_and_openai_harmony(
    harmony_tokenizer: Tokenizer, tiktoken_o200k_harmony, openai_harmony_encoding
):
    for text in CORPUS:
        ids = harmony_tokenizer.encode(text)
        assert ids == tiktoken_o200k_harmony.encode_ordinary(text), text
        assert ids == openai_harmony_encoding.encode(text, disallowed_special=()), text
        assert harmony_tokenizer.decode(ids) == text


@settings(max_examples=150, deadline=None)
@given(text=st.text(max_size=60))
def test_encode_equals_tiktoken_on_random_text(
    harmony_tokenizer: Tokenizer, tiktoken_o200k_harmony, text: str
):
    text = text.encode("utf-8", "replace").decode("utf-8")  # lone surrogates cannot be encoded
    ids = harmony_tokenizer.encode(text)
    assert ids == tiktoken_o200k_harmony.encode_ordinary(text)
    assert harmony_tokenizer.decode(ids) == text


def test_special_tokens_sit_at_their_official_ids(
    harmony_tokenizer: Tokenizer, tiktoken_o200k_harmony
):
    assert harmony_tokenizer.vocab_size == tiktoken_o200k_harmony.n_vocab == 201088
    for name in (
        "<|start|>",
        "<|end|>",
        "<|message|>",
        "<|channel|>",
        "<|constrain|>",
        "<|return|>",
        "<|call|>",
        "<|endoftext|>",
        "<|reserved_200013|>",
    ):
        expected = tiktoken_o200k_harmony.encode_single_token(name)
        assert harmony_tokenizer.special_id(name) == expected
        assert harmony_tokenizer.is_special(expected)
    assert not harmony_tokenizer.is_special(harmony_tokenizer.encode("hello")[0])


def test_special_text_is_plain_text_unless_allowed(
    harmony_tokenizer: Tokenizer, tiktoken_o200k_harmony
):
    text = "<|start|>assistant<|channel|>final<|message|>Hi<|return|>"
    plain = harmony_tokenizer.encode(text)
    assert harmony_tokenizer.special_id("<|start|>") not in plain
    with_special = harmony_tokenizer.encode(text, allow_special=True)
    assert with_special == tiktoken_o200k_harmony.encode(text, allowed_special="all")
    assert harmony_tokenizer.decode(with_special) == text
    assert harmony_tokenizer.decode(with_special, skip_special=True) == "assistantfinalHi"


def test_unknown_special_token_raises_a_clear_key_error(harmony_tokenizer: Tokenizer):
    with pytest.raises(UnknownSpecialTokenError, match="not in this tokenizer") as error:
        harmony_tokenizer.special_id("<|image|>")
    assert isinstance(error.value, KeyError)
    assert "<|image|>" in str(error.value)


def test_token_bytes_match_tiktoken(harmony_tokenizer: Tokenizer, tiktoken_o200k_harmony):
    ids = harmony_tokenizer.encode(CORPUS[9] + CORPUS[8])
    for token_id in [*ids, 0, 255, 199997]:
        expected = tiktoken_o200k_harmony.decode_single_token_bytes(token_id)
        assert harmony_tokenizer.token_bytes(token_id) == expected
    assert harmony_tokenizer.token_bytes(200006) == b"<|start|>"


def test_incremental_detokenizer_holds_back_partial_characters(harmony_tokenizer: Tokenizer):
    text = "🤔 thinking… 日本"
    ids = harmony_tokenizer.encode(text)
    detokenizer = IncrementalDetokenizer(harmony_tokenizer)
    deltas = [detokenizer.feed(token_id) for token_id in ids]
    assert "".join(deltas) == text
    assert all("\ufffd" not in delta for delta in deltas)
    # the emoji spans several byte-level tokens: the first ones give no text yet
    assert len(harmony_tokenizer.encode("🤔")) > 1 and deltas[0] == ""
    assert detokenizer.flush() == ""


def test_incremental_detokenizer_flushes_an_unfinished_character(harmony_tokenizer: Tokenizer):
    first_byte_token = harmony_tokenizer.encode("🤔")[0]
    detokenizer = IncrementalDetokenizer(harmony_tokenizer)
    assert detokenizer.feed(first_byte_token) == ""
    assert detokenizer.has_pending_bytes
    assert detokenizer.flush() == "\ufffd"
    assert detokenizer.feed(harmony_tokenizer.encode("ok")[0]) == "ok"


@settings(max_examples=100, deadline=None)
@given(ids=st.lists(st.integers(0, 199997), max_size=20))
def test_incremental_detokenizer_equals_tiktoken_decode(
    harmony_tokenizer: Tokenizer, tiktoken_o200k_harmony, ids: list[int]
):
    detokenizer = IncrementalDetokenizer(harmony_tokenizer)
    streamed = "".join(detokenizer.feed(token_id) for token_id in ids) + detokenizer.flush()
    assert streamed == tiktoken_o200k_harmony.decode(ids)


def test_incremental_detokenizer_can_skip_special_tokens(harmony_tokenizer: Tokenizer):
    ids = harmony_tokenizer.encode("<|start|>hi<|end|>", allow_special=True)
    keep = IncrementalDetokenizer(harmony_tokenizer)
    skip = IncrementalDetokenizer(harmony_tokenizer, skip_special=True)
    assert "".join(keep.feed(i) for i in ids) == "<|start|>hi<|end|>"
    assert "".join(skip.feed(i) for i in ids) == "hi"


@pytest.fixture
def tiny_tokenizer_json(tmp_path: Path) -> Path:
    """A byte-level tokenizer.json with no merges and a few Harmony tokens: quick to load."""
    names = ["<|return|>", "<|call|>", "<|endoftext|>", "<|start|>"]
    hf = build_byte_level_tokenizer(
        {bytes([b]): b for b in range(256)},
        {name: 256 + i for i, name in enumerate(names)},
        O200K_PATTERN,
    )
    path = tmp_path / "tiny" / "tokenizer.json"
    path.parent.mkdir()
    hf.save(str(path))
    return path


def test_eos_ids_come_from_generation_config(tiny_tokenizer_json: Path):
    folder = tiny_tokenizer_json.parent
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [258, 256]}))
    (folder / "config.json").write_text(json.dumps({"eos_token_id": 1}))
    assert Tokenizer.from_file(folder).eos_token_ids == [258, 256]


def test_eos_ids_fall_back_to_config_then_harmony_stops(tiny_tokenizer_json: Path):
    (tiny_tokenizer_json.parent / "config.json").write_text(json.dumps({"eos_token_id": 7}))
    assert Tokenizer.from_file(tiny_tokenizer_json).eos_token_ids == [7]
    (tiny_tokenizer_json.parent / "config.json").unlink()
    # <|return|>, <|call|>, <|endoftext|>
    assert Tokenizer.from_file(tiny_tokenizer_json).eos_token_ids == [256, 257, 258]


def test_harmony_checkpoint_eos_defaults(harmony_tokenizer: Tokenizer):
    assert harmony_tokenizer.eos_token_ids == [200002, 200012, 199999]


def test_missing_tokenizer_file_says_what_to_do(tmp_path: Path):
    with pytest.raises(TokenizerError, match="build_o200k_harmony_tokenizer_json"):
        Tokenizer.from_file(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(TokenizerError, match="cannot load"):
        Tokenizer.from_file(tmp_path)
