"""Build the gpt-oss-mini training corpus from the CPython standard library of this interpreter.

Documents: the source of every stdlib module outside the test folders (kind "code"), and one
Harmony chat per documented public name (kind "chat", see chat.py). Files are split into
train / val / test by a hash of their relative path, so a file and the chats made from it always
land in the same split, and the split of a path is the same on every machine and Python version.
Output: {train,val,test}.jsonl (one {"kind", "path", "text"} per line) and manifest.json.

    python -m tools.mini.corpus --out /tmp/mini/corpus [--stdlib PATH]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import platform
import sysconfig
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path, PurePosixPath

from tools.mini.chat import SPECIAL_TOKENS, api_entries, exchange

SPLITS = ("train", "val", "test")
SPLIT_SALT = "gpt-oss-mini/split/v1"
# Of 1000 hash buckets, this many go to val and to test (the rest train): about 4% each.
VAL_BUCKETS = 40
TEST_BUCKETS = 40
EXCLUDED_DIRS = frozenset(
    {"site-packages", "dist-packages", "__pycache__", "test", "tests", "idle_test", "lib-dynload"}
)


@dataclass
class SplitStats:
    files: int = 0
    code_documents: int = 0
    chat_documents: int = 0
    characters: int = 0


@dataclass
class Manifest:
    python_version: str
    stdlib: str
    files_seen: int
    files_skipped: list[str] = field(default_factory=list)
    splits: dict[str, SplitStats] = field(default_factory=dict)
    sha256: dict[str, str] = field(default_factory=dict)


def default_stdlib() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def split_of(relative_path: str) -> str:
    """'train', 'val' or 'test' for a stdlib file, from a salted hash of its relative path."""
    digest = hashlib.sha256(f"{SPLIT_SALT}|{relative_path}".encode()).digest()
    bucket = int.from_bytes(digest[:8], "little") % 1000
    if bucket < VAL_BUCKETS:
        return "val"
    if bucket < VAL_BUCKETS + TEST_BUCKETS:
        return "test"
    return "train"


def module_name(relative_path: str) -> str:
    """'json/decoder.py' -> 'json.decoder'; 'json/__init__.py' -> 'json'."""
    parts = list(PurePosixPath(relative_path).with_suffix("").parts)
    if parts[-1] == "__init__" and len(parts) > 1:
        parts.pop()
    return ".".join(parts)


def stdlib_sources(root: Path) -> list[str]:
    """Relative POSIX paths of the stdlib's .py files outside test folders, sorted."""
    found = []
    for path in root.rglob("*.py"):
        relative = path.relative_to(root).as_posix()
        parts = PurePosixPath(relative).parts
        if any(p in EXCLUDED_DIRS or p.startswith("config-") for p in parts[:-1]):
            continue
        # Build-machine data (paths, compiler flags): it differs between installs.
        if parts[-1].startswith("_sysconfigdata"):
            continue
        found.append(relative)
    return sorted(found)


def sample_files(sources: list[str], count: int) -> list[str]:
    """About `count` files, at least one per split (for smoke tests on a small corpus)."""
    by_split: dict[str, list[str]] = {name: [] for name in SPLITS}
    for relative in sources:
        by_split[split_of(relative)].append(relative)
    held_out = max(1, count // 6)
    picked = by_split["train"][: max(1, count - 2 * held_out)]
    picked += by_split["val"][:held_out] + by_split["test"][:held_out]
    return sorted(picked)


def skip_reason(text: str) -> str | None:
    """Why a source file is left out of the corpus, or None to keep it."""
    if "gencodec.py" in text[:2000]:
        return "generated codec table"
    if any(token in text for token in SPECIAL_TOKENS):
        return "contains a Harmony special token string"
    if not text.strip():
        return "empty"
    return None


def documents(root: Path, relative: str, text: str, chats: bool) -> Iterator[dict[str, str]]:
    yield {"kind": "code", "path": relative, "text": text}
    if chats:
        for entry in api_entries(text, relative, module_name(relative)):
            yield {"kind": "chat", "path": relative, "text": exchange(entry)}


def build_corpus(
    out_dir: Path, stdlib: Path | None = None, *, chats: bool = True, max_files: int | None = None
) -> Manifest:
    """Write {train,val,test}.jsonl and manifest.json under out_dir; returns the manifest."""
    root = stdlib or default_stdlib()
    if not root.is_dir():
        raise FileNotFoundError(f"no standard library at {root}; pass --stdlib PATH")
    sources = stdlib_sources(root)
    if max_files is not None:
        sources = sample_files(sources, max_files)
    manifest = Manifest(platform.python_version(), str(root), len(sources))
    manifest.splits = {name: SplitStats() for name in SPLITS}
    out_dir.mkdir(parents=True, exist_ok=True)
    handles = {name: (out_dir / f"{name}.jsonl").open("w", encoding="utf-8") for name in SPLITS}
    try:
        for relative in sources:
            _add_file(root, relative, chats, manifest, handles)
    finally:
        for handle in handles.values():
            handle.close()
    for name in SPLITS:
        manifest.sha256[name] = hashlib.sha256((out_dir / f"{name}.jsonl").read_bytes()).hexdigest()
    (out_dir / "manifest.json").write_text(json.dumps(asdict(manifest), indent=2) + "\n")
    return manifest


def _add_file(root: Path, relative: str, chats: bool, manifest: Manifest, handles: dict) -> None:
    try:
        text = (root / relative).read_text(encoding="utf-8")
    except UnicodeDecodeError:
        manifest.files_skipped.append(f"{relative}: not UTF-8")
        return
    reason = skip_reason(text)
    if reason:
        manifest.files_skipped.append(f"{relative}: {reason}")
        return
    split = split_of(relative)
    stats = manifest.splits[split]
    stats.files += 1
    for document in documents(root, relative, text, chats):
        handles[split].write(json.dumps(document, ensure_ascii=False) + "\n")
        stats.characters += len(document["text"])
        if document["kind"] == "code":
            stats.code_documents += 1
        else:
            stats.chat_documents += 1


def read_documents(path: Path) -> Iterator[dict[str, str]]:
    with path.open(encoding="utf-8") as handle:
        for line in handle:
            yield json.loads(line)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--stdlib", type=Path, default=None, help="default: this Python's stdlib")
    parser.add_argument("--no-chats", action="store_true", help="source code only")
    parser.add_argument("--max-files", type=int, default=None)
    args = parser.parse_args(argv)
    manifest = build_corpus(
        args.out, args.stdlib, chats=not args.no_chats, max_files=args.max_files
    )
    for name, stats in manifest.splits.items():
        print(f"{name}: {stats}")
    print(f"skipped {len(manifest.files_skipped)} files; wrote {args.out}")


if __name__ == "__main__":
    main()
