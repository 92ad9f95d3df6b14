"""`gossamer` command line: each sub-command lives in its own module and is imported lazily,
so `gossamer generate` never pays for the server's or the benchmark's imports."""

from __future__ import annotations

import argparse
import importlib
import sys

# sub-command -> module defining `add_arguments(parser)` and `run(args) -> int | None`
COMMANDS = {
    "generate": ("gossamer.engine.generate_cli", "generate text offline from a prompt"),
    "serve": ("gossamer.server.cli", "serve an OpenAI-compatible HTTP API"),
    "bench": ("gossamer.bench.cli", "benchmark any OpenAI-compatible endpoint"),
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="gossamer", description=__doc__)
    subparsers = parser.add_subparsers(dest="command", required=True)
    chosen = argv[0] if argv and argv[0] in COMMANDS else None
    for name, (module_name, help_text) in COMMANDS.items():
        sub = subparsers.add_parser(name, help=help_text)
        if name == chosen:  # only the chosen command's module is imported
            module = importlib.import_module(module_name)
            module.add_arguments(sub)
            sub.set_defaults(run=module.run)
    args = parser.parse_args(argv)
    return int(args.run(args) or 0)


if __name__ == "__main__":
    raise SystemExit(main())
