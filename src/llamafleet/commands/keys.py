"""``llamafleet keys``: manage the keys file's tenants. ``keys add NAME`` makes a new key, prints it once, and writes
only its SHA-256 digest (with the tenant's scopes, models, priority and limits) into the keys file; a running server
takes it on its next reload (the file changed, or SIGHUP). ``keys list`` shows the tenants, never a key."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from llamafleet.exits import Exit


def _csv(text: str) -> list[str]:
    return [p.strip() for p in text.split(",") if p.strip()]


def run(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from llamafleet.tenants.keys import (
        PRIORITY_CLASSES,
        ApiKeysError,
        KeyEntry,
        add_entry,
        digest,
        load_keyring,
        new_key,
    )

    path = Path(args.file)
    if args.action == "list":
        try:
            ring = load_keyring(str(path), environ={})
        except ApiKeysError as e:
            print(f"error: {e}", file=sys.stderr)
            return Exit.USAGE
        for t in sorted(ring.tenants.values(), key=lambda t: t.name):
            limits = ", ".join(f"{k}={v}" for k, v in t.limits.model_dump(exclude_none=True).items()) or "no limits"
            print(f"{t.name}: scopes {','.join(sorted(t.scopes))}; models {','.join(t.models)}; priority "
                  f"{PRIORITY_CLASSES[t.priority]}; {limits}")
        return Exit.OK
    key = new_key()
    caps = {"requests_per_minute": args.requests_per_minute, "tokens_per_minute": args.tokens_per_minute,
              "tokens_per_day": args.tokens_per_day, "concurrent": args.concurrent}
    try:
        entry = KeyEntry.model_validate({
            "name": args.name, "sha256": digest(key).hex(), "scopes": _csv(args.scopes), "models": _csv(args.models),
            "priority": args.priority, "limits": {k: v for k, v in caps.items() if v is not None}})
        add_entry(path, entry)
    except ValidationError as e:
        print("error: " + "; ".join(str(err["msg"]).removeprefix("Value error, ") for err in e.errors()),
              file=sys.stderr)
        return Exit.USAGE
    except (ApiKeysError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return Exit.USAGE
    print(key)
    print(f"# tenant '{args.name}' added to {path}; this key is shown once (the file holds only its hash)",
          file=sys.stderr)
    return Exit.OK


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("keys", help="add API keys as tenants to a keys file, list its tenants",
                       description="Manage the tenants of a keys file (api_keys_file): `keys add NAME` prints a new "
                       "key once and writes its hash; `keys list` shows the tenants.")
    p.add_argument("action", choices=("add", "list"))
    p.add_argument("name", nargs="?", default="", help="the tenant's name (add)")
    p.add_argument("--file", required=True, help="the keys file (created by add if missing)")
    p.add_argument("--scopes", default="inference,embeddings,metrics",
                   help="comma-separated: inference, embeddings, admin, metrics (default: all but admin)")
    p.add_argument("--models", default="*", help="comma-separated model names or globs (default: all)")
    p.add_argument("--priority", default="default", help="interactive, default or batch (default: default)")
    p.add_argument("--requests-per-minute", type=int)
    p.add_argument("--tokens-per-minute", type=int)
    p.add_argument("--tokens-per-day", type=int)
    p.add_argument("--concurrent", type=int, help="requests in flight at once")
    p.set_defaults(func=run)
