"""Per-request text output: incremental detokenization and stop strings across token boundaries.

A stop string can begin in one token and end in a later one, so the search looks back over the
tail that could hold its start. While streaming, text that might still turn out to be the start of
a stop string is held back, so no client ever receives text that is later cut.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gossamer.tokenizer import IncrementalDetokenizer, Tokenizer


@dataclass
class TextState:
    tokenizer: Tokenizer
    stop: tuple[str, ...]
    include_stop_str: bool
    skip_special: bool
    text: str = ""  # all text so far (cut at a stop string once one is found)
    sent: int = 0  # characters already handed to the client
    stopped_by: str | None = None
    _detok: IncrementalDetokenizer | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self._detok = IncrementalDetokenizer(self.tokenizer, skip_special=self.skip_special)
        self._hold = max((len(s) for s in self.stop), default=1) - 1

    def add_token(self, token_id: int) -> None:
        if self.stopped_by is not None:
            return
        start = max(0, len(self.text) - self._hold)
        self.text += self._detok.feed(token_id)
        self._find_stop(start)

    def finish(self) -> None:
        """No more tokens: release held bytes (an incomplete character decodes as U+FFFD)."""
        if self.stopped_by is None:
            start = max(0, len(self.text) - self._hold)
            self.text += self._detok.flush()
            self._find_stop(start)

    def _find_stop(self, start: int) -> None:
        hits = [(self.text.find(s, start), s) for s in self.stop]
        hits = [(at, s) for at, s in hits if at >= 0]
        if not hits:
            return
        at, stop = min(hits)
        self.stopped_by = stop
        self.text = self.text[: at + len(stop)] if self.include_stop_str else self.text[:at]

    def take_delta(self, final: bool) -> str:
        """New text that is safe to send: everything when final or stopped, otherwise all but
        the tail that could still grow into a stop string."""
        end = len(self.text)
        if not final and self.stopped_by is None and self.stop:
            end = max(self.sent, end - self._hold)
        delta = self.text[self.sent : end]
        self.sent = end
        return delta
