"""The image's run-time root filesystem: what the interpreter and the venv need, and nothing else.

Run inside the Dockerfile's build stage (`python image/rootfs.py /rootfs`, standard library only), on either
base, Debian's packages or python:3.11-slim: it copies the venv, the interpreter with the links that lead to
it, the standard library without what no function imports (tests, IDLE, Tk, ensurepip, lib2to3, …), every
shared library that `ldd` names for the interpreter and each extension module (and libgcc_s, which glibc
loads by name when a thread exits), the CA bundle and OpenSSL's configuration, and a passwd/group naming the
non-root user. The final stage starts FROM scratch with this folder: no shell, no package manager, no
coreutils at run time.
"""
from __future__ import annotations

import compileall
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

VENV = Path("/opt/vmevents")
# Standard-library parts no function, functions-framework, gunicorn or their dependencies import at run time.
STDLIB_UNUSED = {"test", "idlelib", "tkinter", "turtledemo", "ensurepip", "lib2to3", "pydoc_data", "turtle.py",
                 "config-3.11-x86_64-linux-gnu", "site-packages", "dist-packages", "venv"}
# The venv's parts nothing imports at run time: the package manager and its build tools (a goal of the
# image: no package manager in it), and the kubernetes client's asyncio twin (kubernetes/aio, 68 MiB of the
# 126 MiB the client takes; shared/kube.py uses the synchronous client only).
SITE = VENV / "lib" / "python3.11" / "site-packages"
VENV_UNUSED = ("bin/pip*", "lib/python3.11/site-packages/pip", "lib/python3.11/site-packages/pip-*.dist-info",
               "lib/python3.11/site-packages/setuptools", "lib/python3.11/site-packages/setuptools-*.dist-info",
               "lib/python3.11/site-packages/_distutils_hack", "lib/python3.11/site-packages/pkg_resources",
               "lib/python3.11/site-packages/distutils-precedence.pth", "lib/python3.11/site-packages/kubernetes/aio")
EXTRA_FILES = ("/etc/ssl/certs/ca-certificates.crt", "/usr/lib/ssl/openssl.cnf", "/etc/ssl/openssl.cnf")
NONROOT = 65532


def copy(path: Path, root: Path, whole: bool = True) -> None:
    """Copy `path` into `root` at the same place, following a chain of symlinks (each link copied as a link).
    A directory is copied whole, or (whole=False: a parent of something copied) only created."""
    while True:
        target = root / path.relative_to("/")
        if target.is_symlink() or (target.exists() and (whole is False or not target.is_dir())):
            return
        target.parent.mkdir(parents=True, exist_ok=True)
        if path.is_symlink():
            link = os.readlink(path)
            target.symlink_to(link)
            path = Path(os.path.normpath(path.parent / link))
            continue
        if path.is_dir():
            if whole:
                shutil.copytree(path, target, symlinks=True, dirs_exist_ok=True)
            else:
                target.mkdir(exist_ok=True)
        else:
            shutil.copy2(path, target)
        return


def real_parents(path: Path, root: Path) -> None:
    """Directories that are symlinks on the base (Debian's /lib -> usr/lib) are links in the image too."""
    for parent in reversed(path.parents):
        if parent.is_symlink():
            copy(parent, root, whole=False)


def shared_libraries(files: list[Path]) -> set[Path]:
    found: set[Path] = set()
    for chunk in range(0, len(files), 200):
        out = subprocess.run(["ldd", *map(str, files[chunk:chunk + 200])], capture_output=True, text=True).stdout
        found |= {Path(m) for m in re.findall(r"(?:=>\s*)?(/\S+)\s+\(0x", out)}
    return found


def main(root: Path) -> int:
    # the base python the venv points at (a link to python3.11)
    interpreter = Path(getattr(sys, "_base_executable", sys.executable))
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    dynload = Path(sysconfig.get_config_var("DESTSHARED") or stdlib / "lib-dynload")
    for path in (interpreter, Path(os.path.realpath(interpreter)), VENV):
        real_parents(path, root)
        copy(path, root)
    for pattern in VENV_UNUSED:
        for unused in (root / VENV.relative_to("/")).glob(pattern):
            shutil.rmtree(unused) if unused.is_dir() and not unused.is_symlink() else unused.unlink()
    for entry in sorted(stdlib.iterdir()):
        if entry.name not in STDLIB_UNUSED:
            real_parents(entry, root)
            copy(entry, root)
    if dynload.is_dir() and not str(dynload).startswith(str(stdlib)):
        copy(dynload, root)
    elf = [Path(os.path.realpath(interpreter))] + [p for d in (dynload, VENV) for p in d.rglob("*.so*") if p.is_file()]
    libraries = shared_libraries(elf)
    libgcc = shared_libraries([Path(os.path.realpath(interpreter))])  # the same folders: find libgcc_s beside libc
    for folder in {lib.parent for lib in libgcc}:
        libraries |= set(folder.glob("libgcc_s.so*"))
    for library in sorted(libraries):
        real_parents(library, root)
        copy(library, root)
    for extra in map(Path, EXTRA_FILES):
        if extra.exists():
            real_parents(extra, root)
            copy(extra, root)
    # A link the copies hold that leads outside them (the venv's bin/python -> /usr/bin/python): its chain too.
    for link in [p for p in root.rglob("*") if p.is_symlink()]:
        target = os.readlink(link)
        if os.path.isabs(target) and not os.path.lexists(root / target.lstrip("/")):
            real_parents(Path(target), root)
            copy(Path(target), root)
    (root / "etc").mkdir(exist_ok=True)
    (root / "etc/passwd").write_text(f"root:x:0:0:root:/root:/sbin/nologin\n"
                                     f"nonroot:x:{NONROOT}:{NONROOT}:nonroot:/home/nonroot:/sbin/nologin\n")
    (root / "etc/group").write_text(f"root:x:0:\nnonroot:x:{NONROOT}:\n")
    for name, mode in (("tmp", 0o1777), ("dev/shm", 0o1777), ("home/nonroot", 0o755)):
        (root / name).mkdir(parents=True, exist_ok=True)
        os.chmod(root / name, mode)
    os.chown(root / "home/nonroot", NONROOT, NONROOT)
    # Bytecode for the standard library as copied (Debian compiles it at install time, python:slim ships it).
    compileall.compile_dir(str(root / stdlib.relative_to("/")), quiet=1, workers=0)
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
