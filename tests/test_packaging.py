"""The wheel installs one namespace: ``tvm_interop``, ``tvm_interop.passes``, ``tvm_interop.runtime`` -- no
top-level ``passes`` or ``runtime`` in a user's site-packages -- and every source file of the three folders."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FOLDERS = {"tvm_interop": "tvm_interop", "passes": "tvm_interop/passes", "runtime": "tvm_interop/runtime"}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> str:
    # built from a copy of what the wheel is made of, so no build/ folder in the checkout (stale files in it
    # would go into the wheel) and nothing written into the repository
    src = tmp_path_factory.mktemp("src")
    for folder in FOLDERS:
        shutil.copytree(os.path.join(REPO, folder), src / folder,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for f in ("pyproject.toml", "README.md"):
        shutil.copy(os.path.join(REPO, f), src / f)
    out = tmp_path_factory.mktemp("wheel")
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", str(src), "--no-deps", "--no-build-isolation", "-q",
                        "--disable-pip-version-check", "-w", str(out)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    (name,) = [f for f in os.listdir(out) if f.endswith(".whl")]
    return str(out / name)


def test_wheel_has_one_top_level_package_and_every_source_file(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {"tvm_interop"}, tops
    missing = []
    for folder, installed in FOLDERS.items():
        for dirpath, _, files in os.walk(os.path.join(REPO, folder)):
            for f in files:
                if f.endswith(".py"):
                    rel = os.path.relpath(os.path.join(dirpath, f), os.path.join(REPO, folder)).replace(os.sep, "/")
                    if f"{installed}/{rel}" not in names:
                        missing.append(f"{folder}/{rel}")
    assert not missing, f"not in the wheel (add the package to pyproject's packages): {missing}"


def test_installed_wheel_imports_by_the_namespace_only(wheel, tmp_path):
    """Unpacked alone on the path (TVM from this environment): the namespace imports from the wheel's own files,
    the front door stays lazy (no compile API until asked), and the folder names are not importable."""
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    code = ("import sys, tvm_interop\n"
            "from tvm_interop import runtime\n"
            "import tvm_interop.passes.schedulers as s\n"
            "print('FILES', runtime.__file__, s.__file__)\n"
            "print('LAZY', 'tvm_interop.api' in sys.modules)\n"
            "for name in ('passes', 'runtime'):\n"
            "    try:\n        __import__(name)\n        print('TOPLEVEL', name)\n"
            "    except ModuleNotFoundError:\n        pass\n")
    env = dict(os.environ, PYTHONPATH=str(site))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=str(tmp_path),
                       timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    files = r.stdout.split("FILES ")[1].split("\n")[0].split()
    assert all(f.startswith(str(site)) for f in files), files
    assert "LAZY False" in r.stdout and "TOPLEVEL" not in r.stdout, r.stdout
