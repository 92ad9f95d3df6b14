"""A trie that counts the substrings (length <= max_depth) of the sequences added to it.

Nodes are integer ids (0 is the root) into flat arrays, and the edges one dict from
(parent, token) to child: no Python container per node. A trie of a few thousand tokens holds
~16 nodes per token; as lists or objects those would be millions of objects that every full
garbage collection walks (a 100 ms pause in a process that holds a model), and creating them
was most of what taking in a token cost. Ints in `array`s and in a dict of ints are invisible to
the collector, and a node costs ~100 bytes.

A node's children form a doubly linked list, newest first (`first_child`, `next_sibling`,
`prev_sibling`: unlinking a child must not walk its siblings; the root has one per distinct
token). Removing a sequence frees the nodes whose count drops to zero; their ids are reused.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator, Sequence

ROOT = 0
NONE = -1  # no node
TOKEN_SPAN = 1 << 32  # edge key: parent * TOKEN_SPAN + token

# (best next token, its count, the count of all next tokens, the node below it)
Step = tuple[int, int, int, int]


class SuffixTrie:
    """Counts of the substrings (length <= max_depth) of the sequences added to it."""

    def __init__(self, max_depth: int) -> None:
        self.max_depth = max_depth
        self.counts = array("q", [0])
        self.tokens = array("q", [NONE])  # the token on the edge into each node
        self.first_child = array("q", [NONE])
        self.next_sibling = array("q", [NONE])
        self.prev_sibling = array("q", [NONE])
        self.edges: dict[int, int] = {}
        self._free: list[int] = []  # ids of removed nodes, for reuse

    # ---- reading -----------------------------------------------------------------------------

    def child(self, node: int, token: int) -> int | None:
        return self.edges.get(node * TOKEN_SPAN + token)

    def find(self, context: Sequence[int]) -> int | None:
        node: int | None = ROOT
        for token in context:
            node = self.edges.get(node * TOKEN_SPAN + token)
            if node is None:
                return None
        return node

    def count(self, context: Sequence[int]) -> int:
        """How often `context` (1 .. max_depth tokens) occurred."""
        node = self.find(context)
        return 0 if node is None else self.counts[node]

    def is_empty(self) -> bool:
        return self.first_child[ROOT] == NONE

    def children(self, node: int) -> Iterator[tuple[int, int]]:
        """(token, child) of every child, newest first."""
        child = self.first_child[node]
        while child != NONE:
            yield self.tokens[child], child
            child = self.next_sibling[child]

    def has_counted_child(self, node: int) -> bool:
        child = self.first_child[node]
        while child != NONE:
            if self.counts[child]:
                return True
            child = self.next_sibling[child]
        return False

    def best_child(self, node: int) -> Step | None:
        """The most frequent child; ties: the oldest (the earliest occurrence)."""
        counts, next_sibling = self.counts, self.next_sibling
        best, best_count, total = NONE, 0, 0
        child = self.first_child[node]
        while child != NONE:
            count = counts[child]
            total += count
            if count >= best_count:  # >=: of equals, the last seen is the oldest
                best, best_count = child, count
            child = next_sibling[child]
        if not total:
            return None
        return self.tokens[best], best_count, total, best

    # ---- writing -----------------------------------------------------------------------------

    def add(self, tokens: Sequence[int]) -> None:
        """Count every substring of `tokens` (a whole sequence)."""
        SuffixAppender(self).extend(tokens)

    def extend_suffixes(self, active: list[int], token: int) -> list[int]:
        """Count `token` after each of the nodes `active` (the suffixes, shortest first, of a
        sequence being added) and after the root: the nodes of the suffixes it ends, shortest
        first, with the missing ones created (first among their siblings: newest first)."""
        # NOTE: the shared trie takes in >= 64 tokens per proposal while a finished output is
        # queued, and a token of new text creates ~max_depth nodes: node creation is inlined
        # and the arrays are locals (~15% less time than a method call per node)
        edges, counts, tokens, free = self.edges, self.counts, self.tokens, self._free
        first_child, next_sibling, prev_sibling = (
            self.first_child,
            self.next_sibling,
            self.prev_sibling,
        )
        extended = []
        for parent in (ROOT, *active):
            key = parent * TOKEN_SPAN + token
            child = edges.get(key)
            if child is not None:
                counts[child] += 1
                extended.append(child)
                continue
            sibling = first_child[parent]
            if free:
                child = free.pop()
                counts[child], tokens[child], first_child[child] = 1, token, NONE
                next_sibling[child], prev_sibling[child] = sibling, NONE
            else:
                child = len(counts)
                counts.append(1)
                tokens.append(token)
                first_child.append(NONE)
                next_sibling.append(sibling)
                prev_sibling.append(NONE)
            if sibling != NONE:
                prev_sibling[sibling] = child
            first_child[parent] = child
            edges[key] = child
            extended.append(child)
        return extended

    def remove(self, tokens: Sequence[int], begin: int = 0, end: int | None = None) -> None:
        """Undo `add(tokens)` for the substrings starting in [begin, end) (all by default);
        nodes whose count drops to zero are freed."""
        for start in range(begin, len(tokens) if end is None else end):
            self._decrement(tokens[start : start + self.max_depth])

    def _decrement(self, path: Sequence[int]) -> None:
        node, edges, counts = ROOT, self.edges, self.counts
        for depth, token in enumerate(path):
            child = edges[node * TOKEN_SPAN + token]
            counts[child] -= 1
            if not counts[child]:
                self._unlink(node, child)
                self._free_path(child, path[depth + 1 :])
                return
            node = child

    def _unlink(self, parent: int, node: int) -> None:
        del self.edges[parent * TOKEN_SPAN + self.tokens[node]]
        previous, following = self.prev_sibling[node], self.next_sibling[node]
        if previous == NONE:
            self.first_child[parent] = following
        else:
            self.next_sibling[previous] = following
        if following != NONE:
            self.prev_sibling[following] = previous

    def _free_path(self, node: int, rest: Sequence[int]) -> None:
        """Free `node` and the nodes of `rest` below it. NOTE: a child never counts more than
        its parent, and zero-count nodes are freed at once, so below a node whose count just
        dropped to zero hangs only the rest of the path whose count it was."""
        self._free.append(node)
        for token in rest:
            node = self.edges.pop(node * TOKEN_SPAN + token)
            self._free.append(node)


class SuffixAppender:
    """Adds one growing sequence to a trie token by token: it keeps the nodes of the sequence's
    current suffixes of length 1 .. max_depth - 1 (`active[m - 1]` is the suffix of length m)."""

    __slots__ = ("trie", "active")

    def __init__(self, trie: SuffixTrie) -> None:
        self.trie = trie
        self.active: list[int] = []

    def append(self, token: int) -> None:
        self.extend((token,))

    def extend(self, tokens: Sequence[int]) -> None:
        trie, active = self.trie, self.active
        for token in tokens:
            active = trie.extend_suffixes(active, token)
            del active[trie.max_depth - 1 :]  # suffixes at full depth cannot grow
        self.active = active
