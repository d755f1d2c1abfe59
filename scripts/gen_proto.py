"""Regenerate timeslice/api/gen from the .proto files in timeslice/api/proto.

    python scripts/gen_proto.py            # rewrite the generated code
    python scripts/gen_proto.py --check    # exit 1 if the committed code is stale

The generators are pinned exactly in pyproject.toml (extra "dev"); a different
version may generate different code, which the --check mode reports as stale.
"""

from __future__ import annotations

import argparse
import filecmp
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "timeslice" / "api" / "proto"
GEN_ROOT = ROOT / "timeslice" / "api" / "gen"
OPTIONS = "client_generation=async,server_generation=async"


def generate(out: Path) -> None:
    """Run protoc with the betterproto2 plugin into `out`."""
    import grpc_tools  # noqa: PLC0415  (a dev-only dependency)

    include = Path(grpc_tools.__file__).parent / "_proto"
    protos = sorted(str(p.relative_to(PROTO_ROOT)) for p in PROTO_ROOT.rglob("*.proto"))
    plugin = shutil.which("protoc-gen-python_betterproto2", path=str(Path(sys.executable).parent))
    if plugin is None:
        sys.exit("protoc-gen-python_betterproto2 not found: pip install -e '.[dev]'")
    out.mkdir(parents=True, exist_ok=True)
    # The plugin formats its output with ruff, found on PATH and configured from
    # the working directory: run it beside the pinned tools, outside this
    # repository, so that the project's own ruff settings do not change the code.
    bin_dir = str(Path(sys.executable).parent)
    env = {**os.environ, "PATH": bin_dir + os.pathsep + os.environ.get("PATH", "")}
    subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            f"-I{PROTO_ROOT}",
            f"-I{include}",
            f"--plugin=protoc-gen-python_betterproto2={plugin}",
            f"--python_betterproto2_out={out}",
            f"--python_betterproto2_opt={OPTIONS}",
            *protos,
        ],
        check=True,
        cwd=out,
        env=env,
    )


def differences(a: Path, b: Path) -> list[str]:
    """Relative paths of the files that differ between two trees."""
    names = {p.relative_to(a) for p in a.rglob("*.py")} | {
        p.relative_to(b) for p in b.rglob("*.py")
    }
    return sorted(
        str(n)
        for n in names
        if not ((a / n).exists() and (b / n).exists() and filecmp.cmp(a / n, b / n, shallow=False))
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--check", action="store_true", help="only report whether the code is stale"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        fresh = Path(tmp) / "gen"
        generate(fresh)
        stale = differences(fresh, GEN_ROOT)
        if args.check:
            for name in stale:
                print(f"stale: timeslice/api/gen/{name}")
            return 1 if stale else 0
        shutil.rmtree(GEN_ROOT, ignore_errors=True)
        shutil.copytree(fresh, GEN_ROOT)
        print(f"wrote {GEN_ROOT.relative_to(ROOT)} ({len(stale)} file(s) changed)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
