"""``llamafleet check-env``: check the driver, GPUs, llama.cpp build, CPU, Python and memory; exit 0/1/2.

Its job includes saying which package is missing, so it must run without them: the checks load in :func:`run`,
and nothing they import loads FastAPI, uvicorn, matplotlib, numpy or llama.cpp (the llama.cpp probe runs in a
child process).
"""

from __future__ import annotations

import argparse
import sys

EPILOG = """exit codes: 0 every check passed (or was skipped), 1 warnings, 2 failures (or a bad --config).
See docs/CHECK_ENV.md for what each check means and how to fix it."""


def run(args: argparse.Namespace) -> int:
    from llamafleet.config import ConfigError
    from llamafleet.envcheck.run import check_environment, exit_code, format_json, format_text

    try:
        facts, results = check_environment(args.model, args.config, args.cpu_only)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(format_json(facts, results) if args.json else format_text(results))
    return exit_code(results)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "check-env",
        help="check that this machine is ready to serve (driver, GPUs, llama.cpp build, CPU, memory)",
        description="Check this machine and say, one line per check, what is wrong and how to fix it.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--model", metavar="FILE", help="GGUF model to check RAM and disk against")
    p.add_argument("--config", metavar="FLEET_YAML", help="take the model from this config's model_path")
    p.add_argument(
        "--cpu-only", action="store_true", help="this machine is meant to run without GPU: no GPU is not a warning"
    )
    p.add_argument("--json", action="store_true", help="print results and gathered facts as JSON")
    p.set_defaults(func=run)
