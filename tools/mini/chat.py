"""Harmony-format chats made from the standard library's own documentation.

Each public function, class or method with a docstring becomes one short exchange: the user asks
what it does (or for its parameters, or its source), the assistant may think briefly on the
analysis channel and answers on the final channel from the docstring or the code. Rendering is
written out by hand (no openai-harmony at training time); tests check it against openai-harmony.
Everything is deterministic: each exchange draws from an RNG seeded by the file path and name.
"""

from __future__ import annotations

import ast
import hashlib
import random
import re
import textwrap
from dataclasses import dataclass

# Harmony special tokens, in the relative order o200k_harmony gives them.
STARTOFTEXT = "<|startoftext|>"
ENDOFTEXT = "<|endoftext|>"
RETURN = "<|return|>"
CONSTRAIN = "<|constrain|>"
CHANNEL = "<|channel|>"
START = "<|start|>"
END = "<|end|>"
MESSAGE = "<|message|>"
CALL = "<|call|>"
SPECIAL_TOKENS = (STARTOFTEXT, ENDOFTEXT, RETURN, CONSTRAIN, CHANNEL, START, END, MESSAGE, CALL)

LINE_BREAKS = re.compile(r"(\r\n|\r|\n)")
MAX_DOC_CHARS = 1200
MAX_SOURCE_LINES = 40
REASONING_LEVELS = ("low", "medium", "high")
DEVELOPER_INSTRUCTIONS = (
    "You are a helpful assistant.",
    "Answer concisely.",
    "You are an expert Python programmer. Answer questions about the standard library.",
    "Use Markdown for code.",
)


@dataclass(frozen=True)
class ApiEntry:
    """One documented public name of a module."""

    path: str  # "json/decoder.py", relative to the stdlib root
    module: str  # "json.decoder"
    qualname: str  # "JSONDecoder.decode"
    kind: str  # "function", "class" or "method"
    parameters: str  # "self, s, _w=WHITESPACE.match" ("" for classes)
    docstring: str  # cleaned (inspect.cleandoc) docstring
    source: str  # dedented source of the definition

    @property
    def dotted(self) -> str:
        return f"{self.module}.{self.qualname}"


# --- Harmony rendering -------------------------------------------------------------------------


def system_content(reasoning: str = "medium", date: str | None = None) -> str:
    """The system message openai-harmony's SystemContent.new() renders (no tools)."""
    lines = [
        "You are ChatGPT, a large language model trained by OpenAI.",
        "Knowledge cutoff: 2024-06",
    ]
    if date:
        lines.append(f"Current date: {date}")
    return (
        "\n".join(lines)
        + f"\n\nReasoning: {reasoning}\n\n"
        + "# Valid channels: analysis, commentary, final. Channel must be included for every message."
    )


def developer_content(instructions: str) -> str:
    return f"# Instructions\n\n{instructions}"


def render_message(role: str, content: str, channel: str | None = None, end: str = END) -> str:
    header = role if channel is None else f"{role}{CHANNEL}{channel}"
    return f"{START}{header}{MESSAGE}{content}{end}"


# --- API extraction ----------------------------------------------------------------------------


def api_entries(source_text: str, path: str, module: str) -> list[ApiEntry]:
    """Public top-level functions and classes, and public methods of public classes."""
    try:
        tree = ast.parse(source_text)
    except SyntaxError:
        return []
    # NOTE: split as the parser counts lines (not str.splitlines, which also splits on \f).
    lines = LINE_BREAKS.split(source_text)[::2]
    entries: list[ApiEntry] = []
    for node in tree.body:
        if not _is_public_definition(node):
            continue
        entries.extend(_entry(node, lines, path, module, prefix=""))
        if isinstance(node, ast.ClassDef):
            for child in node.body:
                if _is_public_definition(child) and not isinstance(child, ast.ClassDef):
                    entries.extend(_entry(child, lines, path, module, prefix=node.name))
    return entries


def _is_public_definition(node: ast.AST) -> bool:
    definition = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    return isinstance(node, definition) and not node.name.startswith("_")


def _entry(
    node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef,
    lines: list[str],
    path: str,
    module: str,
    prefix: str,
) -> list[ApiEntry]:
    docstring = ast.get_docstring(node, clean=True)
    if not docstring or any(token in docstring for token in SPECIAL_TOKENS):
        return []
    if isinstance(node, ast.ClassDef):
        kind, parameters = "class", ""
    else:
        kind, parameters = ("method" if prefix else "function"), ast.unparse(node.args)
    # Whole lines from `def`/`class` to the end of the body (ast.get_source_segment re-splits the
    # file on every call, which is quadratic over a module).
    segment = "\n".join(lines[node.lineno - 1 : node.end_lineno])
    return [
        ApiEntry(
            path=path,
            module=module,
            qualname=f"{prefix}.{node.name}" if prefix else node.name,
            kind=kind,
            parameters=parameters,
            docstring=docstring,
            source=textwrap.dedent(segment).strip("\n"),
        )
    ]


# --- Exchanges ---------------------------------------------------------------------------------

