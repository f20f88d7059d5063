"""The base of every settings model: typed fields bound to named environment variables.

* Only the variables the fields declare are read (``env("SPECDEC_X", default, description)``); an empty variable
  means its default, as an unset one. Keyword arguments (CLI flags, tests) win over the environment.
* A secret (``secret=True``) may instead be read from a file, as Kubernetes and compose mount them:
  ``NAME_FILE=/path`` (see :func:`env_secret`); its value never shows in a repr or an error.
* A value that cannot be used, from the environment or assigned later, raises :class:`ConfigError`, one line
  naming the variable (or the field, for a keyword argument), the value and what is allowed.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal, get_args, get_origin
from urllib.parse import quote, urlsplit, urlunsplit

from pydantic import Field, ValidationError
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

MIB = 1024 * 1024
GIB = 1024 * MIB
MAX_PORT = 65535
MAX_GRPC_MESSAGE_BYTES = 2**31 - 1  # gRPC's message size options are C ints
DEFAULT_ORCHESTRATOR_PORT = 50050
DEFAULT_DRAFT_PORT = 50051
DEFAULT_TARGET_PORT = 50052
SECRET_MARK = "secret"
FILE_SUFFIX = "_FILE"
VALUE_ERROR_PREFIX = "Value error, "
BOOLEAN_WORDS = "1/0, true/false, yes/no, on/off"
KINDS = {bool: f"boolean ({BOOLEAN_WORDS})", int: "integer", float: "number", str: "text"}
BOUNDS = (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<"))


class ConfigError(ValueError):
    """A setting has a value that cannot be used; the message names the variable and what is allowed."""


def env_secret(name: str, default: str = "") -> str:
    """A secret from $NAME, else the stripped contents of the file named by $NAME_FILE.

    Raises:
        ConfigError: $NAME_FILE names a file that cannot be read.
    """
    value = os.environ.get(name)
    if value:
        return value
    path = os.environ.get(f"{name}{FILE_SUFFIX}")
    if not path:
        return default
    try:
        return Path(path).read_text(encoding="utf-8").strip() or default
    except OSError as exc:
        raise ConfigError(f"{name}{FILE_SUFFIX}={path}: {exc.strerror or exc}") from exc


def with_password(url: str, password: str) -> str:
    """`url` with `password` as its password (URL-quoted) when it carries none."""
    if not url or not password:
        return url
    parts = urlsplit(url)
    if "@" in parts.netloc:
        return url
    return urlunsplit(parts._replace(netloc=f":{quote(password, safe='')}@{parts.netloc}"))


def redis_url_from_env() -> str:
    """REDIS_URL(_FILE), with REDIS_PASSWORD(_FILE) as its password when the URL carries none."""
    return with_password(env_secret("REDIS_URL"), env_secret("REDIS_PASSWORD"))


def env(name: str, default: Any, description: str, *, secret: bool = False, **constraints: Any) -> Any:
    """A field read from the environment variable `name` (constraints: ge, le, gt, lt, ...)."""
    return Field(
        default,
        validation_alias=name,
        description=description,
        repr=not secret,
        json_schema_extra={SECRET_MARK: True} if secret else None,
        **constraints,
    )


def env_name(field: FieldInfo) -> str:
    """The environment variable a field is read from ("" for a field set only in code)."""
    return field.validation_alias if isinstance(field.validation_alias, str) else ""


def is_secret(field: FieldInfo) -> bool:
    """Whether a field is a secret (NAME_FILE accepted, value never shown)."""
    extra = field.json_schema_extra
    return isinstance(extra, dict) and bool(extra.get(SECRET_MARK))


def allowed(field: FieldInfo) -> str:
    """What a field accepts, in words: its type, its choices or its range."""
    annotation = field.annotation
    if get_origin(annotation) is Literal:
        return "one of " + ", ".join(str(choice) for choice in get_args(annotation))
    if get_origin(annotation) is tuple:
        return "comma-separated list"
    if type(None) in get_args(annotation):  # optional: what it holds when set
        annotation = next(a for a in get_args(annotation) if a is not type(None))
    kind = KINDS.get(annotation) if isinstance(annotation, type) else None
    limits = {key: getattr(meta, key) for meta in field.metadata for key, _ in BOUNDS if hasattr(meta, key)}
    if "ge" in limits and "le" in limits:
        return f"{kind} from {limits['ge']} to {limits['le']}"
    return " ".join([kind or "value", *(f"{sign} {limits[key]}" for key, sign in BOUNDS if key in limits)])


def describe_error(exc: ValidationError, model: type[BaseSettings]) -> str:
    """One line for all of a validation's errors: variable=value: the problem (allowed: ...)."""
    return "; ".join(_describe(error, model) for error in exc.errors())


def _describe(error: Any, model: type[BaseSettings]) -> str:
    message = str(error["msg"]).removeprefix(VALUE_ERROR_PREFIX)
    if not error["loc"]:
        return message  # a rule over several fields (its message names them)
    key = ".".join(str(part) for part in error["loc"])
    fields = model.model_fields
    field = fields.get(key) or next((f for f in fields.values() if env_name(f) == key), None)
    if field is None:
        return f"{key}: {message}"
    shown = "(hidden)" if is_secret(field) else repr(error.get("input"))
    return f"{key}={shown}: {message} (allowed: {allowed(field)})"


class DeclaredEnvironment(PydanticBaseSettingsSource):
    """The declared variables that are set and not empty; for a secret set so neither, its NAME_FILE's contents."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False  # unused: __call__ reads every field at once

    def __call__(self) -> dict[str, Any]:
        values: dict[str, Any] = {}
        for field in self.settings_cls.model_fields.values():
            name = env_name(field)
            value = (env_secret(name) if is_secret(field) else os.environ.get(name, "")) if name else ""
            if value:
                values[name] = value
        return values


class SpecdecSettings(BaseSettings):
    """Settings read from the declared environment variables when built; keyword arguments override them."""

    model_config = SettingsConfigDict(
        validate_by_name=True, validate_by_alias=True, validate_assignment=True, extra="forbid", allow_inf_nan=False
    )

    def __init__(self, **values: Any) -> None:
        try:
            super().__init__(**values)
        except ValidationError as exc:
            raise ConfigError(describe_error(exc, type(self))) from exc

    def __setattr__(self, name: str, value: Any) -> None:
        try:
            super().__setattr__(name, value)
        except ValidationError as exc:
            raise ConfigError(describe_error(exc, type(self))) from exc

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Keyword arguments, then the declared variables (no .env file, no secrets directory)."""
        return init_settings, DeclaredEnvironment(settings_cls)


def lower_stripped(value: Any) -> Any:
    """A choice as written in any case, with spaces around it ("  Auto " -> "auto")."""
    return value.strip().lower() if isinstance(value, str) else value


def comma_list(value: Any) -> Any:
    """ "a,b,,c" -> ("a", "b", "c"); anything else as it is."""
    return tuple(part for part in value.split(",") if part) if isinstance(value, str) else value
