"""The proto module as other languages consume it: `buf lint` (STANDARD + COMMENTS) and `buf build`
clean, `buf breaking` against the baseline in proto/BREAKING_BASELINE, the documented lint
exceptions and nothing else, pinned language options, and the vendored google/rpc files.

buf is the exact version proto/package.json pins, installed by `npm ci` in proto/ when
proto/node_modules lacks it; the buf tests skip only when npm itself is missing.
"""

from __future__ import annotations

import fcntl
import importlib.metadata
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests_paths import REPO

PROTO = REPO / "proto"
BUF = PROTO / "node_modules" / ".bin" / "buf"
# Everything proto/package.json pins: buf, and the TypeScript generator and compiler
# (tests/unit/test_client_stubs.py); a node_modules lacking one is installed again.
NODE_TOOLS = [PROTO / "node_modules" / ".bin" / name for name in ("buf", "protoc-gen-es", "tsc")]
AGENTRT_FILES = sorted((PROTO / "agentrt").rglob("*.proto"))

# The frozen v1 names (proto/README.md, "Versioning"): each RPC and the rules it is excused from.
FROZEN_EXCEPTIONS = {
    "GetRun": {"RPC_RESPONSE_STANDARD_NAME", "RPC_REQUEST_RESPONSE_UNIQUE"},
    "CancelRun": {"RPC_RESPONSE_STANDARD_NAME", "RPC_REQUEST_RESPONSE_UNIQUE"},
    "ResumeRun": {"RPC_RESPONSE_STANDARD_NAME", "RPC_REQUEST_RESPONSE_UNIQUE"},
    "UpdateSchedule": {"RPC_RESPONSE_STANDARD_NAME", "RPC_REQUEST_RESPONSE_UNIQUE"},
    "PauseSchedule": {"RPC_RESPONSE_STANDARD_NAME", "RPC_REQUEST_RESPONSE_UNIQUE"},
    "DeleteSchedule": {"RPC_RESPONSE_STANDARD_NAME", "RPC_REQUEST_RESPONSE_UNIQUE"},
    "GetRunHistory": {"RPC_RESPONSE_STANDARD_NAME"},
    "GetStats": {"RPC_RESPONSE_STANDARD_NAME"},
    "RevokeApiKey": {"RPC_RESPONSE_STANDARD_NAME"},
    "SetLimit": {"RPC_RESPONSE_STANDARD_NAME"},
}

# Every agentrt file's language options. Changing one changes every generated client's package:
# only with a new API version (and buf breaking does not check them until the first release tag).
LANGUAGE_OPTIONS = {
    "csharp_namespace": '"Agentrt.V1"',
    "go_package": '"agentrt.dev/api/gen/go/agentrt/v1;agentrtv1"',
    "java_multiple_files": "true",
    "java_package": '"dev.agentrt.api.v1"',
    "php_namespace": '"Agentrt\\\\V1"',
    "ruby_package": '"Agentrt::V1"',
}


@pytest.fixture(scope="session")
def buf() -> Iterator[Path]:
    """The pinned buf binary, installed from proto/package-lock.json when missing."""
    if not all(tool.exists() for tool in NODE_TOOLS):
        npm = shutil.which("npm")
        if npm is None:
            pytest.skip("npm is not on PATH, so the pinned buf (proto/package.json) cannot be installed")
        # One installer at a time (parallel pytest workers share proto/node_modules).
        with open(PROTO / "package-lock.json") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                if not all(tool.exists() for tool in NODE_TOOLS):
                    result = subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=PROTO,
                                            capture_output=True, text=True, timeout=600)
                    assert result.returncode == 0, f"npm ci in proto/ failed:\n{result.stdout}\n{result.stderr}"
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)
    assert BUF.exists(), "npm ci did not install node_modules/.bin/buf"
    yield BUF


def _run(args: list[str | Path], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(a) for a in args], cwd=cwd, capture_output=True, text=True, timeout=300)


def _baseline_input(repo_git: Path | str = ".git") -> str:
    """What make proto-lint compares against (proto/baseline-input: the baseline, cloned deep enough to hold it)."""
    made = _run([PROTO / "baseline-input", repo_git], REPO)
    assert made.returncode == 0, made.stderr
    return made.stdout.strip()


@pytest.fixture(scope="session")
def baseline_ref() -> str:
    """The baseline commit; the breaking tests need it in the local history."""
    ref = (PROTO / "BREAKING_BASELINE").read_text().strip()
    assert re.fullmatch(r"[0-9a-f]{7,40}|[A-Za-z0-9._/-]+", ref), f"BREAKING_BASELINE holds {ref!r}"
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("not a git checkout: buf breaking needs the baseline commit")
    found = _run(["git", "cat-file", "-e", f"{ref}^{{commit}}"], REPO)
    if found.returncode != 0:
        pytest.skip(f"baseline {ref} is not in this clone's history (a shallow clone?): fetch it to check")
    return ref


