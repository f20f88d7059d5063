"""docs/configuration.md, the table of every environment variable, written from the settings models.

    python -m specdec.settings.docs            # rewrite docs/configuration.md
    python -m specdec.settings.docs --check    # exit 1 when the page differs from the models

tests/unit/test_settings_docs.py fails while the committed page differs, so the two stay in sync.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pydantic.fields import FieldInfo

from specdec.settings.base import MIB, SpecdecSettings, allowed, env_name, is_secret
from specdec.settings.gateway import GatewaySettings
from specdec.settings.model_service import ModelServiceConfig
from specdec.settings.orchestrator import OrchestratorConfig
from specdec.settings.shared import CommandSettings

BYTES_SUFFIX = "_BYTES"
PAGE = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"
#: Who reads each settings model, in the order the table names them.
READERS: tuple[tuple[str, type[SpecdecSettings]], ...] = (
    ("target, draft", ModelServiceConfig),
    ("orchestrator", OrchestratorConfig),
    ("http", GatewaySettings),
    ("cli", CommandSettings),
)
HEADER = """# Configuration

Every service reads its settings from environment variables when it starts; command-line flags of
`specdec serve` override them. Each value is checked: a value of the wrong type or outside its range
stops the service at startup with one line naming the variable and what it allows, for example

    $ SPECDEC_MAX_BATCH=0 specdec serve target
    specdec serve target: invalid configuration: SPECDEC_MAX_BATCH='0': \
Input should be greater than or equal to 1 (allowed: integer >= 1)

An empty variable means its default. Booleans take 1/0, true/false, yes/no or on/off. Secrets
(marked *secret*) can instead be read from a file named by `NAME_FILE` (as Kubernetes and compose mount
them); their values never appear in logs or errors.

*Read by*: `target, draft` the model services, `orchestrator`, `http` the OpenAI-compatible gateway,
`cli` the command line itself (`specdec serve`, `specdec generate`, `python -m specdec.healthcheck`).

This page is generated from the settings models (specdec/settings/) by `python -m specdec.settings.docs`;
edit the models, not this page.

| Variable | Type / allowed | Default | Read by | Description |
|---|---|---|---|---|
"""


def settings_fields(model: type[SpecdecSettings]) -> Iterator[FieldInfo]:
    """Every field of `model` and of the settings models it is composed of, depth first."""
    for field in model.model_fields.values():
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, SpecdecSettings):
            yield from settings_fields(annotation)
        else:
            yield field


def shown_default(name: str, field: FieldInfo) -> str:
    """A default as one would set it: true/false, sizes in bytes with MiB beside, (empty) for nothing."""
    value: Any = field.default
    if value is None or value in ("", ()):
        return "(empty)"
    if isinstance(value, bool):
        return "true" if value else "false"
    if name.endswith(BYTES_SUFFIX) and value >= MIB and value % MIB == 0:
        return f"{value} ({value // MIB} MiB)"
    return f"`{value}`"


def cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def rows() -> list[str]:
    """One Markdown row per variable, sorted by name; a variable several services read names them all."""
    found: dict[str, tuple[FieldInfo, list[str]]] = {}
    for reader, model in READERS:
        for field in settings_fields(model):
            name = env_name(field)
            if name:
                entry = found.setdefault(name, (field, []))
                if reader not in entry[1]:
                    entry[1].append(reader)
    lines = []
    for name in sorted(found):
        field, readers = found[name]
        kind = allowed(field) + (", secret" if is_secret(field) else "")
        lines.append(
            f"| `{name}` | {cell(kind)} | {cell(shown_default(name, field))} | {', '.join(readers)} "
            f"| {cell(field.description or '')} |"
        )
    return lines


def render() -> str:
    """The whole page."""
    return HEADER + "\n".join(rows()) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when the page differs, writing nothing")
    parser.add_argument("--out", type=Path, default=PAGE)
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        current = args.out.read_text(encoding="utf-8") if args.out.exists() else ""
        if current != text:
            print(f"{args.out} is out of date: run python -m specdec.settings.docs", file=sys.stderr)
            return 1
        return 0
    args.out.write_text(text, encoding="utf-8")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
