"""Builds the sandbox image offline (``sandpit image build``).

Image tags are content hashes, so rebuilding unchanged inputs is a no-op:

* base: ``sandpit-base:<sha256 of base.json + suite>``. First ``docker pull`` of
  ``ImageSettings.pull_base`` is tried; when no registry answers (the normal case here) a
  minimal Debian root filesystem with python3 is made with ``debootstrap``, trimmed by
  ``base.json``'s ``remove_paths``, cached as a tarball in ``ImageSettings.cache_dir`` and
  ``docker import``-ed.
* builder: ``sandpit-builder:<sha256 of the recipe with base.json's builder_include>``,
  always debootstrapped (the same suite's python3 plus a C compiler and python3-dev),
  cached like the base. Only the Dockerfile's first stage runs in it: it compiles
  ``native/`` (the delta scan's write barrier) for that interpreter.
* sandbox: ``sandpit-sandbox:<sha256 of base and builder tags + Dockerfile + runner and
  native files>``, built with the Dockerfile in ``sandbox_images/`` (adds the runner and
  the compiled module, runs as uid 10001).
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker
import docker.errors
from sandpit.sandbox_images import DEFINITION_DIR, NATIVE_FILES, RUNNER_FILES

from ..errors import ImageError
from ..settings import ImageSettings
from .engine import map_docker_errors

log = logging.getLogger(__name__)
Progress = Callable[[str], None]


@dataclass(frozen=True)
class BuiltImage:
    """Result of :func:`build_image`: references and whether anything was built."""

    tag: str
    base_tag: str
    built: bool
    base_source: str  # "cached", "pulled" or "debootstrap"


def _sha(parts: list[bytes]) -> str:
    digest = hashlib.sha256()
    for part in parts:
        digest.update(len(part).to_bytes(8, "big"))
        digest.update(part)
    return digest.hexdigest()[:16]


def base_recipe(settings: ImageSettings) -> dict[str, Any]:
    recipe: dict[str, Any] = json.loads((DEFINITION_DIR / "base.json").read_text())
    recipe["suite"] = settings.debian_suite
    return recipe


def builder_recipe(settings: ImageSettings) -> dict[str, Any]:
    """The builder root's recipe: the base's, with ``builder_include`` added to ``include``."""
    recipe = base_recipe(settings)
    recipe["include"] = [*recipe["include"], *recipe.pop("builder_include", [])]
    return recipe


def _recipe_sha(recipe: dict[str, Any]) -> str:
    recipe = {k: v for k, v in recipe.items() if k not in ("comment", "builder_include")}
    return _sha([json.dumps(recipe, sort_keys=True).encode()])


def base_tag(settings: ImageSettings) -> str:
    """``sandpit-base:<hash>`` of the debootstrap recipe (suite, variant, packages, trims)."""
    return "sandpit-base:" + _recipe_sha(base_recipe(settings))


def builder_tag(settings: ImageSettings) -> str:
    """``sandpit-builder:<hash>`` of :func:`builder_recipe`."""
    return "sandpit-builder:" + _recipe_sha(builder_recipe(settings))


def sandbox_tag(settings: ImageSettings, base: str | None = None) -> str:
    """``<repository>:<hash>`` of the base and builder tags, the Dockerfile, the runner
    sources and the native sources."""
    parts = [(base or base_tag(settings)).encode(), builder_tag(settings).encode(),
             (DEFINITION_DIR / "Dockerfile").read_bytes()]
    parts += [(DEFINITION_DIR / "runner" / name).read_bytes() for name in RUNNER_FILES]
    parts += [(DEFINITION_DIR / "native" / name).read_bytes() for name in NATIVE_FILES]
    return f"{settings.repository}:{_sha(parts)}"


def _exists(client: docker.DockerClient, ref: str) -> bool:
    try:
        client.images.get(ref)
        return True
    except docker.errors.ImageNotFound:
        return False


def _try_pull(client: docker.DockerClient, settings: ImageSettings, tag: str, say: Progress) -> bool:
    if not settings.pull_base:
        return False
    say(f"trying to pull {settings.pull_base}")
    try:
        image = client.images.pull(settings.pull_base)
    except docker.errors.DockerException as exc:
        say(f"pull failed ({str(exc).splitlines()[0][:160]}); falling back to debootstrap")
        return False
    image.tag(*tag.split(":", 1))
    return True


def _debootstrap(settings: ImageSettings, tag: str, recipe: dict[str, Any], say: Progress) -> Path:
    """Make (or reuse) the cached rootfs tarball of ``recipe`` for ``tag``; returns its path."""
    cache = settings.cache_dir / "base"
    cache.mkdir(parents=True, exist_ok=True)
    tarball = cache / f"{tag.split(':', 1)[1]}.tar"
    if tarball.exists():
        say(f"using cached root filesystem {tarball}")
        return tarball
    if shutil.which("debootstrap") is None:
        raise ImageError("no base image can be pulled and `debootstrap` is not installed "
                         "(apt-get install debootstrap, as root)")
    with tempfile.TemporaryDirectory(prefix="sandpit-rootfs-", dir=cache) as tmp:
        rootfs = Path(tmp) / "rootfs"
        cmd = ["debootstrap", f"--variant={recipe['variant']}", f"--include={','.join(recipe['include'])}",
               settings.debian_suite, str(rootfs), settings.debian_mirror]
        say("bootstrapping a Debian root filesystem (about a minute): " + " ".join(cmd))
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise ImageError(f"debootstrap failed ({proc.returncode}): {proc.stderr[-2000:] or proc.stdout[-2000:]}")
        for rel in recipe["remove_paths"]:
            target = rootfs / rel
            if target.is_dir() and not target.is_symlink():
                shutil.rmtree(target)
                target.mkdir()
            elif target.exists():
                target.unlink()
        partial = tarball.with_suffix(".partial")
        with tarfile.open(partial, "w") as archive:
            archive.add(rootfs, arcname=".")
        partial.rename(tarball)
    return tarball


def _import(client: docker.DockerClient, tarball: Path, tag: str, say: Progress) -> None:
    say(f"importing {tarball.name} as {tag}")
    repo, name = tag.split(":", 1)
    client.api.import_image_from_file(str(tarball), repository=repo, tag=name)


def build_image(client: docker.DockerClient, settings: ImageSettings, *, force: bool = False,
                progress: Progress | None = None) -> BuiltImage:
    """Ensure the sandbox image exists; build what is missing. Returns its tag.

    Raises:
        ImageError: debootstrap or the Docker build failed (message carries the output).
        DockerUnavailable: the engine is unreachable.
    """
    say = progress or (lambda msg: log.info("%s", msg))
    with map_docker_errors("building the sandbox image"):
        base = base_tag(settings)
        builder = builder_tag(settings)
        final = sandbox_tag(settings, base)
        if not force and _exists(client, final):
            say(f"{final} is up to date")
            return BuiltImage(final, base, built=False, base_source="cached")
        source = "cached"
        if force or not _exists(client, base):
            if _try_pull(client, settings, base, say):
                source = "pulled"
            else:
                _import(client, _debootstrap(settings, base, base_recipe(settings), say), base, say)
                source = "debootstrap"
        if force or not _exists(client, builder):
            _import(client, _debootstrap(settings, builder, builder_recipe(settings), say), builder, say)
        with tempfile.TemporaryDirectory(prefix="sandpit-image-") as ctx:
            shutil.copy(DEFINITION_DIR / "Dockerfile", ctx)
            for folder, names in (("runner", RUNNER_FILES), ("native", NATIVE_FILES)):
                (Path(ctx) / folder).mkdir()
                for name in names:
                    shutil.copy(DEFINITION_DIR / folder / name, Path(ctx) / folder / name)
            say(f"building {final} on {base} (native modules compiled in {builder})")
            try:
                client.images.build(path=ctx, tag=final, buildargs={"BASE": base, "BUILDER": builder}, rm=True,
                                    forcerm=True, pull=False, labels={"sandpit.image": "1"})
            except docker.errors.BuildError as exc:
                lines = "".join(str(chunk.get("stream", chunk.get("error", ""))) for chunk in exc.build_log)
                raise ImageError(f"docker build failed: {exc.msg}\n{lines[-2000:]}") from exc
    return BuiltImage(final, base, built=True, base_source=source)


def resolve_image(client: docker.DockerClient, configured: str | None, settings: ImageSettings) -> str:
    """The image sandboxes use: ``configured`` if set, else the content-hash tag.

    Raises:
        ImageError: the image does not exist locally (tells the user to build it).
    """
    ref = configured or sandbox_tag(settings)
    with map_docker_errors("looking up the sandbox image"):
        if not _exists(client, ref):
            raise ImageError(f"sandbox image {ref} not found; run `sandpit image build`")
    return ref
