"""N-gram (prompt lookup) proposer: find the last n tokens earlier in the request's own prompt +
output (n from `max_n` down to `min_n`, longest first) and propose what followed them.

Each request keeps one dict per n from an n-gram's hash to the end of its most recent occurrence,
updated incrementally as tokens arrive, so a proposal costs O(new tokens * number of n) dict
operations, not a scan of the context. Memory is about one dict entry per token and n (~30 MB for
a 100k-token prompt with three values of n).

The continuation is copied from the sequence extended by the draft itself, so a short period
(`a b a b a` -> `b a b a`) yields a full-length draft even when the match ends near the end.
"""

from __future__ import annotations

from collections.abc import Sequence

from gossamer.spec.proposer import BaseProposer, Draft, SpecRequest

# The dicts are keyed by the grams' hashes, not the grams: tuples kept as keys are objects the
# garbage collector tracks, 3k of them per 1k-token prompt, and with them a first proposal now
# and then paid a full collection (45 ms in one of eight 1k-token builds on the CPU machine,
# against ~0.5 ms otherwise). A hash is an int, which it does not track; the tuple it came from is
# freed at once. Two grams with one hash (about 2^-64 a pair) cost a wrong draft, which
# verification rejects. A prompt's grams are hashed in C (map over zip).
_BULK = 16  # new ends from which zip makes the grams (below: a slice per gram)


class _NgramIndex:
    __slots__ = ("last_end", "num_indexed")

    def __init__(self, sizes: range) -> None:
        # last_end[n][hash(gram)] = e: tokens[e - n:e] == gram, e is the latest such end so far
        self.last_end: dict[int, dict[int, int]] = {n: {} for n in sizes}
        self.num_indexed = 0  # ends below this are in the dicts

    def extend(self, tokens: Sequence[int], upto: int) -> None:
        """Index every n-gram that ends before `upto`."""
        done = self.num_indexed
        if done >= upto:
            return
        for n, ends in self.last_end.items():
            start = max(done, n)
            if upto - start >= _BULK:  # later ends overwrite earlier ones: the latest wins
                window = list(tokens[start - n : upto])
                grams = zip(*(window[i : i + upto - start] for i in range(n)), strict=True)
                ends.update(zip(map(hash, grams), range(start, upto), strict=True))
            else:
                for end in range(start, upto):
                    ends[hash(tuple(tokens[end - n : end]))] = end
        self.num_indexed = upto

    def find(self, tokens: Sequence[int], n: int) -> int | None:
        """The latest end of an earlier occurrence of the last n tokens, if any."""
        return self.last_end[n].get(hash(tuple(tokens[len(tokens) - n :])))


class NgramProposer(BaseProposer):
    name = "ngram"

    def __init__(self, num_speculative_tokens: int, min_n: int = 2, max_n: int = 4) -> None:
        if not 1 <= min_n <= max_n:
            raise ValueError(f"need 1 <= min_n <= max_n, got {min_n}, {max_n}")
        self.num_speculative_tokens = num_speculative_tokens
        self.sizes = range(max_n, min_n - 1, -1)  # longest first
        self._indexes: dict[str, _NgramIndex] = {}

    def propose(self, requests: Sequence[SpecRequest]) -> list[Draft | None]:
        return [self._propose_one(request) for request in requests]

    def _propose_one(self, request: SpecRequest) -> Draft | None:
        tokens = request.token_ids
        index = self._indexes.get(request.request_id)
        if index is None:
            index = self._indexes[request.request_id] = _NgramIndex(self.sizes)
        num_tokens = len(tokens)
        # NOTE: the n-gram ending at the last token is indexed only on the next call, so a lookup
        # never finds the suffix itself.
        index.extend(tokens, num_tokens)
        for n in self.sizes:
            if n >= num_tokens:
                continue
            end = index.find(tokens, n)
            if end is not None:
                count = min(self.num_speculative_tokens, request.max_draft_tokens)
                return Draft(_continuation(tokens, end, count))
        return None

    def release(self, request_id: str, token_ids: Sequence[int], num_prompt_tokens: int) -> None:
        self._indexes.pop(request_id, None)


def _continuation(tokens: Sequence[int], start: int, count: int) -> list[int]:
    """`count` tokens from `start` of tokens + the continuation itself (start < len(tokens))."""
    num_tokens = len(tokens)
    if start + count <= num_tokens:
        return list(tokens[start : start + count])
    out: list[int] = []
    for position in range(start, start + count):
        out.append(tokens[position] if position < num_tokens else out[position - num_tokens])
    return out
