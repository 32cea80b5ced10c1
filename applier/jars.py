"""The Java jars the pipeline needs, resolved with Maven into ``$APPLIER_HOME/jars`` (the product's own lookup).

Why here and not in the local-services tooling: a deployed ``applier run`` needs Spark's Kafka source on its
classpath and must not load the tooling to find it. The tooling (``applier.devtools.services``) resolves the
Kafka broker's jars with the same :func:`resolve`.

Two sets, each resolved once and then cached (a marker file lists the jars of a complete resolution,
so a second call does no Maven run at all):

* ``spark-kafka-<spark version>``: Spark's Kafka source (``spark-sql-kafka-0-10_2.13``) and its
  runtime dependencies, minus every artifact pyspark already ships in its own ``jars`` folder (Spark
  must not see two copies of a class, e.g. two lz4-java versions).  What is left is normally
  spark-sql-kafka, spark-token-provider-kafka, kafka-clients and commons-pool2.  Pass the list to
  ``spark.jars`` before the first SparkSession starts.
* ``kafka-<kafka version>``: the Kafka broker (``org.apache.kafka:kafka_2.13``) plus the log4j2
  slf4j binding it needs to log anything at all (Kafka 4.x logs through slf4j 1.7 to log4j2; the
  broker artifact brings log4j-api/log4j-core but no binding).

Maven runs ``maven-dependency-plugin`` 3.8.1 explicitly (Maven 3.8's default binding is ancient) with
``-Dmdep.useRepositoryLayout=true``, so the group/artifact/version of every file is known exactly and
the comparison with pyspark's jars is done on artifact ids, not on guesses from file names.

Registry quirk handled here: the Maven registry reachable from this project's machines lacks
``org.apache.spark:spark-token-provider-kafka-0-10_2.13`` for every version after 4.0.0 (the
spark-sql-kafka artifact itself is there).  When resolving the exact version fails on that artifact,
the resolution is retried with the token provider pinned to :data:`TOKEN_PROVIDER_FALLBACK` (4.0.0).
Checked at the bytecode level against Spark 4.2.0: every method spark-sql-kafka 4.2.0 calls in the
token provider exists in 4.0.0; the only broken links of 4.0.0 against 4.2.0 are two log keys
(``LogKeys.CLUSTER_ID``/``SERVICE_NAME``, which became a Java enum in 4.1) inside
``KafkaDelegationTokenProvider.obtainDelegationTokens``, i.e. only Kerberos delegation-token setups
could hit them; plain, SSL and SASL/PLAIN connections do not.
"""

from __future__ import annotations

import fcntl
import importlib.metadata
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


MAVEN_DEPENDENCY_PLUGIN = "org.apache.maven.plugins:maven-dependency-plugin:3.8.1"
SCALA_SUFFIX = "2.13"
DEFAULT_SPARK_VERSION = "4.2.0"
TOKEN_PROVIDER_ARTIFACT = f"spark-token-provider-kafka-0-10_{SCALA_SUFFIX}"
TOKEN_PROVIDER_FALLBACK = "4.0.0"
MARKER = ".complete.json"


class JarsError(RuntimeError):
    """The jars could not be resolved; the message says why and what to do."""


def applier_home() -> Path:
    """``$APPLIER_HOME`` (default ``~/.cache/applier``): the jar cache, and the local services' state."""
    raw = os.environ.get("APPLIER_HOME") or "~/.cache/applier"
    return Path(raw).expanduser().absolute()


def jars_home() -> Path:
    return applier_home() / "jars"


def spark_version() -> str:
    """The installed pyspark's version (the Kafka source must match it exactly)."""
    env = os.environ.get("APPLIER_SPARK_VERSION")
    if env:
        return env
    try:
        return importlib.metadata.version("pyspark")
    except importlib.metadata.PackageNotFoundError:
        return DEFAULT_SPARK_VERSION


def pyspark_jars_dir() -> Path | None:
    """pyspark's own jars folder, found without importing pyspark."""
    spark_home = os.environ.get("SPARK_HOME")
    if spark_home and (Path(spark_home) / "jars").is_dir():
        return Path(spark_home) / "jars"
    spec = importlib.util.find_spec("pyspark")
    if spec is None or not spec.submodule_search_locations:
        return None
    for loc in spec.submodule_search_locations:
        cand = Path(loc) / "jars"
        if cand.is_dir():
            return cand
    return None


