"""Model references on the Hugging Face hub: ``hf:ORG/REPO:QUANT``, ``hf:ORG/REPO/FILE.gguf``, each with an optional
``@REVISION``; and which of a repo's files a reference names. Pure logic: no network, no cache (see
:mod:`llamafleet.model.hub`).

A quant tag picks the GGUF whose file name carries it as a whole word (``Q4_K`` does not pick ``Q4_K_M``), case
aside. A model split by llama.cpp into ``NAME-00001-of-0000N.gguf`` parts is one model: all its parts are fetched
and the first is loaded (llama.cpp finds the others beside it). Multimodal projectors (``mmproj*``) are never picked
by a tag.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

PREFIX = "hf:"
FORMS = ("hf:ORG/REPO:QUANT      the GGUF whose name carries the tag (hf:bartowski/Qwen2.5-7B-Instruct-GGUF:Q4_K_M)",
         "hf:ORG/REPO/FILE.gguf  that file (its path inside the repo)",
         "hf:ORG/REPO            the repo's only GGUF model",
         "...@REVISION           any of these at a branch, tag or commit (default: main)")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_QUANT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_REVISION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]*$")
_PART = re.compile(r"^(?P<stem>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")


class RefError(ValueError):
    """A malformed reference; the message shows the accepted forms."""


class PickError(LookupError):
    """A reference that names no file of its repo, or several; the message lists the repo's files."""


def usage(what: str) -> str:
    return f"{what}; a model reference is one of:\n" + "\n".join(f"  {f}" for f in FORMS)


@dataclass(frozen=True)
class HubRef:
    repo: str  # ORG/REPO
    quant: str | None = None
    file: str | None = None  # a path inside the repo
    revision: str | None = None  # None: the default branch

    def __str__(self) -> str:
        tail = f":{self.quant}" if self.quant else f"/{self.file}" if self.file else ""
        return f"{PREFIX}{self.repo}{tail}" + (f"@{self.revision}" if self.revision else "")


def is_ref(source: str) -> bool:
    """Whether a model path given by a user is a hub reference (else it is a file path)."""
    return source.startswith(PREFIX)


def parse_ref(source: str) -> HubRef:
    """``source`` as a :class:`HubRef`; :class:`RefError` with the accepted forms if it is not one."""
    if not is_ref(source):
        raise RefError(usage(f"{source!r} does not start with {PREFIX}"))
    body, at, revision = source[len(PREFIX):].partition("@")
    if at and (not _REVISION.match(revision) or ".." in revision.split("/")):
        raise RefError(usage(f"{source!r}: the revision {revision!r} is not a branch, tag or commit name"))
    parts = body.split("/")
    if len(parts) < 2:
        raise RefError(usage(f"{source!r} names no repo (ORG/REPO)"))
    org, name, path = parts[0], parts[1], parts[2:]
    quant = None
    if ":" in name and not path:
        name, _, quant = name.partition(":")
        if not _QUANT.match(quant):
            raise RefError(usage(f"{source!r}: {quant!r} is not a quant tag (such as Q4_K_M)"))
    for word in (org, name):
        if not _NAME.match(word):
            raise RefError(usage(f"{source!r}: {word!r} is not a hub name (letters, digits, '.', '_', '-')"))
    file = None
    if path:
        if any(p in ("", ".", "..") or "\\" in p or ":" in p for p in path):
            raise RefError(usage(f"{source!r}: the file path {'/'.join(path)!r} is not a plain path inside the repo "
                                 "('..', '.', empty parts, '\\' and ':' are refused)"))
        file = "/".join(path)
        if not file.endswith(".gguf"):
            raise RefError(usage(f"{source!r}: {file!r} is not a .gguf file"))
    return HubRef(f"{org}/{name}", quant, file, revision or None)


def split_parts(file: str) -> tuple[str, int, int] | None:
    """``(stem, part number, part count)`` of a split GGUF part's name; None for a whole file."""
    m = _PART.match(file)
    return (m["stem"], int(m["no"]), int(m["count"])) if m else None


def model_stem(file: str) -> str:
    """A model's name from its file's: the name without ``.gguf``, and a split model's without its part suffix."""
    name = file.rsplit("/", 1)[-1]
    parts = split_parts(name)
    return parts[0] if parts is not None else name.removesuffix(".gguf")


def part_names(first: str, count: int) -> list[str]:
    """The names of all parts of the split model whose first part is ``first``."""
    parts = split_parts(first)
    assert parts is not None
    return [f"{parts[0]}-{i:05d}-of-{count:05d}.gguf" for i in range(1, count + 1)]


def _models(files: Iterable[str]) -> dict[str, list[str]]:
    """The repo's GGUF models, each by its display name: a whole file, or a split set as ``STEM-*-of-N.gguf``."""
    out: dict[str, list[str]] = {}
    for f in sorted(files):
        if not f.endswith(".gguf"):
            continue
        parts = split_parts(f)
        key = f if parts is None else f"{parts[0]}-*-of-{parts[2]:05d}.gguf"
        out.setdefault(key, []).append(f)
    return out


def _tagged(name: str, quant: str) -> bool:
    base = name.rsplit("/", 1)[-1]
    return (not base.lower().startswith("mmproj")
            and re.search(rf"(?<![A-Za-z0-9]){re.escape(quant)}(?![A-Za-z0-9_])", base, re.IGNORECASE) is not None)


def pick_files(ref: HubRef, files: Iterable[str]) -> list[str]:
    """The files of the repo (``files``: every path in it) that ``ref`` names, the first part first; a split model's
    parts all. :class:`PickError` listing the repo's GGUF files when it names none or several, or its files when it
    has no GGUF."""
    files = list(files)
    models = _models(files)
    if not models:
        shown = ", ".join(sorted(files)[:20]) + (f" (and {len(files) - 20} more)" if len(files) > 20 else "")
        raise PickError(f"{ref}: the repo holds no .gguf file (llamafleet serves GGUF models); it holds: "
                       f"{shown or 'nothing'}")
    listing = "\n".join(f"  {m}" for m in models)
    if ref.file is not None:
        chosen = {k: v for k, v in models.items() if ref.file in v}
        if not chosen:
            raise PickError(f"{ref}: the repo has no file {ref.file}; its GGUF files:\n{listing}")
    elif ref.quant is not None:
        chosen = {k: v for k, v in models.items() if _tagged(k, ref.quant)}
        if len(chosen) != 1:
            which = "no file carries" if not chosen else f"{len(chosen)} files carry"
            raise PickError(f"{ref}: {which} the quant tag {ref.quant}; name one of its GGUF files "
                           f"(hf:{ref.repo}/FILE.gguf) or another tag:\n{listing}")
    else:
        chosen = {k: v for k, v in models.items() if not k.rsplit("/", 1)[-1].lower().startswith("mmproj")}
        if len(chosen) != 1:
            raise PickError(f"{ref}: the repo holds {len(chosen)} GGUF models; name one with :QUANT or /FILE.gguf:\n"
                           f"{listing}")
    [(key, names)] = chosen.items()
    parts = split_parts(ref.file or names[0])
    if parts is not None:
        wanted = part_names(f"{parts[0]}-00001-of-{parts[2]:05d}.gguf", parts[2])
        if parts[1] != 1:
            raise PickError(f"{ref}: {ref.file} is part {parts[1]} of a split model; name its first part, "
                            f"{wanted[0]}")
        missing = [w for w in wanted if w not in names]
        if missing:
            raise PickError(f"{ref}: the split model {key} lacks its part(s) {', '.join(missing)}")
        return wanted
    return names
