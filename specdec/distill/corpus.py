"""The prompt corpus: shipped chat prompts plus optional Python docstrings, with a fixed held-out split.

The split is a hash of the prompt text (not its position), so it never changes when
the corpus grows: a prompt is held out iff sha1(text) mod 10 == 0 (about 10 %).
Held-out prompts are never generated for nor trained on; the final report uses them.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import json
import random
from dataclasses import dataclass
from pathlib import Path

SHIPPED_PROMPTS = Path(__file__).with_name("prompts.jsonl")
HELD_OUT_MOD = 10
DOC_MODULES = (
    "json",
    "os",
    "os.path",
    "re",
    "collections",
    "itertools",
    "functools",
    "pathlib",
    "string",
    "textwrap",
    "datetime",
    "random",
    "statistics",
    "math",
    "heapq",
    "bisect",
    "csv",
    "shutil",
    "argparse",
    "logging",
    "typing",
    "dataclasses",
    "enum",
    "fractions",
    "decimal",
    "difflib",
    "urllib.parse",
    "html",
    "base64",
    "hashlib",
    "contextlib",
    "copy",
    "pprint",
    "calendar",
    "zipfile",
    "tarfile",
    "glob",
    "fnmatch",
    "tempfile",
    "uuid",
    "secrets",
    "sqlite3",
    "unittest",
)
DOC_TEMPLATES = (
    "Explain what this Python documentation means, with an example:\n\n{doc}",
    "Summarize the following text in simple words:\n\n{doc}",
    "Write a short Python example that uses {name}. Here is its documentation:\n\n{doc}",
    "What does {name} do? Documentation:\n\n{doc}",
)
MIN_DOC_CHARS, MAX_DOC_CHARS = 80, 600


@dataclass(frozen=True)
class Corpus:
    train: list[str]
    held_out: list[str]


def is_held_out(text: str) -> bool:
    """The fixed 10 % held-out rule (stable under corpus growth)."""
    return int(hashlib.sha1(text.encode("utf-8")).hexdigest(), 16) % HELD_OUT_MOD == 0


def read_prompts(path: Path) -> list[str]:
    """Prompts from a .jsonl file ({"prompt": ...} per line) or a plain text file (one per line)."""
    out = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if not line:
            continue
        out.append(json.loads(line)["prompt"] if line.startswith("{") else line)
    return out


def stdlib_docstrings(limit: int, seed: int) -> list[str]:
    """Prompts built from docstrings of stdlib functions and classes found on this machine."""
    docs: list[tuple[str, str]] = []
    for mod_name in DOC_MODULES:
        try:
            mod = importlib.import_module(mod_name)
        except ImportError:
            continue
        for name, obj in sorted(vars(mod).items()):
            if name.startswith("_") or not (inspect.isfunction(obj) or inspect.isclass(obj) or inspect.isbuiltin(obj)):
                continue
            doc = inspect.getdoc(obj) or ""
            if len(doc) >= MIN_DOC_CHARS:
                docs.append((f"{mod_name}.{name}", doc[:MAX_DOC_CHARS].strip()))
    rng = random.Random(seed)
    rng.shuffle(docs)
    seen, out = set(), []
    for i, (name, doc) in enumerate(docs):
        if doc in seen:
            continue
        seen.add(doc)
        out.append(DOC_TEMPLATES[i % len(DOC_TEMPLATES)].format(name=name, doc=doc))
        if len(out) >= limit:
            break
    return out


def build_corpus(prompts_file: Path | None = None, docstrings: int = 0, seed: int = 0) -> Corpus:
    """Shipped (or given) chat prompts + `docstrings` docstring prompts, split train / held-out."""
    prompts = read_prompts(prompts_file or SHIPPED_PROMPTS)
    chat_train = [p for p in prompts if not is_held_out(p)]
    held_out = [p for p in prompts if is_held_out(p)]
    extra = [p for p in stdlib_docstrings(docstrings, seed) if not is_held_out(p)] if docstrings else []
    return Corpus(train=chat_train + extra, held_out=held_out)


MIN_TEXT_CHARS = 300  # docstrings longer than this
MIN_PARAGRAPH_CHARS = 400  # package-description sections longer than this
MAX_PARAGRAPH_CHARS = 3000
TEXT_QUESTION = "Explain {name} in Python."
PACKAGE_QUESTION = "Describe this Python package."


def reference_texts(seed: int) -> list[tuple[str, str]]:
    """(question, answer) pairs of text found on this machine, for teacher-forced training data: the
    longer docstrings of the Python standard library (parsed, not imported; tests skipped) and the
    sections of the installed packages' descriptions (their METADATA), shuffled with `seed`. The
    target's choices (and hidden states) on them are labels as good as on its own continuations,
    and far cheaper: one prefill each, no generation."""
    import ast
    import site
    import sysconfig

    out: list[tuple[str, str]] = []
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).rglob("*.py")):
        if "/test" in str(path) or "site-packages" in str(path):
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError, OSError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node)
                if doc and len(doc) > MIN_TEXT_CHARS:
                    out.append((TEXT_QUESTION.format(name=getattr(node, "name", path.name)), doc))
    for packages in site.getsitepackages():
        for meta in sorted(Path(packages).glob("*.dist-info/METADATA")):
            body = meta.read_text(encoding="utf-8", errors="ignore").split("\n\n", 1)[-1]
            out += [
                (PACKAGE_QUESTION, section[:MAX_PARAGRAPH_CHARS])
                for section in body.split("\n\n\n")
                if len(section) > MIN_PARAGRAPH_CHARS
            ]
    random.Random(seed).shuffle(out)
    return out
