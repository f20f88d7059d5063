"""Generate the Python code of the wire protocol from protos/ (the single source).

Usage: python scripts/gen_protos.py [--out DIR]

The .proto files live under protos/specdec/v1/; the generated modules land in
DIR/specdec/v1/ (DIR defaults to the repository root, i.e. the package
specdec.v1). Never edit the generated files by hand: tests/unit/test_protos_in_sync.py
regenerates into a temporary folder and fails when they differ.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "protos"
PACKAGE_PATH = Path("specdec") / "v1"
INIT_TEXT = '"""Generated from protos/specdec/v1 by scripts/gen_protos.py. Do not edit."""\n'


def proto_files() -> list[Path]:
    """All .proto files of the protocol package, sorted."""
    return sorted((PROTO_ROOT / PACKAGE_PATH).glob("*.proto"))


def generate(out_dir: Path) -> list[Path]:
    """Run protoc on every .proto file; return the generated files."""
    target = out_dir / PACKAGE_PATH
    target.mkdir(parents=True, exist_ok=True)
    include = str(Path(protoc.__file__).parent / "_proto")
    args = [
        "grpc_tools.protoc",
        f"-I{PROTO_ROOT}",
        f"-I{include}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        *(str(p.relative_to(PROTO_ROOT)) for p in proto_files()),
    ]
    code = protoc.main(args)
    if code != 0:
        raise SystemExit(f"protoc failed with exit code {code}")
    (target / "__init__.py").write_text(INIT_TEXT)
    return sorted(p for p in target.iterdir() if p.suffix in {".py", ".pyi"})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT, help="output root (default: repo root)")
    args = parser.parse_args(argv)
    for path in generate(args.out):
        print(path.relative_to(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
