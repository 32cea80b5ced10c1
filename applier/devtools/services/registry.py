"""A Confluent-compatible schema registry on 127.0.0.1 for the Avro tests, demo and benchmark.

Confluent's own registry is not on Maven Central; Apicurio Registry is. This runs Apicurio Registry
:data:`APICURIO_VERSION` (``io.apicurio:apicurio-registry-app``, the ``all`` ``tar.gz`` assembly: a Quarkus
runner jar plus ``lib/``) with its default in-memory storage (an H2 database in memory: every restart
starts empty). Its Confluent-compatible API lives under ``/apis/ccompat/v7``, which is what
:attr:`applier.devtools.services.Urls.registry_url` points at.

Why 3.0.9: the 3.3.x releases are compiled for Java 21 (``maven.compiler.release`` 21) and this project's
machines run Java 17; 3.0.9 is the newest 3.x release whose classes run on 17.

Fetching: first ``maven-dependency-plugin`` 3.8.1 ``dependency:copy`` of
``io.apicurio:apicurio-registry-app:3.0.9:tar.gz:all``. On registries where the artifact's parent POM
(``io.apicurio:apicurio-registry:3.0.9``) is missing - the case on this project's Maven registry - Maven
cannot read the artifact descriptor and refuses; the fallback then downloads the very same file with Maven's
``wagon-maven-plugin`` (``download-single``, which needs no POM) from Maven Central
(``$APPLIER_MAVEN_REPOSITORY`` overrides the repository URL) and checks it against the published ``.sha1``.
The archive is unpacked (``tarfile`` with the ``data`` filter) into ``$APPLIER_HOME/jars/apicurio-registry-
<version>/`` once; a marker file makes later calls free.

Process: ``java -Xmx512m -Dquarkus.http.host=127.0.0.1 -Dquarkus.http.port=<port> -jar <runner jar>``,
detached, cwd ``$APPLIER_HOME/registry``, stdout/stderr in ``logs/registry.out``, pid in
``run/registry.pid``. Port 18081, or ``$APPLIER_REGISTRY_PORT``. Ready when
``GET /apis/ccompat/v7/subjects`` answers with a JSON list. Started only on request
(``start({"registry"})`` / ``--only registry``), never by a bare ``start()``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tarfile
import time
import urllib.request
from pathlib import Path

from applier.devtools.services.common import (
    HOST,
    JAVA_PACKAGE,
    MAVEN_PACKAGE,
    ServicesError,
    ServiceStatus,
    await_ready,
    ensure_command,
    home_dir,
    log_path,
    managed_pid,
    managed_status,
    port,
    port_open,
    spawn,
    stop_managed,
    wait_until,
)
from applier.jars import MAVEN_DEPENDENCY_PLUGIN, jars_home, locked, tail

NAME = "registry"
APICURIO_GROUP = "io.apicurio"
APICURIO_ARTIFACT = "apicurio-registry-app"
APICURIO_VERSION = "3.0.9"
APICURIO_TYPE = "tar.gz"
APICURIO_CLASSIFIER = "all"
WAGON_PLUGIN = "org.codehaus.mojo:wagon-maven-plugin:2.0.2"
MAVEN_CENTRAL = "https://repo.maven.apache.org/maven2"
CCOMPAT_PATH = "/apis/ccompat/v7"
READY_TIMEOUT = 90.0
STOP_TIMEOUT = 30.0
HEAP = "512m"
MARKER = ".complete.json"


def registry_url(p: int | None = None, host: str = HOST) -> str:
    """The Confluent-compatible API base of the local registry."""
    return f"http://{host}:{p or port(NAME)}{CCOMPAT_PATH}"


def coordinates() -> str:
    return f"{APICURIO_GROUP}:{APICURIO_ARTIFACT}:{APICURIO_VERSION}:{APICURIO_TYPE}:{APICURIO_CLASSIFIER}"


def artifact_path() -> str:
    """The artifact's path in a Maven repository layout."""
    g = APICURIO_GROUP.replace(".", "/")
    name = f"{APICURIO_ARTIFACT}-{APICURIO_VERSION}-{APICURIO_CLASSIFIER}.{APICURIO_TYPE}"
    return f"{g}/{APICURIO_ARTIFACT}/{APICURIO_VERSION}/{name}"


def install_dir() -> Path:
    return jars_home() / f"apicurio-registry-{APICURIO_VERSION}"


def mvn_copy_command(out: Path) -> list[str]:
    return [
        "mvn", "-q", "-B", "-Dstyle.color=never",
        f"{MAVEN_DEPENDENCY_PLUGIN}:copy",
        f"-Dartifact={coordinates()}",
        f"-DoutputDirectory={out}",
    ]


def mvn_wagon_command(repository: str, remote_path: str, target: Path) -> list[str]:
    return [
        "mvn", "-q", "-B", "-Dstyle.color=never",
        f"{WAGON_PLUGIN}:download-single",
        f"-Dwagon.url={repository}",
        f"-Dwagon.fromFile={remote_path}",
        f"-Dwagon.toFile={target}",
    ]


def _run_mvn(argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    ensure_command("mvn", MAVEN_PACKAGE, "Maven fetches Apicurio Registry from Maven Central")
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, stdin=subprocess.DEVNULL)


