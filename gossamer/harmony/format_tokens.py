"""The Harmony formatting tokens, looked up by name so that any tokenizer with them works."""

from __future__ import annotations

from dataclasses import dataclass

from gossamer.tokenizer import Tokenizer

START = "<|start|>"
END = "<|end|>"
MESSAGE = "<|message|>"
CHANNEL = "<|channel|>"
CONSTRAIN = "<|constrain|>"
RETURN = "<|return|>"
CALL = "<|call|>"


@dataclass(frozen=True)
class FormatTokenIds:
    """Ids of the Harmony formatting tokens in one tokenizer."""

    start: int
    end: int
    message: int
    channel: int
    constrain: int
    return_: int
    call: int

    @classmethod
    def from_tokenizer(cls, tokenizer: Tokenizer) -> FormatTokenIds:
        """Raises UnknownSpecialTokenError when the tokenizer lacks a Harmony token."""
        lookup = tokenizer.special_id
        return cls(
            start=lookup(START),
            end=lookup(END),
            message=lookup(MESSAGE),
            channel=lookup(CHANNEL),
            constrain=lookup(CONSTRAIN),
            return_=lookup(RETURN),
            call=lookup(CALL),
        )

    @property
    def stop_ids(self) -> frozenset[int]:
        """Tokens after which the model is done sampling (`<|return|>`, `<|call|>`)."""
        return frozenset((self.return_, self.call))
