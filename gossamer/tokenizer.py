"""Tokenizer: a HF `tokenizers` tokenizer.json behind a small API, special-token ids by name.

Also builds an o200k_harmony tokenizer.json (the GPT-OSS encoding) from tiktoken's
`o200k_base.tiktoken` ranks plus the Harmony special tokens, so tests and dummy-weight runs
need no download.
"""

from __future__ import annotations

import base64
import codecs
import json
from collections.abc import Iterable, Sequence
from pathlib import Path

import tokenizers
from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers

TOKENIZER_FILE = "tokenizer.json"

# The pre-tokenizer regex of tiktoken's o200k_base (and so o200k_harmony): words with an
# optional leading non-letter and English contractions, numbers in groups of 1-3 digits,
# punctuation runs, newlines, and whitespace runs that leave their last space to the next word.
O200K_PATTERN = "|".join(
    [
        r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
        r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
        r"\p{N}{1,3}",
        r" ?[^\s\p{L}\p{N}]+[\r\n/]*",
        r"\s*[\r\n]+",
        r"\s+(?!\S)",
        r"\s+",
    ]
)

# Used when a checkpoint names no eos ids: the Harmony stop tokens, then the plain end of text.
DEFAULT_EOS_TOKENS = ("<|return|>", "<|call|>", "<|endoftext|>")


class TokenizerError(ValueError):
    """A tokenizer file is missing or unusable."""


class UnknownSpecialTokenError(KeyError):
    """A special token asked for by name is not in the vocabulary."""

    def __str__(self) -> str:  # KeyError would print the repr of the message
        return str(self.args[0]) if self.args else ""


class Tokenizer:
    """A tokenizer.json (HF `tokenizers`) with special-token lookup and byte-exact decoding.

    Takes over `hf_tokenizer`: it is switched to reading special-token text as plain text.
    """

    def __init__(self, hf_tokenizer: tokenizers.Tokenizer, eos_token_ids: Sequence[int] = ()):
        # NOTE: this instance reads special-token text as plain text, so that user text with
        # "<|start|>" in it cannot inject structure (tiktoken's encode_ordinary). A copy that
        # splits out special tokens is made on first use: it is rarely needed.
        self._hf = hf_tokenizer
        self._hf.encode_special_tokens = True
        self._hf_with_special: tokenizers.Tokenizer | None = None
        self._special_ids = {
            token.content: token_id
            for token_id, token in hf_tokenizer.get_added_tokens_decoder().items()
            if token.special
        }
        self._special_id_set = frozenset(self._special_ids.values())
        self.eos_token_ids = list(eos_token_ids) or self._default_eos_ids()
        self._token_bytes: list[bytes] | None = None

    @classmethod
    def from_file(cls, path: str | Path) -> Tokenizer:
        """Load `path` (a tokenizer.json, or a checkpoint folder holding one). The eos ids come
        from the folder's generation_config.json or config.json when present."""
        file = _find_tokenizer_file(Path(path))
        try:
            hf_tokenizer = tokenizers.Tokenizer.from_file(str(file))
        except Exception as error:  # tokenizers raises a bare Exception on bad JSON
            raise TokenizerError(f"cannot load {file}: {error}") from error
        return cls(hf_tokenizer, _eos_ids_from_checkpoint(file.parent))

    @property
    def vocab_size(self) -> int:
        return self._hf.get_vocab_size(with_added_tokens=True)

    @property
    def special_token_ids(self) -> dict[str, int]:
        return dict(self._special_ids)

    def special_id(self, name: str) -> int:
        """The id of special token `name`, e.g. "<|start|>"."""
        token_id = self._special_ids.get(name)
        if token_id is None:
            raise UnknownSpecialTokenError(
                f"special token {name!r} is not in this tokenizer; use a tokenizer.json with the "
                "Harmony special tokens (o200k_harmony, as shipped with GPT-OSS checkpoints)"
            )
        return token_id

    def has_special(self, name: str) -> bool:
        return name in self._special_ids

    def is_special(self, token_id: int) -> bool:
        return token_id in self._special_id_set

    def encode(self, text: str, allow_special: bool = False) -> list[int]:
        """Token ids of `text`; special-token text is plain text unless `allow_special`."""
        tokenizer = self._special_splitting_tokenizer() if allow_special else self._hf
        return tokenizer.encode(text, add_special_tokens=False).ids

    def _special_splitting_tokenizer(self) -> tokenizers.Tokenizer:
        if self._hf_with_special is None:
            copy = tokenizers.Tokenizer.from_str(self._hf.to_str())
            copy.encode_special_tokens = False
            self._hf_with_special = copy
        return self._hf_with_special

    def decode(self, ids: Iterable[int], skip_special: bool = False) -> str:
        return self._hf.decode(list(ids), skip_special_tokens=skip_special)

    def token_bytes(self, token_id: int) -> bytes:
        """The exact bytes of one token (a piece of a UTF-8 character for byte-level tokens)."""
        if self._token_bytes is None:
            self._token_bytes = self._build_token_bytes()
        if 0 <= token_id < len(self._token_bytes):
            return self._token_bytes[token_id]
        return b""

    def _build_token_bytes(self) -> list[bytes]:
        """Byte-level vocab entries spell bytes as printable characters; added tokens (the
        special ones) are stored as their plain text."""
        table = [b""] * self.vocab_size
        added = {token.content for token in self._hf.get_added_tokens_decoder().values()}
        byte_level = _is_byte_level(self._hf.decoder)
        for token, token_id in self._hf.get_vocab(with_added_tokens=True).items():
            if token in added:
                table[token_id] = token.encode()
            elif byte_level:
                table[token_id] = bytes(UNICODE_TO_BYTE[char] for char in token)
            else:
                table[token_id] = self.decode([token_id]).encode()
        return table

    def _default_eos_ids(self) -> list[int]:
        return [self._special_ids[name] for name in DEFAULT_EOS_TOKENS if name in self._special_ids]