def _copy_module(tmp_path: Path) -> Path:
    copy = tmp_path / "proto"
    shutil.copytree(PROTO, copy, ignore=shutil.ignore_patterns("node_modules"))
    return copy


def test_buf_lint_is_clean(buf: Path) -> None:
    result = _run([buf, "lint"], PROTO)
    assert result.returncode == 0 and not result.stdout.strip(), result.stdout + result.stderr


def test_buf_build_succeeds(buf: Path) -> None:
    result = _run([buf, "build"], PROTO)
    assert result.returncode == 0, result.stderr


def test_no_breaking_change_against_the_baseline(buf: Path, baseline_ref: str) -> None:
    result = _run([buf, "breaking", "proto", "--against", _baseline_input()], REPO)
    assert result.returncode == 0, result.stdout + result.stderr


def test_breaking_check_catches_a_renumbered_field(buf: Path, baseline_ref: str, tmp_path: Path) -> None:
    copy = _copy_module(tmp_path)
    common = copy / "agentrt" / "v1" / "common.proto"
    text = common.read_text()
    assert "string run_id = 1;" in text
    common.write_text(text.replace("string run_id = 1;", "string run_id = 999;", 1))
    result = _run([buf, "breaking", copy, "--against", _baseline_input(REPO / ".git")], REPO)
    assert result.returncode != 0
    assert "run_id" in result.stdout, result.stdout + result.stderr


def test_a_new_rpc_is_still_linted(buf: Path, tmp_path: Path) -> None:
    """The exceptions sit on the 10 frozen RPCs, not in buf.yaml: a new RPC answering a bare
    resource, or with no comment, is refused."""
    copy = _copy_module(tmp_path)
    service = copy / "agentrt" / "v1" / "run_service.proto"
    text = service.read_text()
    anchor = "  rpc ListLimits(ListLimitsRequest) returns (ListLimitsResponse);\n"
    assert anchor in text
    service.write_text(text.replace(anchor, anchor + "  rpc PeekRun(GetRunRequest) returns (Run);\n"))
    result = _run([buf, "lint"], copy)
    assert result.returncode != 0
    for rule_text in ("PeekRun", "should have a non-empty comment", "GetRunRequest", "PeekRunResponse"):
        assert rule_text in result.stdout, result.stdout


def test_lint_ignores_are_exactly_the_documented_exceptions() -> None:
    text = (PROTO / "agentrt" / "v1" / "run_service.proto").read_text()
    found: dict[str, set[str]] = {}
    pending: set[str] = set()
    for line in text.splitlines():
        ignore = re.match(r"\s*// buf:lint:ignore (\w+)", line)
        if ignore:
            pending.add(ignore.group(1))
            continue
        rpc = re.match(r"\s*rpc (\w+)\(", line)
        if rpc and pending:
            found[rpc.group(1)] = pending
        if not line.strip().startswith("//"):
            pending = set()
    assert not pending
    assert found == FROZEN_EXCEPTIONS
    assert sum(map(len, found.values())) == 16
    for path in AGENTRT_FILES:
        if path.name != "run_service.proto":
            assert "buf:lint:ignore" not in path.read_text(), path
    readme = (PROTO / "README.md").read_text()
    for rpc_name in FROZEN_EXCEPTIONS:
        assert rpc_name in readme, f"proto/README.md does not list the exception {rpc_name}"


def test_language_options_are_pinned() -> None:
    assert AGENTRT_FILES
    for path in AGENTRT_FILES:
        options = dict(re.findall(r"^option (\w+) = (.+);$", path.read_text(), re.MULTILINE))
        outer = "".join(part.capitalize() for part in path.stem.split("_")) + "Proto"
        assert options == {**LANGUAGE_OPTIONS, "java_outer_classname": f'"{outer}"'}, path


def test_vendored_google_rpc_protos() -> None:
    vendored = PROTO / "google" / "rpc"
    assert sorted(p.name for p in vendored.glob("*.proto")) == ["code.proto", "error_details.proto",
                                                                 "status.proto"]
    assert "Apache License" in (PROTO / "google" / "LICENSE").read_text()
    version = re.search(r"googleapis-common-protos (\d+\.\d+\.\d+)",
                        (PROTO / "google" / "VENDORED.md").read_text())
    assert version is not None
    # Python clients use the package itself: nothing of google/ is generated into shared/gen.
    assert not (REPO / "shared" / "gen" / "google").exists()
    installed = importlib.metadata.version("googleapis-common-protos")
    if installed != version.group(1):
        pytest.skip(f"googleapis-common-protos {installed} installed, {version.group(1)} vendored")
    import google.rpc

    package_dir = Path(next(iter(google.rpc.__path__)))
    for path in vendored.glob("*.proto"):
        assert path.read_bytes() == (package_dir / path.name).read_bytes(), f"{path.name} differs from the package"
