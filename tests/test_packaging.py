"""The package as users get it: the wheel carries every file the code needs, and the licence.

An editable install (``pip install -e``) reads src/ directly and so hides a file
the wheel forgot (issue 15: the wheel lacked storage/queries.sql and every
Engine failed on first use). These tests build the real wheel from a copy of
the project and compare its contents with src/durably file by file.
"""

from __future__ import annotations

import email
import shutil
import subprocess
import sys
import zipfile
from importlib import metadata
from pathlib import Path

import pytest

import durably

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src" / "durably"


def _setuptools_builds_offline() -> bool:
    """True when the installed setuptools can build our wheel without fetching another one."""
    try:
        major = int(metadata.version("setuptools").split(".")[0])
    except metadata.PackageNotFoundError:
        return False
    return major >= 77  # PEP 639 license-files, and bdist_wheel without the wheel package


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> zipfile.ZipFile:
    """The wheel built from a clean copy of the project (no stale build/ or egg-info)."""
    base = tmp_path_factory.mktemp("wheel")
    project = base / "project"
    project.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE", "CHANGELOG.md"):
        if (ROOT / name).exists():
            shutil.copy2(ROOT / name, project / name)
    shutil.copytree(
        ROOT / "src",
        project / "src",
        ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info"),
    )
    # Bytecode as an in-tree build after a test run would find it; it must stay out.
    planted = project / "src" / "durably" / "storage" / "__pycache__"
    planted.mkdir()
    (planted / "planted.cpython-311.pyc").write_bytes(b"")
    out = base / "dist"
    # Offline when the installed setuptools is new enough (the dev extra pins it); else pip
    # fetches the build requirements from the package index into an isolated environment.
    isolation = ["--no-build-isolation"] if _setuptools_builds_offline() else []
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", *isolation, "-w", str(out), "."],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, f"building the wheel failed:\n{proc.stdout}\n{proc.stderr}"
    built = sorted(out.glob("durably-*.whl"))
    assert len(built) == 1, f"expected one durably wheel in {out}, found {built}"
    return zipfile.ZipFile(built[0])


def _source_files() -> set[str]:
    return {
        "durably/" + p.relative_to(SRC).as_posix()
        for p in SRC.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
    }


def test_every_file_under_src_durably_is_in_the_wheel(wheel: zipfile.ZipFile) -> None:
    files = _source_files()
    assert "durably/storage/queries.sql" in files  # the file this test was written for
    in_wheel = {n for n in wheel.namelist() if n.startswith("durably/")}
    missing = sorted(files - in_wheel)
    assert not missing, f"files under src/durably missing from the wheel: {missing}"


def test_the_wheel_carries_no_bytecode_or_stray_files(wheel: zipfile.ZipFile) -> None:
    stray = sorted(
        n
        for n in wheel.namelist()
        if n.startswith("durably/") and ("__pycache__" in n or n.endswith(".pyc"))
    )
    assert not stray, f"bytecode in the wheel: {stray}"


def test_the_wheel_carries_the_licence(wheel: zipfile.ZipFile) -> None:
    names = wheel.namelist()
    licences = [n for n in names if ".dist-info/" in n and n.rsplit("/", 1)[-1] == "LICENSE"]
    assert licences, f"no LICENSE in the wheel's dist-info: {names}"
    text = wheel.read(licences[0]).decode()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert text == (ROOT / "LICENSE").read_text()
    metadata_name = next(n for n in names if n.endswith(".dist-info/METADATA"))
    metadata = email.message_from_bytes(wheel.read(metadata_name))
    assert metadata["Name"] == "durably"
    assert metadata["Version"] == durably.__version__
    assert metadata.get("License-Expression") == "Apache-2.0"


def test_durably_version_prints_the_installed_version() -> None:
    """``durably --version`` as a user types it: the console script's module, a real process."""
    proc = subprocess.run(
        [sys.executable, "-c", "from durably.cli import main; main()", "--version"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "durably 0.1.0\n"


def test_version_comes_from_the_installed_metadata() -> None:
    assert durably.__version__ == metadata.version("durably") == "0.1.0"