# ---------------------------------------------------------------------------------------------
# pom generation (pure, unit-tested)


def _dep_xml(group: str, artifact: str, version: str, indent: str = "    ") -> str:
    return (
        f"{indent}<dependency><groupId>{group}</groupId><artifactId>{artifact}</artifactId>"
        f"<version>{version}</version></dependency>"
    )


def render_pom(
    name: str,
    dependencies: list[tuple[str, str, str]],
    managed: list[tuple[str, str, str]] | None = None,
) -> str:
    """A minimal ``pom``-packaged project whose only purpose is to list ``dependencies``.

    ``managed`` entries go into ``<dependencyManagement>`` and pin transitive versions.
    """
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
        raise ValueError(f"bad artifact name {name!r}")
    lines = [
        '<?xml version="1.0" encoding="UTF-8"?>',
        '<project xmlns="http://maven.apache.org/POM/4.0.0"',
        '         xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance"',
        '         xsi:schemaLocation="http://maven.apache.org/POM/4.0.0 '
        'http://maven.apache.org/xsd/maven-4.0.0.xsd">',
        "  <modelVersion>4.0.0</modelVersion>",
        "  <groupId>applier.devtools.services</groupId>",
        f"  <artifactId>{name}</artifactId>",
        "  <version>1</version>",
        "  <packaging>pom</packaging>",
    ]
    if managed:
        lines.append("  <dependencyManagement>")
        lines.append("    <dependencies>")
        lines += [_dep_xml(g, a, v, "      ") for g, a, v in managed]
        lines.append("    </dependencies>")
        lines.append("  </dependencyManagement>")
    lines.append("  <dependencies>")
    lines += [_dep_xml(g, a, v) for g, a, v in dependencies]
    lines.append("  </dependencies>")
    lines.append("</project>")
    return "\n".join(lines) + "\n"


def mvn_command(output_dir: Path) -> list[str]:
    return [
        "mvn",
        "-q",
        "-B",
        "-Dstyle.color=never",
        f"{MAVEN_DEPENDENCY_PLUGIN}:copy-dependencies",
        f"-DoutputDirectory={output_dir}",
        "-DincludeScope=runtime",
        "-Dmdep.useRepositoryLayout=true",
    ]


def parse_repository_layout(root: Path, jar: Path) -> tuple[str, str, str]:
    """(groupId, artifactId, version) of a jar copied in Maven repository layout under ``root``."""
    parts = jar.relative_to(root).parts
    if len(parts) < 4:
        raise ValueError(f"not in repository layout: {jar}")
    return ".".join(parts[:-3]), parts[-3], parts[-2]


def shipped_by(names: set[str] | list[str], artifact_id: str) -> str | None:
    """The file among ``names`` (pyspark's jars) that is some version of ``artifact_id``, if any.

    pyspark names its jars ``<artifactId>-<version>.jar`` with a version starting with a digit, so
    ``commons-pool2`` does not match ``commons-pool-1.5.4.jar`` and ``spark-sql-kafka-0-10_2.13``
    does not match ``spark-sql_2.13-4.2.0.jar``.
    """
    pat = re.compile(re.escape(artifact_id) + r"-\d[^/]*\.jar")
    for n in sorted(names):
        if pat.fullmatch(n):
            return n
    return None


# ---------------------------------------------------------------------------------------------
# resolution


@contextmanager
def locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _read_marker(folder: Path) -> list[str] | None:
    marker = folder / MARKER
    try:
        data = json.loads(marker.read_text())
    except (OSError, ValueError):
        return None
    jars = [str(folder / n) for n in data.get("jars", [])]
    if not jars or not all(Path(j).is_file() for j in jars):
        return None
    return jars


def _run_mvn(workdir: Path, out: Path) -> subprocess.CompletedProcess[str]:
    if shutil.which("mvn") is None:
        raise JarsError("mvn is not installed: Maven resolves Spark's Kafka source jars from Maven Central, once. "
                        "Install it (apt-get install -y maven; bash .ci/setup installs every prerequisite)")
    return subprocess.run(
        mvn_command(out), cwd=workdir, capture_output=True, text=True, stdin=subprocess.DEVNULL
    )


_ANSI = re.compile(r"\x1b\[[0-9;]*m")
# Maven's generic advice after an error says nothing about the cause
_ADVICE = re.compile(r"^\[ERROR\]\s*(\[Help \d+\]|To see the full|Re-run Maven|For more information|$)")