EXPLAIN_QUESTIONS = (
    "What does `{dotted}` do?",
    "What does {dotted} do?",
    "Explain `{dotted}`.",
    "Can you explain what {name} in the {module} module is for?",
    "What is `{dotted}` used for?",
    "Describe the {kind} `{dotted}`.",
    "How does {dotted} work?",
    "I found `{name}` in `{module}`. What is it?",
)
SIGNATURE_QUESTIONS = (
    "What are the parameters of `{dotted}`?",
    "What is the signature of {dotted}?",
    "How do I call `{dotted}`?",
    "Which arguments does {dotted} take?",
)
SOURCE_QUESTIONS = (
    "Show me the source code of `{dotted}`.",
    "How is `{dotted}` implemented?",
    "Can I see the implementation of {dotted}?",
    "Show me how {dotted} is written in the standard library.",
)


def entry_rng(entry: ApiEntry, salt: str = "") -> random.Random:
    """An RNG that depends only on the entry's identity, so the corpus is reproducible."""
    digest = hashlib.sha256(f"{salt}|{entry.path}|{entry.qualname}".encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "little"))


def exchange(entry: ApiEntry) -> str:
    """One rendered Harmony conversation about `entry`, ending with <|return|>."""
    rng = entry_rng(entry)
    task = _pick_task(entry, rng)
    reasoning = rng.choice(REASONING_LEVELS)
    messages = [render_message("system", system_content(reasoning, _random_date(rng)))]
    if rng.random() < 0.15:
        instructions = developer_content(rng.choice(DEVELOPER_INSTRUCTIONS))
        messages.append(render_message("developer", instructions))
    question_templates = {
        "explain": EXPLAIN_QUESTIONS,
        "signature": SIGNATURE_QUESTIONS,
        "source": SOURCE_QUESTIONS,
    }[task]
    fields = {
        "dotted": entry.dotted,
        "name": entry.qualname,
        "module": entry.module,
        "kind": entry.kind,
    }
    messages.append(render_message("user", rng.choice(question_templates).format(**fields)))
    think_probability = {"low": 0.3, "medium": 0.7, "high": 0.9}[reasoning]
    if rng.random() < think_probability:
        thought = _analysis(entry, task, detailed=reasoning == "high")
        messages.append(render_message("assistant", thought, channel="analysis"))
    answer = {"explain": _explain, "signature": _signature, "source": _source}[task](entry)
    messages.append(render_message("assistant", answer, channel="final", end=RETURN))
    return "".join(messages)


def _pick_task(entry: ApiEntry, rng: random.Random) -> str:
    tasks, weights = ["explain"], [0.6]
    if entry.kind != "class" and entry.parameters:
        tasks.append("signature")
        weights.append(0.15)
    if entry.source and entry.source.count("\n") < MAX_SOURCE_LINES:
        tasks.append("source")
        weights.append(0.25)
    return rng.choices(tasks, weights=weights)[0]


def _random_date(rng: random.Random) -> str | None:
    if rng.random() < 0.3:
        return None
    return f"{rng.randint(2025, 2026)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"


def _analysis(entry: ApiEntry, task: str, detailed: bool) -> str:
    where = f"a {entry.kind} defined in {entry.path}"
    if task == "explain":
        thought = f"The user asks what `{entry.dotted}` does. It is {where}."
        if detailed:
            thought += f' Its docstring begins: "{_first_line(entry.docstring)}"'
        return thought + " I'll summarize its documentation."
    if task == "signature":
        names = _parameter_names(entry.parameters)
        listed = ", ".join(f"`{n}`" for n in names) if names else "no parameters"
        return f"The user wants the parameters of `{entry.dotted}`, {where}. It takes {listed}."
    lines = entry.source.count("\n") + 1
    return (
        f"The user wants the implementation of `{entry.dotted}`. It is {where}, "
        f"{lines} lines long. I'll show it."
    )


def _explain(entry: ApiEntry) -> str:
    signature = f"({entry.parameters})" if entry.kind != "class" else ""
    intro = f"`{entry.dotted}{signature}` is a {entry.kind} in the `{entry.module}` module."
    return f"{intro}\n\n{_trim_doc(entry.docstring)}"


def _signature(entry: ApiEntry) -> str:
    lines = [f"`{entry.dotted}({entry.parameters})`", ""]
    for name in _parameter_names(entry.parameters):
        lines.append(f"- `{name}`")
    lines += ["", _first_paragraph(entry.docstring)]
    return "\n".join(lines)


def _source(entry: ApiEntry) -> str:
    return f"Here is `{entry.dotted}` from `{entry.path}`:\n\n```python\n{entry.source}\n```"


def _parameter_names(parameters: str) -> list[str]:
    if not parameters:
        return []
    args = ast.parse(f"def f({parameters}): pass").body[0].args  # type: ignore[attr-defined]
    names = [a.arg for a in args.posonlyargs + args.args]
    if args.vararg:
        names.append("*" + args.vararg.arg)
    names += [a.arg for a in args.kwonlyargs]
    if args.kwarg:
        names.append("**" + args.kwarg.arg)
    return [n for n in names if n not in ("self", "cls")]


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0].strip()


def _first_paragraph(text: str) -> str:
    return text.strip().split("\n\n")[0].strip()


def _trim_doc(text: str) -> str:
    """Whole paragraphs of the docstring, up to about MAX_DOC_CHARS."""
    kept: list[str] = []
    total = 0
    for paragraph in text.strip().split("\n\n"):
        if kept and total + len(paragraph) > MAX_DOC_CHARS:
            break
        kept.append(paragraph)
        total += len(paragraph) + 2
    return "\n\n".join(kept)
