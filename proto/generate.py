"""Regenerate the committed protobuf/gRPC code from proto/ (run by `make proto`).

Output goes to shared/gen/ with .pyi stubs. protoc writes absolute imports
(`from agentrt.v1 import common_pb2`); they are rewritten to the package path
so the generated modules import without touching sys.path.

`python proto/generate.py --check` regenerates into a temporary directory and
exits non-zero when the committed files differ (used by the test suite).
"""

from __future__ import annotations

import argparse
import filecmp
import re
import sys
import tempfile
from pathlib import Path

from grpc_tools import protoc  # type: ignore[import-untyped]

ROOT = Path(__file__).resolve().parent.parent
PROTO_DIR = ROOT / "proto"
OUT_DIR = ROOT / "shared" / "gen"
PACKAGE_PREFIX = "shared.gen."


def _generate(out: Path) -> list[Path]:
    import grpc_tools

    include = Path(grpc_tools.__file__).parent / "_proto"
    # Only the agentrt module: the vendored google/rpc files are for other
    # languages; Python clients import them from googleapis-common-protos.
    protos = sorted((PROTO_DIR / "agentrt").rglob("*.proto"))
    out.mkdir(parents=True, exist_ok=True)
    args = [
        "grpc_tools.protoc",
        f"-I{PROTO_DIR}",
        f"-I{include}",
        f"--python_out={out}",
        f"--pyi_out={out}",
        f"--grpc_python_out={out}",
        *[str(p.relative_to(PROTO_DIR)) for p in protos],
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    generated = sorted(p for p in out.rglob("*") if p.suffix in {".py", ".pyi"})
    pattern = re.compile(r"^from agentrt\.v1 import", re.MULTILINE)
    for path in generated:
        text = pattern.sub(f"from {PACKAGE_PREFIX}agentrt.v1 import", path.read_text())
        path.write_text(text)
    for package_dir in {out, *(p.parent for p in generated)}:
        init = package_dir / "__init__.py"
        if not init.exists():
            init.write_text("")
        while package_dir != out:
            package_dir = package_dir.parent
            (package_dir / "__init__.py").touch()
    return sorted(p for p in out.rglob("*") if p.is_file() and p.suffix in {".py", ".pyi"})


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if committed code is stale")
    options = parser.parse_args()
    if not options.check:
        _generate(OUT_DIR)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        fresh = _generate(Path(tmp))
        stale = []
        for path in fresh:
            committed = OUT_DIR / path.relative_to(tmp)
            if not committed.exists() or not filecmp.cmp(path, committed, shallow=False):
                stale.append(str(committed.relative_to(ROOT)))
        if stale:
            print("stale generated code (run `make proto`): " + ", ".join(stale), file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
