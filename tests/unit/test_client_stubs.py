"""Clients beyond Python: TypeScript and Go stubs generated from the proto module by `buf generate`
(proto/buf.gen.yaml, local plugins) and built, so a change that breaks either language's code fails here.

TypeScript: protoc-gen-es and tsc as proto/package.json pins them (strict type check). Go: Debian's
golang-go, protoc-gen-go, protoc-gen-go-grpc and the gRPC and protobuf Go libraries (.ci/run installs
them), built in GOPATH mode with `go build` and `go vet` (the build needs no module download)."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_proto_module import PROTO, buf  # noqa: F401  (the fixture that installs proto/'s node tools)

GOCODE = Path("/usr/share/gocode")
GO_PACKAGE = "agentrt.dev/api/gen/go/agentrt/v1"  # the go_package of every agentrt file


@pytest.fixture(scope="module")
def generated(buf: Path) -> Iterator[Path]:  # noqa: F811
    # Inside proto/ so that the TypeScript finds @bufbuild/protobuf in proto/node_modules; ignored by git.
    out = PROTO / "gen"
    shutil.rmtree(out, ignore_errors=True)
    env = {**os.environ, "PATH": os.pathsep.join([str(PROTO / "node_modules" / ".bin"), os.environ["PATH"]])}
    if _go_tools() is not None:
        # buf.gen.yaml names the Go plugins too: without them, generate the TypeScript only.
        template = '{"version": "v2", "plugins": [{"local": "protoc-gen-es", "out": "gen/ts", "opt": ["target=ts"]}]}'
    else:
        template = "buf.gen.yaml"
    result = subprocess.run([str(buf), "generate", "--template", template], cwd=PROTO, env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    yield out
    shutil.rmtree(out, ignore_errors=True)


def _go_tools() -> str | None:
    """Why the Go stubs cannot be built here (None: they can)."""
    missing = [tool for tool in ("go", "protoc-gen-go", "protoc-gen-go-grpc") if shutil.which(tool) is None]
    if missing:
        return f"not on PATH: {', '.join(missing)} (apt-get install golang-go protoc-gen-go protoc-gen-go-grpc)"
    for library in ("google.golang.org/grpc", "google.golang.org/protobuf"):
        if not (GOCODE / "src" / library).is_dir():
            return f"the Go library {library} is not in {GOCODE} (golang-google-grpc-dev, golang-google-protobuf-dev)"
    return None


def test_typescript_stubs_are_generated_for_every_file_and_type_check(generated: Path):
    ts = sorted(p.relative_to(generated / "ts").as_posix() for p in (generated / "ts").rglob("*.ts"))
    assert ts == ["agentrt/v1/common_pb.ts", "agentrt/v1/run_service_pb.ts", "agentrt/v1/work_service_pb.ts",
                  "google/rpc/code_pb.ts", "google/rpc/error_details_pb.ts", "google/rpc/status_pb.ts"]
    run_service = (generated / "ts" / "agentrt" / "v1" / "run_service_pb.ts").read_text()
    assert "export const RunService: GenService<" in run_service and "ResumeRunRequest" in run_service
    tsc = PROTO / "node_modules" / ".bin" / "tsc"
    result = subprocess.run([str(tsc), "-p", "tsconfig.stubs.json"], cwd=PROTO, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr


def test_go_stubs_are_generated_and_build(generated: Path, tmp_path: Path):
    why = _go_tools()
    if why is not None:
        pytest.skip(why)
    package = tmp_path / "src" / GO_PACKAGE
    package.mkdir(parents=True)
    sources = sorted((generated / "go" / "agentrt" / "v1").glob("*.go"))
    assert {p.name for p in sources} == {"common.pb.go", "run_service.pb.go", "run_service_grpc.pb.go",
                                         "work_service.pb.go", "work_service_grpc.pb.go"}
    for source in sources:
        shutil.copy(source, package / source.name)
    env = {**os.environ, "GO111MODULE": "off", "GOPATH": f"{tmp_path}{os.pathsep}{GOCODE}",
           "GOCACHE": str(tmp_path / "cache"), "GOFLAGS": "", "CGO_ENABLED": "0"}
    for command in (["go", "build", GO_PACKAGE], ["go", "vet", GO_PACKAGE]):
        result = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
        assert result.returncode == 0, f"{' '.join(command)}:\n{result.stdout}{result.stderr}"
    client = (package / "run_service_grpc.pb.go").read_text()
    assert "func NewRunServiceClient(" in client and "ResumeRun(ctx context.Context" in client
