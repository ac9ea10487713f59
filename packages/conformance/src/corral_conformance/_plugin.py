"""corral plugin: the ``corral conformance KIND`` command."""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from collections.abc import Callable

import corral
import corral.capability

from ._defaults import DEFAULT_MAX_EXAMPLES

__all__ = ["corral_register_commands"]


def _configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("kind", help="the provider kind to check (see `corral providers`)")
    parser.add_argument(
        "--provider-options",
        metavar="JSON",
        default=None,
        help="JSON object of keyword options for the provider's factory",
    )
    parser.add_argument(
        "--max-examples",
        metavar="N",
        type=int,
        default=DEFAULT_MAX_EXAMPLES,
        help=f"hypothesis examples per property (default {DEFAULT_MAX_EXAMPLES})",
    )
    parser.add_argument(
        "--backend",
        action="append",
        choices=("asyncio", "trio"),
        help="anyio backend to run on; repeat for both (default asyncio)",
    )
    parser.add_argument(
        "--rule",
        action="append",
        help="run only this test name, contract rule id or rule-id prefix (refs, "
        "refs.version); repeatable",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help="print the report as JSON (per-test and per-rule status, full reasons, "
        "rule sentences, durations)",
    )
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="show pytest's progress and tracebacks"
    )


def _run(args: argparse.Namespace) -> int:
    try:
        options = json.loads(args.provider_options) if args.provider_options else {}
    except ValueError:
        print("corral conformance: --provider-options is not valid JSON", file=sys.stderr)
        return 2
    if not isinstance(options, dict):
        print("corral conformance: --provider-options must be a JSON object", file=sys.stderr)
        return 2
    from ._check import check_kind  # pytest and hypothesis load only when the suite runs

    try:
        report = check_kind(
            args.kind,
            factory_options=options,
            rules=args.rule,
            max_examples=args.max_examples,
            backends=tuple(args.backend or ("asyncio",)),
            verbose=args.verbose,
        )
    except corral.ConfigError as exc:
        print(f"corral conformance: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(report.to_json(), indent=2, ensure_ascii=False))
    else:
        print(report.format_table(width=shutil.get_terminal_size((120, 24)).columns))
    if not report.results:
        print("corral conformance: no rule ran", file=sys.stderr)
        return 1
    return 0 if report.ok else 1


@corral.hookimpl
def corral_register_commands(register: Callable[[corral.capability.CliCommand], None]) -> None:
    """Contribute ``corral conformance``."""
    register(
        corral.capability.CliCommand(
            name="conformance",
            help="run the provider conformance suite and print a per-rule table",
            configure=_configure,
            run=_run,
        )
    )