class IncrementalDetokenizer:
    """Turns token ids, fed one at a time, into text deltas that are safe to show.

    A byte-level token can end in the middle of a UTF-8 character; those bytes are held back
    until the character is complete (invalid bytes become U+FFFD, as tiktoken's decode does).
    """

    def __init__(self, tokenizer: Tokenizer, skip_special: bool = False):
        self._tokenizer = tokenizer
        self._skip_special = skip_special
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, token_id: int) -> str:
        """The text that `token_id` completes ("" while a character is still incomplete)."""
        if self._skip_special and self._tokenizer.is_special(token_id):
            return ""
        return self._utf8.decode(self._tokenizer.token_bytes(token_id))

    def flush(self) -> str:
        """Whatever is held back, with U+FFFD for an unfinished character; then start afresh."""
        text = self._utf8.decode(b"", final=True)
        self._utf8.reset()
        return text

    @property
    def has_pending_bytes(self) -> bool:
        return bool(self._utf8.getstate()[0])


def _is_byte_level(decoder: object) -> bool:
    return isinstance(decoder, decoders.ByteLevel)


def _find_tokenizer_file(path: Path) -> Path:
    file = path / TOKENIZER_FILE if path.is_dir() else path
    if not file.is_file():
        raise TokenizerError(
            f"no tokenizer at {file}; pass a tokenizer.json or a checkpoint folder with one "
            "(for o200k_harmony, build one with "
            "gossamer.tokenizer.build_o200k_harmony_tokenizer_json)"
        )
    return file


def _eos_ids_from_checkpoint(folder: Path) -> list[int]:
    for name in ("generation_config.json", "config.json"):
        config_file = folder / name
        if not config_file.is_file():
            continue
        eos = json.loads(config_file.read_text()).get("eos_token_id")
        if eos is not None:
            return [eos] if isinstance(eos, int) else list(eos)
    return []


# ---------------------------------------------------------------------------------------------
# Byte-level BPE: bytes <-> printable unicode characters, as GPT-2 and HF ByteLevel define it.
# ---------------------------------------------------------------------------------------------