def _download(tmp: Path) -> tuple[Path, str]:
    """The archive in ``tmp`` and how it was fetched."""
    work = tmp / "mvn"
    work.mkdir(parents=True)
    r = _run_mvn(mvn_copy_command(tmp), work)
    archive = tmp / Path(artifact_path()).name
    if r.returncode == 0 and archive.is_file():
        return archive, f"maven-dependency-plugin copy {coordinates()}"
    first = tail(r.stdout + r.stderr)
    repo = os.environ.get("APPLIER_MAVEN_REPOSITORY", MAVEN_CENTRAL).rstrip("/")
    r2 = _run_mvn(mvn_wagon_command(repo, artifact_path(), archive), work)
    r3 = _run_mvn(mvn_wagon_command(repo, artifact_path() + ".sha1", tmp / "archive.sha1"), work)
    if r2.returncode != 0 or r3.returncode != 0 or not archive.is_file():
        raise ServicesError(
            f"Maven could not fetch Apicurio Registry ({coordinates()}).\n"
            f"[dependency:copy]\n{first}\n[wagon download-single from {repo}]\n"
            f"{tail(r2.stdout + r2.stderr + r3.stdout + r3.stderr)}\n"
            "Maven Central must be reachable (set APPLIER_MAVEN_REPOSITORY for a mirror)."
        )
    expected = (tmp / "archive.sha1").read_text().split()[0].strip().lower()
    h = hashlib.sha1()
    with open(archive, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    if h.hexdigest() != expected:
        raise ServicesError(
            f"{archive.name}: SHA-1 {h.hexdigest()} does not match the published {expected}; not using it"
        )
    if "Failed to read artifact descriptor" in first:
        why = "dependency:copy could not read the artifact descriptor (its parent POM is missing from the registry)"
    else:
        why = "dependency:copy failed: " + (first.splitlines()[-1] if first else "no output")
    how = f"wagon-maven-plugin download-single of {artifact_path()} from {repo}, SHA-1 checked ({why})"
    return archive, how


def _find_jar(root: Path) -> Path | None:
    for pattern in ("*-runner.jar", "quarkus-app/quarkus-run.jar", "*/quarkus-app/quarkus-run.jar",
                    "*/*-runner.jar"):
        found = sorted(root.glob(pattern))
        if found:
            return found[0]
    return None


def _read_marker(folder: Path) -> Path | None:
    try:
        data = json.loads((folder / MARKER).read_text())
        jar = folder / data["jar"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return jar if jar.is_file() else None


def resolve() -> Path:
    """The Apicurio Registry runner jar, fetched with Maven and unpacked once (then cached)."""
    folder = install_dir()
    jar = _read_marker(folder)
    if jar:
        return jar
    with locked(folder.parent / f".{folder.name}.lock"):
        jar = _read_marker(folder)
        if jar:
            return jar
        tmp = folder.parent / f".{folder.name}.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        try:
            t0 = time.monotonic()
            archive, how = _download(tmp / "dl")
            unpacked = tmp / "app"
            with tarfile.open(archive, "r:gz") as tf:
                tf.extractall(unpacked, filter="data")
            found = _find_jar(unpacked)
            if found is None:
                raise ServicesError(f"{archive.name} holds no Quarkus runner jar")
            shutil.rmtree(tmp / "dl")
            rel = found.relative_to(tmp)
            (tmp / MARKER).write_text(json.dumps({
                "artifact": coordinates(), "jar": str(rel), "fetched": how,
                "seconds": round(time.monotonic() - t0, 1), "at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            }, indent=2) + "\n")
            shutil.rmtree(folder, ignore_errors=True)
            os.replace(tmp, folder)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        jar = _read_marker(folder)
        if jar is None:  # pragma: no cover - the marker was just written
            raise ServicesError(f"Apicurio Registry unpacked into {folder} but its marker is unreadable")
        return jar


def _java() -> str:
    return ensure_command("java", JAVA_PACKAGE, "Apicurio Registry needs Java 17+")


def command(jar: Path, p: int, host: str = HOST) -> list[str]:
    """The registry's command line (pure: unit-tested)."""
    return [
        _java(),
        f"-Xmx{HEAP}",
        "-XX:+UseSerialGC",
        "-Djava.awt.headless=true",
        f"-Dquarkus.http.host={host}",
        f"-Dquarkus.http.port={p}",
        "-Dquarkus.log.console.color=false",
        "-jar",
        str(jar),
    ]


def ready(url: str, timeout: float = 2.0) -> bool:
    """True once ``GET <url>/subjects`` answers with a JSON list."""
    req = urllib.request.Request(url + "/subjects", headers={"Accept": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return resp.status == 200 and isinstance(json.loads(resp.read() or b"null"), list)


def _marker() -> str:
    return str(install_dir())


def start() -> None:
    p = port(NAME)
    url = registry_url(p)
    pid = managed_pid(NAME, _marker())
    if pid is None and port_open(p):
        wait_until(f"schema registry at {url} (external)", lambda: ready(url), timeout=15)
        return
    if pid is None:
        jar = resolve()
        pid = spawn(NAME, command(jar, p), "registry.out", cwd=home_dir("registry"))
    await_ready(NAME, _marker(), pid, f"schema registry at {url}", lambda: port_open(p) and ready(url), timeout=READY_TIMEOUT,
                logs=[log_path("registry.out")])


def stop() -> None:
    stop_managed(NAME, _marker(), STOP_TIMEOUT)


def status() -> ServiceStatus:
    return managed_status(NAME, _marker(), port(NAME), f"in-memory storage; logs: {log_path('registry.out')}")


__all__ = ["start", "stop", "status", "resolve", "command", "ready", "registry_url", "APICURIO_VERSION"]
