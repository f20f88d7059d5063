"""A model's tokenizer described in a short-lived child process.

A service on the llama.cpp engine needs its tokenizer only once, to publish a TokenizerInfo (fingerprint,
special tokens, EOS ids) in Info. Reading a GGUF's tokenizer with transformers imports its GGUF and model code
(sympy and torch.distributed among it): about 130 MB that would stay resident for the service's life. A
child process reads it instead and hands back the description as JSON.

    python -m specdec.models.tokenizer_apart MODEL [--cache-dir DIR] [--offline]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from specdec.models.spec import ModelLoadError
from specdec.models.tokenizer_info import TokenizerInfo

# A hub model's tokenizer files may be downloaded by the child: minutes, not hours.
TOKENIZER_CHILD_TIMEOUT_S = 600.0
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])  # where `specdec` is importable from


def describe_apart(
    model: str, cache_dir: str | None, offline: bool, timeout_s: float = TOKENIZER_CHILD_TIMEOUT_S
) -> TokenizerInfo:
    """The TokenizerInfo of `model` (a model spec), computed in a child process. Raises ModelLoadError with
    the child's one-line reason when it cannot be read."""
    cmd = [sys.executable, "-m", "specdec.models.tokenizer_apart", model]
    cmd += ["--cache-dir", cache_dir] if cache_dir else []
    cmd += ["--offline"] if offline else []
    path = os.pathsep.join(filter(None, (_PACKAGE_ROOT, os.environ.get("PYTHONPATH", ""))))
    try:
        done = subprocess.run(
            cmd, capture_output=True, text=True, timeout=timeout_s, check=False, env={**os.environ, "PYTHONPATH": path}
        )
    except subprocess.TimeoutExpired as exc:
        raise ModelLoadError(f"reading the tokenizer of {model} took over {timeout_s:.0f} s") from exc
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines() or [f"exit status {done.returncode}"]
        raise ModelLoadError(f"cannot read the tokenizer of {model}: {lines[-1]}")
    return TokenizerInfo.from_dict(json.loads(done.stdout.strip().splitlines()[-1]))


def main(argv: list[str] | None = None) -> int:
    from specdec.models.load_config import load_config
    from specdec.models.loader import load_tokenizer
    from specdec.models.spec import parse_model_spec
    from specdec.models.tokenizer_info import describe_tokenizer

    parser = argparse.ArgumentParser(prog="python -m specdec.models.tokenizer_apart")
    parser.add_argument("model")
    parser.add_argument("--cache-dir", default=None)
    parser.add_argument("--offline", action="store_true")
    args = parser.parse_args(argv)
    try:
        tokenizer = load_tokenizer(
            parse_model_spec(args.model), load_config("cpu", "auto", args.cache_dir, args.offline)
        )
    except ModelLoadError as exc:
        print(exc, file=sys.stderr)
        return 1
    print(json.dumps(describe_tokenizer(tokenizer).to_dict()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