def _byte_to_unicode() -> dict[int, str]:
    """Printable latin-1 bytes stand for themselves; the other 68 bytes map to chr(256 + n)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    mapping = {byte: chr(byte) for byte in printable}
    shifted = (byte for byte in range(256) if byte not in mapping)
    for offset, byte in enumerate(shifted):
        mapping[byte] = chr(256 + offset)
    return mapping


BYTE_TO_UNICODE = _byte_to_unicode()
UNICODE_TO_BYTE = {char: byte for byte, char in BYTE_TO_UNICODE.items()}


def _bytes_to_token_text(token: bytes) -> str:
    return "".join(BYTE_TO_UNICODE[byte] for byte in token)


# ---------------------------------------------------------------------------------------------
# o200k_harmony tokenizer.json from tiktoken ranks
# ---------------------------------------------------------------------------------------------

TIKTOKEN_RANKS_FILE = "o200k_base.tiktoken"
HARMONY_SPECIAL_TOKENS_FILE = "o200k_harmony_special_tokens.json"


def load_tiktoken_ranks(path: Path) -> dict[bytes, int]:
    """A .tiktoken file: one `base64(token bytes) rank` pair a line."""
    ranks = {}
    for line in path.read_bytes().splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return ranks


def _merge_parts(token: bytes, ranks: dict[bytes, int]) -> tuple[bytes, bytes]:
    """The pair that tiktoken merges last to form `token`: run its byte-pair merges on the
    token's own bytes, using only ranks below the token's rank, until two parts remain."""
    max_rank = ranks[token]
    parts = [token[i : i + 1] for i in range(len(token))]
    while len(parts) > 2:
        best_rank, best_index = max_rank, -1
        for index in range(len(parts) - 1):
            rank = ranks.get(parts[index] + parts[index + 1], max_rank)
            if rank < best_rank:
                best_rank, best_index = rank, index
        if best_index < 0:
            raise TokenizerError(f"token {token!r} cannot be built from lower-rank merges")
        parts[best_index : best_index + 2] = [parts[best_index] + parts[best_index + 1]]
    return parts[0], parts[1]


def bpe_vocab_and_merges(ranks: dict[bytes, int]) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """HF BPE vocab and merges equivalent to tiktoken ranks: one merge per multi-byte token,
    ordered by the rank of the token it makes (tiktoken always merges the lowest rank first)."""
    vocab = {_bytes_to_token_text(token): rank for token, rank in ranks.items()}
    merges = []
    for token in sorted((token for token in ranks if len(token) > 1), key=ranks.__getitem__):
        left, right = _merge_parts(token, ranks)
        merges.append((_bytes_to_token_text(left), _bytes_to_token_text(right)))
    return vocab, merges


def build_byte_level_tokenizer(
    ranks: dict[bytes, int], special_tokens: dict[str, int], pattern: str
) -> tokenizers.Tokenizer:
    vocab, merges = bpe_vocab_and_merges(ranks)
    # NOTE: ignore_merges: like tiktoken, a pre-token that is itself in the vocab is one token,
    # even when the merges alone would never build it.
    model = models.BPE(vocab=vocab, merges=merges, ignore_merges=True, byte_fallback=False)
    tokenizer = tokenizers.Tokenizer(model)
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    _add_special_tokens(tokenizer, special_tokens)
    return tokenizer


def _add_special_tokens(tokenizer: tokenizers.Tokenizer, special_tokens: dict[str, int]) -> None:
    # HF appends added tokens after the vocab in order, so the official ids must be contiguous.
    ordered = sorted(special_tokens.items(), key=lambda item: item[1])
    expected_ids = range(tokenizer.get_vocab_size(), tokenizer.get_vocab_size() + len(ordered))
    if [token_id for _, token_id in ordered] != list(expected_ids):
        raise TokenizerError("special token ids must follow the BPE ranks without gaps")
    tokenizer.add_special_tokens(
        [AddedToken(name, special=True, normalized=False) for name, _ in ordered]
    )


def build_o200k_harmony_tokenizer_json(data_dir: str | Path, out_path: str | Path) -> Path:
    """Write a tokenizer.json that encodes exactly like tiktoken's o200k_harmony.

    `data_dir` holds o200k_base.tiktoken and o200k_harmony_special_tokens.json (see
    gossamer.testing.data_dir()). Returns `out_path`.
    """
    data_dir, out_path = Path(data_dir), Path(out_path)
    ranks = load_tiktoken_ranks(data_dir / TIKTOKEN_RANKS_FILE)
    special = json.loads((data_dir / HARMONY_SPECIAL_TOKENS_FILE).read_text())["special_tokens"]
    tokenizer = build_byte_level_tokenizer(ranks, special, O200K_PATTERN)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(out_path))
    return out_path
