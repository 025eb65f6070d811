"""The node image of the Docker backend: found by its sources' digest, or built from them offline.

In: a docker SDK client, and this source checkout (the repository holding `docker/`). Out: the
tag of the node image built from exactly these sources, `faultline-node:<digest>` (also tagged
`faultline-node:latest`, the name docker/docker-compose.yml uses), built when absent:

1. the offline base `faultline-base:bookworm`, by `docker/build-base` (mmdebstrap + `docker
   import`), when the daemon does not have it;
2. faultline's wheel and the wheels of the node's own dependencies (`NODE_DEPENDENCIES`, at the
   versions the harness runs), built by pip on this machine;
3. `docker/Dockerfile` on that base, with nothing downloaded during the build.

Older node images are removed once a new one is built (each is a full copy of the base on the
vfs storage driver). Failures raise `ImageError`, whose text says what failed, why and the fix.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parents[1]
DOCKER_DIR = REPO / "docker"
BASE_IMAGE = "faultline-base:bookworm"
NODE_REPOSITORY = "faultline-node"
IMAGE_LABEL = "org.faultline.image"
#: What a node runs needs only these of faultline's dependencies (the broker's protocol types,
#: CRC32C and ZooKeeper client; the power-loss file system's FUSE bindings).
NODE_DEPENDENCIES = ("kio", "crc32c", "kazoo", "mfusepy")


class ImageError(RuntimeError):
    """The node image could not be built; the text says what failed, why and the fix."""


def source_digest() -> str:
    """A digest of everything the node image is built from: the parts' sources, pyproject.toml
    and the files in docker/ the build reads."""
    pyproject = REPO / "pyproject.toml"
    folders = _package_folders()
    files = [pyproject, DOCKER_DIR / "Dockerfile", DOCKER_DIR / "packages", DOCKER_DIR / "build-base"]
    for folder in sorted(folders):
        files += sorted((REPO / folder).rglob("*.py"))
    digest = hashlib.sha256()
    for path in files:
        digest.update(str(path.relative_to(REPO)).encode() + b"\0")
        digest.update(path.read_bytes() if path.exists() else b"")
    for name in NODE_DEPENDENCIES:
        digest.update(f"{name}=={_version(name)}\0".encode())
    return digest.hexdigest()[:12]


def _package_folders() -> list[str]:
    """The folders pyproject.toml maps to faultline's packages."""
    config = tomllib.loads((REPO / "pyproject.toml").read_text())
    return sorted(set(config["tool"]["setuptools"]["package-dir"].values()))


def _version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        raise ImageError(f"{name}, which the node image needs, is not installed in this Python "
                         f"({sys.executable}); run scripts/setup") from None


def image_tag() -> str:
    return f"{NODE_REPOSITORY}:{source_digest()}"


def _exists(client, name: str) -> bool:
    import docker.errors

    try:
        client.images.get(name)
        return True
    except docker.errors.ImageNotFound:
        return False


def ensure_image(client, say: Callable[[str], None] = print) -> str:
    """The node image's tag, building it (and the base) first when the daemon does not have it."""
    tag = image_tag()
    if _exists(client, tag):
        return tag
    if not (DOCKER_DIR / "Dockerfile").exists():
        raise ImageError(f"the Docker backend builds its node image from a source checkout of faultline, and "
                         f"{DOCKER_DIR / 'Dockerfile'} is not there (faultline is installed from a wheel?); "
                         f"run faultline from a clone of its repository, with scripts/setup")
    if not _exists(client, BASE_IMAGE):
        say(f"building the offline base image {BASE_IMAGE} (docker/build-base; about a minute)")
        _build_base()
    say(f"building the node image {tag} from this checkout (docker/Dockerfile)")
    with tempfile.TemporaryDirectory(prefix="faultline-image-") as context:
        _prepare_context(Path(context))
        _docker_build(client, Path(context), tag)
    client.images.get(tag).tag(NODE_REPOSITORY, "latest")
    _remove_older(client, tag)
    return tag


def _build_base() -> None:
    proc = subprocess.run(["bash", str(DOCKER_DIR / "build-base"), BASE_IMAGE], capture_output=True, text=True)
    if proc.returncode != 0:
        output = (proc.stdout + proc.stderr).strip()[-2000:]
        raise ImageError(f"building the offline base image {BASE_IMAGE} failed (docker/build-base exited "
                         f"{proc.returncode}). It needs mmdebstrap and Debian's package mirror; run "
                         f"scripts/setup --docker, then try again. Its output ends:\n{output}")


def _pip(*args: str) -> None:
    cmd = [sys.executable, "-m", "pip", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise ImageError(f"building the node image's wheels failed: `{' '.join(cmd)}` exited {proc.returncode}. "
                         f"pip needs the package index (or its cache) for setuptools and the node's "
                         f"dependencies. Its output ends:\n{(proc.stdout + proc.stderr).strip()[-2000:]}")


def _prepare_context(context: Path) -> None:
    shutil.copy2(DOCKER_DIR / "Dockerfile", context / "Dockerfile")
    shutil.copy2(DOCKER_DIR / "packages", context / "packages")
    wheels = context / "wheels"
    wheels.mkdir()
    pins = [f"{name}=={_version(name)}" for name in NODE_DEPENDENCIES]
    (wheels / "requirements.txt").write_text("\n".join(pins) + "\n")
    # From a copy of the sources: an in-tree build would leave build/ in the checkout.
    source = context / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, source / name)
    for folder in _package_folders():
        shutil.copytree(REPO / folder, source / folder, ignore=shutil.ignore_patterns("__pycache__"))
    _pip("wheel", "-q", "--no-deps", "-w", str(wheels), str(source))
    shutil.rmtree(source)
    _pip("wheel", "-q", "-w", str(wheels), *pins)


def _docker_build(client, context: Path, tag: str) -> None:
    import docker.errors

    try:
        client.images.build(path=str(context), tag=tag, buildargs={"BASE": BASE_IMAGE}, rm=True, forcerm=True,
                            labels={IMAGE_LABEL: "node"})
    except docker.errors.BuildError as exc:
        lines = [str(chunk.get("stream") or chunk.get("error") or "").rstrip() for chunk in exc.build_log]
        tail = "\n".join(line for line in lines if line)[-2000:]
        raise ImageError(f"docker/Dockerfile did not build on {BASE_IMAGE}: {exc.msg}. If the base image is "
                         f"damaged, remove it (`docker rmi {BASE_IMAGE}`) and run again to rebuild it. "
                         f"The build's output ends:\n{tail}") from None
    except docker.errors.APIError as exc:
        raise ImageError(f"the Docker daemon refused to build the node image: {exc}") from None


def _remove_older(client, keep: str) -> None:
    import docker.errors

    for image in client.images.list(filters={"label": f"{IMAGE_LABEL}=node"}):
        if keep in image.tags:
            continue
        try:
            client.images.remove(image.id, force=False)
        except docker.errors.APIError:
            pass  # a container still uses it: kept, and removed by a later build

