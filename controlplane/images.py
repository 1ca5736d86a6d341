"""The real node's container images, built here from source and Debian's packages, never pulled: each is written
as an OCI image archive and imported into the node's containerd (controlplane/node.py).

- `pause`: Kubernetes' own pause.c (build/pause/linux/pause.c of the k8s.io/kubernetes module the kube wrapper pins),
  compiled static with the machine's gcc, the only file of its image, as upstream's image has it.

Archives are cached by what decides their content in ~/.cache/vmevents/images/ (VMEVENTS_CACHE moves it).
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import tarfile
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from controlplane import build

REGISTRY = "localhost/vmevents"   # no registry serves it: the name only tells the images built here apart


class ImageError(RuntimeError):
    """An image could not be built: the message says which and why."""


@dataclass(frozen=True)
class Image:
    name: str       # the reference the node's pods name, e.g. localhost/vmevents/pause:3.10
    archive: Path   # its OCI archive


def cache_dir() -> Path:
    return build.cache_root().parent / "images"


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def write_archive(path: Path, name: str, layers: list[Path], config: dict) -> Path:
    """An OCI image archive (oci-layout, index.json, blobs) of uncompressed layer tarballs, named for containerd's
    import by the `io.containerd.image.name` annotation. config: the image config's `config` (Entrypoint, Env,
    User…)."""
    partial = path.with_suffix(".partial")
    blobs: dict[str, Path | bytes] = {}
    diff_ids, layer_descriptors = [], []
    for layer in layers:
        sha = hashlib.sha256()
        with open(layer, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                sha.update(chunk)
        digest = "sha256:" + sha.hexdigest()
        diff_ids.append(digest)
        blobs[digest] = layer
        layer_descriptors.append({"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": digest,
                                  "size": layer.stat().st_size})
    image_config = json.dumps({"architecture": "amd64", "os": "linux", "config": config,
                               "rootfs": {"type": "layers", "diff_ids": diff_ids},
                               "created": "1970-01-01T00:00:00Z"}, sort_keys=True).encode()
    blobs[_digest(image_config)] = image_config
    manifest = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                           "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                                      "digest": _digest(image_config), "size": len(image_config)},
                           "layers": layer_descriptors}, sort_keys=True).encode()
    blobs[_digest(manifest)] = manifest
    index = json.dumps({"schemaVersion": 2, "manifests": [{
        "mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": _digest(manifest),
        "size": len(manifest), "platform": {"architecture": "amd64", "os": "linux"},
        "annotations": {"io.containerd.image.name": name,
                        "org.opencontainers.image.ref.name": name.rpartition(":")[2]}}]}).encode()
    with tarfile.open(partial, "w") as out:
        def add_bytes(member: str, data: bytes) -> None:
            info = tarfile.TarInfo(member)
            info.size = len(data)
            info.mode = 0o644
            out.addfile(info, fileobj=_BytesReader(data))
        add_bytes("oci-layout", b'{"imageLayoutVersion":"1.0.0"}')
        add_bytes("index.json", index)
        for digest, blob in blobs.items():
            member = f"blobs/sha256/{digest.split(':', 1)[1]}"
            if isinstance(blob, bytes):
                add_bytes(member, blob)
            else:
                out.add(str(blob), arcname=member)
    partial.rename(path)
    return path


class _BytesReader:
    def __init__(self, data: bytes):
        self._data, self._at = data, 0

    def read(self, size: int = -1) -> bytes:
        end = len(self._data) if size < 0 else self._at + size
        chunk, self._at = self._data[self._at:end], min(end, len(self._data))
        return chunk


def layer_from(root: Path, out: Path) -> Path:
    """A layer tarball of a folder, owners by number, file capabilities kept (security.capability xattrs: the
    launcher's virt-launcher-monitor has one)."""
    subprocess.run(["tar", "--numeric-owner", "--xattrs", "--xattrs-include=security.capability", "-C", str(root),
                    "-cf", str(out), "."], check=True)
    return out


def _cached(name: str, key: str, make) -> Path:
    """The archive for `name` at `key`, made by make(path) once: a lock per archive, so two callers share a build."""
    return _cached_file(name, key, "oci.tar", make)


def _cached_file(name: str, key: str, suffix: str, make) -> Path:
    directory = cache_dir()
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}-{key}.{suffix}"
    if path.is_file():
        return path
    with open(directory / f".{name}-{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not path.is_file():
            make(path)
    return path


PAUSE_VERSION = "3.10"   # the version kubeadm 1.33 names (cmd/kubeadm/app/constants PauseVersion)


def module_source(component: build.Component) -> Path:
    """The upstream module's source in Go's module cache, at the version the component's wrapper pins (downloaded if
    missing: it is what the component's build reads anyway)."""
    done = subprocess.run(["go", "mod", "download", "-json", f"{component.module}@{component.version}"],
                          cwd=component.directory, capture_output=True, text=True,
                          env=dict(os.environ, GOFLAGS="-mod=mod", GOTOOLCHAIN="local", GONOSUMDB="kubevirt.io"))
    if done.returncode != 0:
        raise ImageError(f"go mod download {component.module} failed: {done.stderr.strip()[-1000:]}")
    return Path(json.loads(done.stdout)["Dir"])


def pause(say=lambda text: None) -> Image:
    """Kubernetes' pause container: build/pause/linux/pause.c, compiled static, alone in its image."""
    name = f"{REGISTRY}/pause:{PAUSE_VERSION}"

    def make(path: Path) -> None:
        source = module_source(build.KUBE) / "build" / "pause" / "linux" / "pause.c"
        if not shutil.which("gcc"):
            raise ImageError("building the pause image needs gcc (apt-get install gcc libc6-dev)")
        started = time.monotonic()
        with tempfile.TemporaryDirectory(prefix="vmevents-pause-") as tmp:
            root = Path(tmp) / "root"
            root.mkdir()
            # As build/pause/Makefile: -Os -Wall -Werror -static, VERSION stamped.
            done = subprocess.run(["gcc", "-Os", "-Wall", "-Werror", "-static", f'-DVERSION=v{PAUSE_VERSION}',
                                   "-o", str(root / "pause"), str(source)], capture_output=True, text=True)
            if done.returncode != 0:
                raise ImageError(f"compiling {source} failed: {done.stderr.strip()[-1500:]}")
            layer = layer_from(root, Path(tmp) / "layer.tar")
            write_archive(path, name, [layer], {"Entrypoint": ["/pause"], "User": "65535:65535"})
        say(f"built the pause image in {time.monotonic() - started:.1f}s")

    key = hashlib.sha256(f"{build.KUBE.version} {PAUSE_VERSION} 1".encode()).hexdigest()[:12]
    return Image(name, _cached("pause", key, make))


# -- KubeVirt's images ---------------------------------------------------------------------------------------------

SUITE, MIRROR = "bookworm", "http://deb.debian.org/debian"
# What KubeVirt's launcher and handler images hold (rpm/BUILD.bazel launcherbase/handlerbase at v1.3.0: CentOS Stream
# 9's libvirt 10.0 and QEMU 8.2), from Debian bookworm instead: libvirt 9.0 and QEMU 7.2. One base serves both images,
# so containerd stores and unpacks it once.
KUBEVIRT_PACKAGES = (
    "bash", "coreutils", "procps", "psmisc", "findutils", "util-linux", "mount", "iproute2", "nftables", "iptables",
    "tar", "qemu-system-x86", "qemu-utils", "libvirt-daemon", "libvirt-daemon-driver-qemu", "libvirt-clients",
)
BASE_RECIPE = 1   # raise when the recipe below changes what the base holds
TRIM = ("var/lib/apt/lists", "var/cache/apt", "var/cache/debconf", "var/log", "usr/share/doc", "usr/share/man",
        "usr/share/info", "usr/share/locale", "usr/share/lintian", "etc/resolv.conf", "etc/hostname")


def _debootstrap(root: Path, packages: tuple[str, ...], log: Path) -> None:
    if not shutil.which("debootstrap"):
        raise ImageError("building the node's images needs debootstrap (apt-get install debootstrap)")
    with open(log, "w") as out:
        done = subprocess.run(["debootstrap", "--variant=minbase", f"--include={','.join(packages)}", SUITE,
                               str(root), MIRROR], stdout=out, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        raise ImageError(f"debootstrap failed (exit {done.returncode}); the end of {log}:\n{log.read_text()[-1500:]}")
    for relative in TRIM:
        target = root / relative
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
            target.mkdir()
        elif target.exists() or target.is_symlink():
            target.unlink()


def kubevirt_base(say=lambda text: None) -> Path:
    """The layer tarball of Debian's packages under KubeVirt's launcher and handler (cached by the package set)."""
    key = hashlib.sha256("\n".join([SUITE, *sorted(KUBEVIRT_PACKAGES), str(BASE_RECIPE)]).encode()).hexdigest()[:12]

    def make(path: Path) -> None:
        started = time.monotonic()
        root = path.with_name(path.name + ".root")
        shutil.rmtree(root, ignore_errors=True)
        say(f"building KubeVirt's base layer from Debian {SUITE} packages with debootstrap (minutes)")
        _debootstrap(root, KUBEVIRT_PACKAGES, path.with_suffix(".log"))
        layer_from(root, path.with_suffix(".partial"))
        path.with_suffix(".partial").rename(path)
        shutil.rmtree(root, ignore_errors=True)
        say(f"built {path.name} ({path.stat().st_size / 2**20:.0f} MiB) in {time.monotonic() - started:.0f}s")

    return _cached_file("kubevirt-base", key, "layer.tar", make)


def _apt_download(packages: list[str], into: Path) -> list[Path]:
    """Debian packages as .deb files (apt's ordinary client, the machine's sources)."""
    into.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["apt-get", "download", *packages], cwd=into, capture_output=True, text=True)
    if done.returncode != 0:
        raise ImageError(f"apt-get download {' '.join(packages)} failed (run apt-get update first?): "
                         f"{done.stderr.strip()[-1000:]}")
    return sorted(into.glob("*.deb"))


def _kernel_package() -> str:
    """The versioned kernel package Debian's linux-image-cloud-amd64 depends on now."""
    done = subprocess.run(["apt-cache", "depends", "linux-image-cloud-amd64"], capture_output=True, text=True)
    for line in done.stdout.splitlines():
        if "Depends:" in line and "linux-image-" in line:
            return line.split("Depends:", 1)[1].strip()
    raise ImageError("apt-cache knows no linux-image-cloud-amd64 (run apt-get update first)")


GUEST_DIR = Path(__file__).with_name("guest")
# The virtio modules the guest loads (the cloud kernel builds them as modules), in the order rc loads them.
GUEST_MODULES = ("drivers/virtio/virtio_ring.ko", "drivers/virtio/virtio.ko", "drivers/virtio/virtio_pci_legacy_dev.ko",
                 "drivers/virtio/virtio_pci_modern_dev.ko", "drivers/virtio/virtio_pci.ko",
                 "drivers/block/virtio_blk.ko")
GUEST_RECIPE = 1


def guest(say=lambda text: None) -> Image:
    """The guest: Debian's cloud kernel and an initramfs of busybox-static with our boot script (controlplane/guest/),
    as a kernel-boot container image (`/boot/vmlinuz`, `/boot/initramfs`: KubeVirt's
    spec.domain.firmware.kernelBoot.container). It counts its boots on its first disk, powers off when told, and
    otherwise keeps running."""
    kernel = _kernel_package()
    recipe = "".join((GUEST_DIR / name).read_text() for name in ("inittab", "rc"))
    key = hashlib.sha256(f"{kernel}\n{recipe}\n{GUEST_RECIPE}".encode()).hexdigest()[:12]
    name = f"{REGISTRY}/guest:{key}"

    def make(path: Path) -> None:
        started = time.monotonic()
        with tempfile.TemporaryDirectory(prefix="vmevents-guest-") as tmp:
            work = Path(tmp)
            debs = _apt_download([kernel, "busybox-static"], work / "debs")
            for deb in debs:
                subprocess.run(["dpkg-deb", "-x", str(deb), str(work / "x")], check=True)
            x = work / "x"
            vmlinuz = next((x / "boot").glob("vmlinuz-*"))
            modules = next((x / "lib" / "modules").iterdir()) / "kernel"
            initramfs = work / "initramfs"
            for folder in ("bin", "sbin", "etc", "proc", "sys", "dev", "lib/modules", "tmp", "root"):
                (initramfs / folder).mkdir(parents=True, exist_ok=True)
            shutil.copy(x / "bin" / "busybox", initramfs / "bin" / "busybox")
            for applet in ("sh", "mount", "insmod", "dd", "tr", "cat", "echo", "sleep", "poweroff", "printf"):
                (initramfs / "bin" / applet).symlink_to("busybox")
            (initramfs / "sbin" / "init").symlink_to("../bin/busybox")
            (initramfs / "init").symlink_to("bin/busybox")
            for module in GUEST_MODULES:
                shutil.copy(modules / module, initramfs / "lib" / "modules" / Path(module).name)
            shutil.copy(GUEST_DIR / "inittab", initramfs / "etc" / "inittab")
            shutil.copy(GUEST_DIR / "rc", initramfs / "etc" / "rc")
            (initramfs / "etc" / "rc").chmod(0o755)
            (initramfs / "etc" / "profile").write_text("export PATH=/bin:/sbin\n/bin/busybox --install -s /bin\n")
            root = work / "root" / "boot"
            root.mkdir(parents=True)
            shutil.copy(vmlinuz, root / "vmlinuz")
            cpio = subprocess.run(f"cd {initramfs} && find . | cpio -o -H newc --owner 0:0 2>/dev/null | gzip -9",
                                  shell=True, capture_output=True, check=True)
            (root / "initramfs").write_bytes(cpio.stdout)
            layer = layer_from(work / "root", work / "layer.tar")
            write_archive(path, name, [layer], {"Entrypoint": ["/bin/false"]})
        say(f"built the guest image ({kernel}, busybox-static) in {time.monotonic() - started:.0f}s")

    return Image(name, _cached("guest", key, make))


@dataclass(frozen=True)
class KubeVirtImages:
    """KubeVirt's images at one version, as virt-operator names them: <registry>/<component>:<tag>."""
    registry: str
    tag: str
    archives: tuple[Path, ...]

    def name(self, component: str) -> str:
        return f"{self.registry}/{component}:{self.tag}"


# Our stand-in for the split virtqemud that virt-launcher (libvirt_helper.go StartVirtquemud) and node-labeller.sh
# execute: Debian bookworm's libvirt 9.0 builds the monolithic libvirtd only, which loads the same QEMU driver and
# reads the same settings. libvirtd names its socket libvirt-sock; a non-root launcher's virt-launcher connects to
# virtqemud-sock in the same folder ($XDG_RUNTIME_DIR/libvirt, /var/run: cmd/virt-launcher/virt-launcher.go).
VIRTQEMUD = """#!/bin/sh
# vmevents: virtqemud is libvirtd here (Debian bookworm's libvirt 9.0 has no split daemons): docs/control-plane.md.
dir="${XDG_RUNTIME_DIR:-/run}/libvirt"
[ "$(id -u)" = 0 ] && dir=/run/libvirt && mkdir -p /var/log/libvirt   # where a daemonized libvirtd logs by default
mkdir -p "$dir" && ln -sf libvirt-sock "$dir/virtqemud-sock"
exec /usr/sbin/libvirtd "$@"
"""
# virt-launcher starts virtlogd with -f /etc/libvirt/virtlogd.conf (Debian ships it in libvirt-daemon-system, which
# also brings the system daemons' services): the defaults, as upstream's file is all comments.
VIRTLOGD_CONF = "# virtlogd's defaults (libvirt's own virtlogd.conf sets nothing either)\n"
QEMU_USER = ("qemu:x:107:107:qemu user:/home/qemu:/bin/bash\n", "qemu:x:107:\n")   # cmd/virt-launcher/BUILD.bazel
# Debian builds libvirt with `libvirt-qemu` as QEMU's default user and group, and its QEMU driver refuses to start where
# they do not exist, before it reads qemu.conf (whose `user = "qemu"` is what runs QEMU): Debian's
# libvirt-daemon-system creates them; a launcher image needs them named.
DEBIAN_QEMU_USER = ("libvirt-qemu:x:64055:64055:Libvirt Qemu:/var/lib/libvirt:/usr/sbin/nologin\n",
                    "libvirt-qemu:x:64055:\n")
NONROOT_USER = ("nonroot-user:x:1001:1001::/home/nonroot-user:/bin/bash\n", "nonroot-user:x:1001:\n")  # ./BUILD.bazel
KUBEVIRT_RECIPE = 5


def _base_accounts(base_layer: Path) -> tuple[str, str]:
    """/etc/passwd and /etc/group of the base layer (a layer that changes them carries the whole files)."""
    with tarfile.open(base_layer) as tar:
        return tuple(tar.extractfile(f"./etc/{name}").read().decode() for name in ("passwd", "group"))  # type: ignore


def _binary_layer(work: Path, name: str, files: dict[str, Path | str], modes: dict[str, int] | None = None,
                  caps: dict[str, str] | None = None) -> Path:
    """A layer of the given files (path in the image → a file to copy, or text); `caps`: file capabilities (setcap)."""
    root = work / f"{name}-root"
    for target, source in files.items():
        path = root / target.lstrip("/")
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(source, Path):
            shutil.copy(source, path)
        else:
            path.write_text(source)
        path.chmod((modes or {}).get(target, 0o755 if isinstance(source, Path) else 0o644))
    for target, cap in (caps or {}).items():
        subprocess.run(["setcap", cap, str(root / target.lstrip("/"))], check=True)
    if (root / "tmp").is_dir():
        (root / "tmp").chmod(0o1777)   # as every image's /tmp (a non-root component writes its certificates there)
    # Debian's /var/run is an absolute symlink to /run. virt-handler reaches into a launcher's files through
    # /proc/<pid>/root/var/run/kubevirt-private/…, where an absolute symlink resolves against virt-handler's own root,
    # not the launcher's ("Failed finding unix socket for serial console": the console never opened). Upstream's
    # CentOS images have it relative; so does this layer, over the base's.
    (root / "var").mkdir(exist_ok=True)
    (root / "var" / "run").symlink_to("../run")
    if (root / "home" / "qemu").is_dir():
        os.chown(root / "home" / "qemu", 107, 107)   # the launcher's user
    return layer_from(root, work / f"{name}.tar")


def kubevirt(say=lambda text: None) -> KubeVirtImages:
    """virt-operator, virt-api, virt-controller, virt-handler and virt-launcher at the real node's KubeVirt version,
    from the binaries built here (controlplane/build.py) and Debian's packages, laid out as KubeVirt's BUILD.bazel
    files lay out upstream's images (cmd/<name>/BUILD.bazel)."""
    node = cgo = build.ensure(build.KUBEVIRT_NODE, say)
    controller = build.ensure(build.KUBEVIRT[build.KUBEVIRT_NODE_VERSION], say)
    base = kubevirt_base(say)
    tag = build.KUBEVIRT_NODE_VERSION
    stamp = hashlib.sha256()
    for path in (*sorted(node.iterdir()), controller / "virt-controller", base):
        stat = path.stat()
        stamp.update(f"{path.name} {stat.st_size} {stat.st_mtime_ns}\n".encode())
    stamp.update(f"{VIRTQEMUD}{VIRTLOGD_CONF}{KUBEVIRT_RECIPE}".encode())
    key = stamp.hexdigest()[:12]
    images = KubeVirtImages(REGISTRY, tag, tuple(cache_dir() / f"{c}-{key}.oci.tar" for c in (
        "virt-operator", "virt-api", "virt-controller", "virt-handler", "virt-launcher")))
    if all(a.is_file() for a in images.archives):
        return images
    if not shutil.which("setcap"):
        raise ImageError("building KubeVirt's launcher image needs setcap (apt-get install libcap2-bin)")
    source = module_source(build.KUBEVIRT_NODE)
    started = time.monotonic()
    with open(cache_dir() / f".kubevirt-{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if all(a.is_file() for a in images.archives):
            return images
        with tempfile.TemporaryDirectory(prefix="vmevents-kubevirt-") as tmp:
            work = Path(tmp)
            container_disk = work / "container-disk"
            done = subprocess.run(["gcc", "-static", "-O2", "-o", str(container_disk),
                                   str(source / "cmd/container-disk-v2alpha/main.c")], capture_output=True, text=True)
            if done.returncode != 0:
                raise ImageError(f"compiling KubeVirt's container-disk failed: {done.stderr[-1500:]}")
            passwd, group = _base_accounts(base)
            accounts = {"/etc/passwd": passwd + QEMU_USER[0] + DEBIAN_QEMU_USER[0],
                        "/etc/group": group + QEMU_USER[1] + DEBIAN_QEMU_USER[1],
                        "/etc/nsswitch.conf": (source / "cmd/virt-launcher/nsswitch.conf").read_text()}
            # virt-operator, virt-api and virt-controller: upstream's are distroless (a passwd with nonroot-user 1001
            # and the binary). virt-controller is built without cgo (controlplane/build.py) and is alone in its image;
            # virt-operator and virt-api are built with cgo, beside virt-handler, so they sit on the base layer, for its
            # C library (containerd keeps that layer once).
            for component, binary, archive in (("virt-operator", node / "virt-operator", images.archives[0]),
                                               ("virt-api", node / "virt-api", images.archives[1]),
                                               ("virt-controller", controller / "virt-controller", images.archives[2])):
                static = component == "virt-controller"
                layer = _binary_layer(work, component, {
                    "/etc/passwd": ("root:x:0:0:root:/root:/sbin/nologin\n" if static else passwd) + NONROOT_USER[0],
                    "/etc/group": ("root:x:0:\n" if static else group) + NONROOT_USER[1],
                    f"/usr/bin/{component}": binary, "/tmp/.keep": ""})
                write_archive(archive, images.name(component), [layer] if static else [base, layer],
                              {"Entrypoint": [f"/usr/bin/{component}"], "User": "1001"})
            handler = _binary_layer(work, "virt-handler", {
                **accounts, "/usr/bin/virt-handler": cgo / "virt-handler", "/usr/bin/virt-chroot": node / "virt-chroot",
                "/usr/bin/container-disk": container_disk})
            write_archive(images.archives[3], images.name("virt-handler"), [base, handler],
                          {"Entrypoint": ["/usr/bin/virt-handler"]})
            launcher = _binary_layer(work, "virt-launcher", {
                **accounts, "/usr/bin/virt-launcher": cgo / "virt-launcher",
                "/usr/bin/virt-launcher-monitor": node / "virt-launcher-monitor",
                "/usr/bin/container-disk": container_disk, "/usr/bin/virt-freezer": node / "virt-freezer",
                "/usr/bin/virt-probe": node / "virt-probe", "/usr/bin/virt-tail": node / "virt-tail",
                "/usr/bin/node-labeller.sh": source / "cmd/virt-launcher/node-labeller/node-labeller.sh",
                "/usr/sbin/virtqemud": VIRTQEMUD,
                "/etc/libvirt/qemu.conf": (source / "cmd/virt-launcher/qemu.conf").read_text(),
                "/etc/libvirt/virtqemud.conf": (source / "cmd/virt-launcher/virtqemud.conf").read_text(),
                "/etc/libvirt/virtlogd.conf": VIRTLOGD_CONF, "/usr/lib64/qemu-kvm/.keep": "",
                "/home/qemu/.keep": ""},
                modes={"/usr/sbin/virtqemud": 0o755},
                # cmd/virt-launcher/BUILD.bazel: cap_net_bind_service on virt-launcher-monitor, so that a non-root
                # launcher can hand it to virtqemud (rpm/BUILD.bazel also gives QEMU one, for passt: not used here).
                caps={"/usr/bin/virt-launcher-monitor": "cap_net_bind_service=+ep"})
            write_archive(images.archives[4], images.name("virt-launcher"), [base, launcher],
                          {"Entrypoint": ["/usr/bin/virt-launcher"]})
    say(f"built KubeVirt {tag}'s five images in {time.monotonic() - started:.0f}s")
    return images