def tail(text: str, n: int = 12) -> str:
    lines = [ln for ln in _ANSI.sub("", text).strip().splitlines() if ln.strip() and not _ADVICE.match(ln)]
    return "\n".join(lines[-n:])


def resolve(
    folder: Path,
    what: str,
    attempts: list[tuple[str, list[tuple[str, str, str]], list[tuple[str, str, str]], str]],
    keep,
) -> list[str]:
    """Resolve into ``folder`` (atomically).

    ``attempts`` are (note, deps, managed, when) tried in order; an attempt after the first runs only
    if the previous Maven output contains ``when``.  ``keep(group, artifact, version) -> bool``
    filters the resolved files.
    """
    cached = _read_marker(folder)
    if cached:
        return cached
    with locked(folder.parent / f".{folder.name}.lock"):
        cached = _read_marker(folder)
        if cached:
            return cached
        tmp = folder.parent / f".{folder.name}.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        failures: list[str] = []
        last_output = ""
        for note, deps, managed, when in attempts:
            if failures and when not in last_output:
                continue
            shutil.rmtree(tmp, ignore_errors=True)
            (tmp / "repo").mkdir(parents=True)
            (tmp / "pom.xml").write_text(render_pom(folder.name, deps, managed))
            t0 = time.monotonic()
            proc = _run_mvn(tmp, tmp / "repo")
            if proc.returncode == 0:
                break
            last_output = proc.stdout + proc.stderr
            failures.append(f"[{note}]\n{tail(proc.stdout + proc.stderr)}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
            coords = ", ".join(f"{g}:{a}:{v}" for g, a, v in attempts[0][1])
            raise JarsError(
                f"Maven could not resolve {what} ({coords}) and its runtime dependencies. "
                "Maven Central must be reachable (through ~/.m2/settings.xml if a mirror is needed).\n"
                + "\n".join(failures)
            )
        kept, dropped = [], []
        for jar in sorted((tmp / "repo").rglob("*.jar")):
            g, a, v = parse_repository_layout(tmp / "repo", jar)
            if keep(g, a, v):
                if (tmp / jar.name).exists():
                    raise JarsError(f"two resolved jars share the file name {jar.name}")
                shutil.move(str(jar), tmp / jar.name)
                kept.append(jar.name)
            else:
                dropped.append(f"{g}:{a}:{v}")
        shutil.rmtree(tmp / "repo")
        (tmp / MARKER).write_text(
            json.dumps(
                {
                    "jars": kept,
                    "skipped_as_provided": dropped,
                    "resolution": note,
                    "seconds": round(time.monotonic() - t0, 1),
                    "at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                },
                indent=2,
            )
            + "\n"
        )
        if note != "exact":
            print(f"applier: {what}: {note}", file=sys.stderr)
        shutil.rmtree(folder, ignore_errors=True)
        os.replace(tmp, folder)
        jars = _read_marker(folder)
        assert jars is not None
        return jars


def spark_kafka_jars() -> list[str]:
    """Absolute paths of Spark's Kafka source jars (for ``spark.jars``), resolved once and cached."""
    version = spark_version()
    folder = jars_home() / f"spark-kafka-{version}"
    cached = _read_marker(folder)
    if cached:
        return cached
    pyspark_dir = pyspark_jars_dir()
    provided = set(os.listdir(pyspark_dir)) if pyspark_dir else set()
    deps = [("org.apache.spark", f"spark-sql-kafka-0-10_{SCALA_SUFFIX}", version)]
    attempts = [("exact", deps, [], "")]
    if version != TOKEN_PROVIDER_FALLBACK:
        attempts.append(
            (
                f"{TOKEN_PROVIDER_ARTIFACT}:{version} is not in the Maven registry; "
                f"pinned {TOKEN_PROVIDER_ARTIFACT}:{TOKEN_PROVIDER_FALLBACK} (API-compatible "
                "for everything but Kerberos delegation tokens)",
                deps,
                [("org.apache.spark", TOKEN_PROVIDER_ARTIFACT, TOKEN_PROVIDER_FALLBACK)],
                f"{TOKEN_PROVIDER_ARTIFACT}:jar:{version}",
            )
        )

    def keep(group: str, artifact: str, ver: str) -> bool:
        return shipped_by(provided, artifact) is None

    return resolve(folder, f"Spark's Kafka source for Spark {version}", attempts, keep)
