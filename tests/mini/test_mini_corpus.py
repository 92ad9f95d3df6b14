"""Corpus building: which files, which split, deterministic output, valid Harmony chats."""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

import pytest

from gossamer.testing import data_dir
from tools.mini.chat import api_entries, developer_content, exchange, system_content
from tools.mini.corpus import build_corpus, module_name, split_of, stdlib_sources

MODULE = '''"""A module."""


def public(a, b=2, *args, key=None, **kwargs):
    """Add things.

    Longer explanation of how the things are added.
    """
    return a + b


def _private(x):
    """Hidden."""


class Widget(Base):
    """A widget."""

    def spin(self, times):
        """Spin the widget `times` times."""
        for _ in range(times):
            pass

    def undocumented(self):
        pass
'''


def write_tree(root: Path, files: dict[str, str]) -> Path:
    for relative, text in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def fake_stdlib(root: Path) -> Path:
    files = {f"pkg{i}/mod{j}.py": MODULE for i in range(6) for j in range(6)}
    files |= {
        "test/test_x.py": MODULE,
        "pkg0/tests/test_y.py": MODULE,
        "idlelib/idle_test/test_z.py": MODULE,
        "site-packages/thirdparty.py": MODULE,
        "_sysconfigdata__linux.py": MODULE,
        "encodings/cp999.py": '""" Python Character Mapping Codec generated from gencodec.py """\n',
        "pkg0/__init__.py": MODULE,
    }
    return write_tree(root, files)


def test_sources_leave_out_tests_third_party_and_build_data(tmp_path):
    sources = stdlib_sources(fake_stdlib(tmp_path))
    assert "pkg0/__init__.py" in sources and "encodings/cp999.py" in sources
    assert not [s for s in sources if "test" in s or "site-packages" in s or "sysconfig" in s]
    assert sources == sorted(sources)


def test_module_names():
    assert module_name("json/decoder.py") == "json.decoder"
    assert module_name("json/__init__.py") == "json"
    assert module_name("os.py") == "os"


def test_split_is_a_stable_hash_of_the_path():
    paths = [f"pkg/mod{i}.py" for i in range(5000)]
    splits = Counter(split_of(p) for p in paths)
    assert 150 < splits["val"] < 250 and 150 < splits["test"] < 250  # about 4% each
    assert [split_of(p) for p in paths[:50]] == [split_of(p) for p in paths[:50]]


def test_corpus_is_deterministic_and_splits_by_file(tmp_path):
    root = fake_stdlib(tmp_path / "lib")
    first = build_corpus(tmp_path / "a", root)
    second = build_corpus(tmp_path / "b", root)
    assert first.sha256 == second.sha256
    assert "encodings/cp999.py: generated codec table" in first.files_skipped
    seen: dict[str, str] = {}
    for split in ("train", "val", "test"):
        for line in (tmp_path / "a" / f"{split}.jsonl").read_text().splitlines():
            document = json.loads(line)
            assert seen.setdefault(document["path"], split) == split  # one split per file
            assert split_of(document["path"]) == split
    assert set(seen) == set(stdlib_sources(root)) - {"encodings/cp999.py"}
    stats = first.splits["train"]
    # Per module: public(), Widget and Widget.spin are documented; _private, undocumented not.
    assert stats.chat_documents == 3 * stats.code_documents


def test_api_entries_take_documented_public_names():
    entries = {e.qualname: e for e in api_entries(MODULE, "pkg/mod.py", "pkg.mod")}
    assert set(entries) == {"public", "Widget", "Widget.spin"}
    assert entries["public"].parameters == "a, b=2, *args, key=None, **kwargs"
    assert entries["Widget.spin"].source.startswith("def spin(self, times):")
    assert entries["Widget"].kind == "class" and entries["Widget.spin"].kind == "method"


@pytest.fixture(scope="module")
def harmony():
    os.environ.setdefault("TIKTOKEN_ENCODINGS_BASE", str(data_dir()))
    import openai_harmony

    encoding = openai_harmony.load_harmony_encoding(
        openai_harmony.HarmonyEncodingName.HARMONY_GPT_OSS
    )
    return openai_harmony, encoding


@pytest.mark.parametrize("reasoning", ["low", "medium", "high"])
@pytest.mark.parametrize("date", [None, "2025-03-01"])
def test_system_and_developer_messages_render_as_openai_harmony(harmony, reasoning, date):
    h, encoding = harmony
    system = h.SystemContent.new().with_reasoning_effort(h.ReasoningEffort(reasoning.capitalize()))
    if date:
        system = system.with_conversation_start_date(date)
    developer = h.DeveloperContent.new().with_instructions("Answer concisely.")
    rendered = encoding.decode(
        encoding.render_conversation(
            h.Conversation.from_messages(
                [
                    h.Message.from_role_and_content(h.Role.SYSTEM, system),
                    h.Message.from_role_and_content(h.Role.DEVELOPER, developer),
                ]
            )
        )
    )
    expected = (
        f"<|start|>system<|message|>{system_content(reasoning, date)}<|end|>"
        f"<|start|>developer<|message|>{developer_content('Answer concisely.')}<|end|>"
    )
    assert rendered == expected


def test_exchanges_round_trip_through_openai_harmony(harmony):
    h, encoding = harmony
    texts = [exchange(e) for i in range(8) for e in api_entries(MODULE, f"m{i}.py", f"m{i}")]
    channels = Counter()
    for text in texts:
        tokens = encoding.encode(text, allowed_special="all")
        messages = encoding.parse_messages_from_completion_tokens(tokens)
        config = h.RenderConversationConfig(auto_drop_analysis=False)
        conversation = h.Conversation.from_messages(messages)
        assert (
            encoding.decode(encoding.render_conversation_for_training(conversation, config)) == text
        )
        assert messages[0].author.role == h.Role.SYSTEM
        assert messages[-1].author.role == h.Role.ASSISTANT and messages[-1].channel == "final"
        channels.update(m.channel for m in messages if m.author.role == h.Role.ASSISTANT)
    assert channels["analysis"] > 0 and channels["final"] == len(texts)
