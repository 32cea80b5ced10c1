"""docker-compose.yml and conf/compose.toml agree with each other, checked without a Docker engine.

The compose stack fails at run time, minutes into a first start, when the two files drift apart: a topic
nobody creates (the broker does not auto-create), a bootstrap address no listener advertises, a target URL
naming another database or user than the one the MySQL image initialised, a password variable the applier's
container lacks. Each such mismatch is one test here, and every value is read from the two files (the config
path from the applier's command, the topics from the config, the listeners from the broker's environment),
so renaming something in one file only makes a test fail.

Environment values are resolved the way ``docker compose`` does with nothing set on the host
(``${VAR:-default}`` gives the default, ``$$`` a literal ``$``): what a fresh ``docker compose up`` sees.
"""

from __future__ import annotations

import ast
import re
import shlex
import tomllib
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Iterator, Mapping

import pytest
import yaml

from applier.config import ConfigError, Settings, load_config, parse_config
from applier.pipeline import router_for

REPO = Path(__file__).resolve().parents[2]
COMPOSE_FILE = REPO / "docker-compose.yml"

CONDITIONS = ("service_started", "service_healthy", "service_completed_successfully")
LOOPBACK = ("127.0.0.1", "::1", "[::1]", "localhost")

# Per database image: which environment variables name the database, the user and the password, and the
# defaults the image uses when they are absent (None: no usable default, the variable must be set).
DB_IMAGE_ENV: dict[str, dict[str, tuple[tuple[str, ...], str | None]]] = {
    "mysql": {"database": (("MYSQL_DATABASE", "MARIADB_DATABASE"), None),
              "user": (("MYSQL_USER", "MARIADB_USER"), None),
              "password": (("MYSQL_PASSWORD", "MARIADB_PASSWORD"), None)},
    "postgresql": {"database": (("POSTGRES_DB",), None),  # defaults to POSTGRES_USER, handled below
                   "user": (("POSTGRES_USER",), "postgres"),
                   "password": (("POSTGRES_PASSWORD",), None)},
}


# --------------------------------------------------------------------------------------------------
# Reading the compose file the way compose does (the parts these checks need)
# --------------------------------------------------------------------------------------------------

_VAR_RE = re.compile(r"\$(?:\$|\{(?P<braced>[^}]*)\}|(?P<plain>[A-Za-z_][A-Za-z0-9_]*))")


def interpolate(text: str, env: Mapping[str, str] | None = None) -> str:
    """Compose's variable substitution: ``$$`` -> ``$``, ``${V}``, ``${V:-d}``, ``${V-d}``, ``${V:?e}``,
    ``$V``. With the default empty ``env`` this is what a host with none of the variables set gets."""
    env = env or {}

    def sub(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        if m.group("plain"):
            return env.get(m.group("plain"), "")
        expr = m.group("braced")
        for op in (":-", "-", ":?", "?", ":+", "+"):
            if op in expr:
                name, arg = expr.split(op, 1)
                value = env.get(name)
                if op == ":-":
                    return value if value else arg
                if op == "-":
                    return arg if value is None else value
                if op in (":?", "?"):
                    return value or ""
                return arg if value else ""  # :+ / +
        return env.get(expr, "")

    return _VAR_RE.sub(sub, text)


def environment(service: Mapping[str, Any]) -> dict[str, str]:
    """A service's ``environment:`` (mapping or ``KEY=VALUE`` list), values interpolated, as strings."""
    raw = service.get("environment") or {}
    if isinstance(raw, list):
        pairs = [item.split("=", 1) if "=" in item else (item, "") for item in raw]
        raw = dict(pairs)
    return {k: interpolate(str(v)) if v is not None else "" for k, v in raw.items()}


def raw_environment(service: Mapping[str, Any]) -> dict[str, str]:
    """``environment:`` as written (not interpolated): to compare two services' expressions."""
    raw = service.get("environment") or {}
    if isinstance(raw, list):
        raw = dict(item.split("=", 1) if "=" in item else (item, "") for item in raw)
    return {k: "" if v is None else str(v) for k, v in raw.items()}


def depends_on(service: Mapping[str, Any]) -> dict[str, str]:
    """``depends_on`` as {service: condition} (the list form means ``service_started``)."""
    raw = service.get("depends_on") or {}
    if isinstance(raw, list):
        return {name: "service_started" for name in raw}
    return {name: (spec or {}).get("condition", "service_started") for name, spec in raw.items()}


@dataclass(frozen=True)
class Mount:
    source: str | None  # a named volume's name, a host path (as written), or None (anonymous)
    target: str
    named: bool


def mounts(service: Mapping[str, Any]) -> list[Mount]:
    """A service's ``volumes:`` in short (``SRC:DST[:MODE]``) or long (mapping) syntax."""
    out: list[Mount] = []
    for v in service.get("volumes") or []:
        if isinstance(v, dict):
            src, dst = v.get("source"), v["target"]
            named = v.get("type", "volume") == "volume" and bool(src)
        else:
            parts = interpolate(v).split(":")
            if len(parts) == 1:
                src, dst = None, parts[0]
            else:
                src, dst = parts[0], parts[1]
            named = src is not None and not src.startswith((".", "/", "~"))
        out.append(Mount(src, dst, named))
    return out


@dataclass(frozen=True)
class Port:
    host_ip: str | None
    published: str | None
    target: int


def ports(service: Mapping[str, Any]) -> list[Port]:
    """A service's ``ports:`` in short (``[IP:]HOST:CONTAINER[/proto]``) or long syntax."""
    out: list[Port] = []
    for p in service.get("ports") or []:
        if isinstance(p, dict):
            out.append(Port(p.get("host_ip"), str(p.get("published")) if p.get("published") else None,
                            int(p["target"])))
            continue
        spec = interpolate(str(p)).split("/")[0]
        m = re.fullmatch(r"(?:(?P<ip>\[[^\]]+\]|[^:]+):)??(?:(?P<pub>[^:]*):)?(?P<target>\d+(?:-\d+)?)", spec)
        assert m, f"unreadable port mapping {p!r}"
        out.append(Port(m.group("ip"), m.group("pub") or None, int(m.group("target").split("-")[0])))
    return out


def _script_parts(value: Any) -> tuple[list[str], list[list[str]]]:
    """(shell scripts, exec-form argument lists) in a ``command``/``entrypoint``/healthcheck value."""
    if value is None:
        return [], []
    if isinstance(value, str):
        return [value], []
    items = [str(x) for x in value]
    if items and items[0] in ("CMD-SHELL",):
        return [" ".join(items[1:])], []
    if items and items[0] == "CMD":
        return [], [items[1:]]
    return [], [items]


def _split_commands(script: str) -> Iterator[list[str]]:
    """Simple commands of a shell script, line by line, split at ``;``, ``&&``, ``||``, ``|`` and
    redirections (good enough for the straight-line scripts of a compose file)."""
    script = script.replace("\\\n", " ")
    for line in script.splitlines():
        lex = shlex.shlex(line, posix=True, punctuation_chars=True)
        lex.whitespace_split = True
        lex.commenters = "#"
        try:
            tokens = list(lex)
        except ValueError:
            continue  # unbalanced quotes in a line that is not a plain command; not ours to read
        cmd: list[str] = []
        for tok in tokens:
            if tok and set(tok) <= set("();<>|&"):
                if cmd:
                    yield cmd
                cmd = []
            else:
                cmd.append(tok)
        if cmd:
            yield cmd


def commands(service: Mapping[str, Any], key: str = "command") -> list[list[str]]:
    """Every simple command a service runs (``key``: ``command``, ``entrypoint`` or ``healthcheck``),
    interpolated. A ``sh -c SCRIPT`` is read as the script; with ``entrypoint: [sh, -c]`` the command's
    first item is the script."""
    if key == "healthcheck":
        value = (service.get("healthcheck") or {}).get("test")
    else:
        value = service.get(key)
    if key == "command":
        entry = service.get("entrypoint")
        if isinstance(entry, list) and len(entry) >= 2 and entry[-1] == "-c" and isinstance(value, list):
            value = ["sh", "-c", *value]
    scripts, argvs = _script_parts(value)
    out: list[list[str]] = []
    for argv in argvs:
        if len(argv) >= 3 and PurePosixPath(argv[0]).name in ("sh", "bash") and argv[1] == "-c":
            scripts.append(argv[2])  # interpolated below, once
        else:
            out.append([interpolate(a) for a in argv])
    for script in scripts:
        out.extend(_split_commands(interpolate(script)))
    return out


def invocations(service: Mapping[str, Any], program: str, key: str = "command") -> list[list[str]]:
    """The argument lists (program first) of every call of ``program`` (matched by file name)."""
    found = []
    for cmd in commands(service, key):
        for i, tok in enumerate(cmd):
            if PurePosixPath(tok).name == program:
                found.append(cmd[i:])
                break
    return found


def option(argv: list[str], name: str) -> str | None:
    """The value of ``name VALUE`` or ``name=VALUE`` in an argument list."""
    for i, tok in enumerate(argv):
        if tok == name and i + 1 < len(argv):
            return argv[i + 1]
        if tok.startswith(name + "="):
            return tok.split("=", 1)[1]
    return None


def listeners(value: str) -> dict[str, tuple[str, int]]:
    """``NAME://host:port,...`` -> {NAME: (host, port)}."""
    out = {}
    for item in filter(None, (s.strip() for s in value.split(","))):
        name, _, addr = item.partition("://")
        host, _, port = addr.rpartition(":")
        out[name] = (host, int(port))
    return out


def host_port(server: str) -> tuple[str, int]:
    host, _, port = server.strip().rpartition(":")
    return host, int(port)


# --------------------------------------------------------------------------------------------------
# The stack as the checks see it
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Stack:
    compose: dict[str, Any]
    services: dict[str, dict[str, Any]]
    applier: str  # the service running `applier run`
    config_in_container: str  # its -c argument
    config_path: Path  # the same file in this checkout

    def service(self, name: str) -> dict[str, Any]:
        return self.services[name]


def _repo_path(service: Mapping[str, Any], container_path: str) -> Path | None:
    """Where a path inside the container comes from in this checkout (through a bind mount), or None."""
    best: tuple[int, Path] | None = None
    for m in mounts(service):
        if m.named or m.source is None:
            continue
        target = m.target.rstrip("/") or "/"
        if container_path == target or container_path.startswith(target.rstrip("/") + "/"):
            rel = PurePosixPath(container_path).relative_to(target)
            host = (COMPOSE_FILE.parent / m.source).resolve() / rel
            if best is None or len(target) > best[0]:
                best = (len(target), host)
    return None if best is None else best[1]


@pytest.fixture(scope="module")
def stack() -> Stack:
    compose = yaml.safe_load(COMPOSE_FILE.read_text())
    services = compose.get("services") or {}
    runners = {name: inv for name, svc in services.items()
               for inv in invocations(svc, "applier") if inv[1:2] == ["run"]}
    assert len(runners) == 1, f"expected one service running `applier run -c FILE`, found {sorted(runners) or 'none'}"
    (name, argv), = runners.items()
    cfg = option(argv, "-c") or option(argv, "--config")
    assert cfg, f"service {name!r} runs {' '.join(argv)!r} without -c FILE"
    path = _repo_path(services[name], cfg)
    assert path is not None, (f"service {name!r} runs the applier with -c {cfg}, which is not inside a folder "
                              "of this checkout mounted into the container (volumes: - ./:/app)")
    return Stack(compose, services, name, cfg, path)


@pytest.fixture(scope="module")
def applier_env(stack: Stack) -> dict[str, str]:
    return environment(stack.service(stack.applier))


@pytest.fixture(scope="module")
def raw_config(stack: Stack) -> dict[str, Any]:
    if not stack.config_path.is_file():
        pytest.fail(f"{stack.config_path} (the applier's -c {stack.config_in_container}) does not exist")
    return tomllib.loads(stack.config_path.read_text())


@pytest.fixture(scope="module")
def settings(stack: Stack, applier_env: dict[str, str], raw_config: dict[str, Any]) -> Settings:
    """The config validated by the applier itself, with exactly the environment its container gets."""
    try:
        return load_config(stack.config_path, env=applier_env)
    except ConfigError as exc:
        pytest.fail(f"{stack.config_path.name} does not load with the {stack.applier!r} service's environment "
                    f"{sorted(applier_env)}: {exc}")


def _kafka_service(stack: Stack, settings: Settings) -> str:
    host, _ = host_port(settings.source.bootstrap_servers.split(",")[0])
    for name, svc in stack.services.items():
        if host in (name, svc.get("hostname"), svc.get("container_name")):
            return name
    pytest.fail(f"source.bootstrap_servers {settings.source.bootstrap_servers!r}: no service named {host!r} "
                f"(services: {sorted(stack.services)})")


def _target_service(stack: Stack, settings: Settings) -> str:
    host = settings.target_url().host
    if host not in stack.services:
        pytest.fail(f"target.url host {host!r} is not a compose service (services: {sorted(stack.services)})")
    return host


def _topic_creations(stack: Stack) -> dict[str, list[tuple[str, list[str]]]]:
    """{topic: [(service, kafka-topics.sh argv with --create)]}."""
    out: dict[str, list[tuple[str, list[str]]]] = {}
    for name, svc in stack.services.items():
        for argv in invocations(svc, "kafka-topics.sh"):
            if "--create" in argv and option(argv, "--topic"):
                out.setdefault(option(argv, "--topic") or "", []).append((name, argv))
    return out


def _sample_service(stack: Stack) -> str:
    names = [n for n in stack.services if "sample" in n]
    assert len(names) == 1, f"expected one sample changefeed service (a name with 'sample'), found {names}"
    return names[0]


def _sample_code(stack: Stack) -> str:
    """The Python the sample producer runs: the argument of ``python -c``, or ``"$1"`` of ``sh -c``."""
    svc = stack.service(_sample_service(stack))
    cmd = [str(x) for x in svc.get("command") or []]
    for argv in invocations(svc, "python"):
        code = option(argv, "-c")
        if code in ("$1", "${1}") and len(cmd) >= 5 and cmd[1] == "-c":
            return interpolate(cmd[4])
        if code:
            return code
    pytest.fail(f"service {_sample_service(stack)!r} does not run `python -c CODE`")


# --------------------------------------------------------------------------------------------------
# Service graph
# --------------------------------------------------------------------------------------------------


def test_depends_on_names_existing_services_with_valid_conditions(stack: Stack) -> None:
    """A typo in a depends_on name or condition only shows when compose refuses the file."""
    problems = [f"{name} -> {dep} ({cond})"
                for name, svc in stack.services.items() for dep, cond in depends_on(svc).items()
                if dep not in stack.services or cond not in CONDITIONS]
    assert not problems, f"depends_on names unknown services or conditions (valid: {CONDITIONS}): {problems}"


def test_service_healthy_dependencies_have_healthchecks(stack: Stack) -> None:
    """Waiting for `service_healthy` on a service without a healthcheck fails the `up` at once."""
    missing = [f"{name} -> {dep}" for name, svc in stack.services.items()
               for dep, cond in depends_on(svc).items()
               if cond == "service_healthy" and dep in stack.services
               and (not stack.service(dep).get("healthcheck") or stack.service(dep)["healthcheck"].get("disable"))]
    assert not missing, f"service_healthy dependencies without a healthcheck: {missing}"


def test_completed_successfully_dependencies_are_one_shot(stack: Stack) -> None:
    """A `service_completed_successfully` dependency must exit; a restart policy would rerun it forever."""
    bad = [dep for svc in stack.services.values() for dep, cond in depends_on(svc).items()
           if cond == "service_completed_successfully" and dep in stack.services
           and str(stack.service(dep).get("restart", "no")) not in ("no", "on-failure")]
    assert not bad, f"one-shot dependencies with a restart policy that reruns them: {bad}"


def test_long_running_services_have_healthchecks(stack: Stack) -> None:
    """Every service but the one-shots (restart: "no") reports its health, so `docker compose ps` and
    dependants can tell "running" from "working"."""
    missing = [name for name, svc in stack.services.items()
               if str(svc.get("restart")) != "no" and not svc.get("healthcheck")]
    assert not missing, f"long-running services without a healthcheck (one-shots: set restart: \"no\"): {missing}"


def test_default_services_do_not_depend_on_profiled_ones(stack: Stack) -> None:
    """`docker compose up` without --profile does not start profiled services, so depending on one fails."""
    bad = [f"{name} -> {dep}" for name, svc in stack.services.items() if not svc.get("profiles")
           for dep in depends_on(svc) if dep in stack.services and stack.service(dep).get("profiles")]
    assert not bad, f"services without a profile depend on profiled services: {bad}"


def test_applier_waits_for_topics_and_healthy_services(stack: Stack, settings: Settings) -> None:
    """The applier exits at once when its topic is missing or Kafka/the target do not answer yet."""
    deps = depends_on(stack.service(stack.applier))
    kafka, target = _kafka_service(stack, settings), _target_service(stack, settings)
    creators = {svc for found in _topic_creations(stack).values() for svc, _ in found}
    assert deps.get(kafka) == "service_healthy", (
        f"{stack.applier} must depend on {kafka} with service_healthy: {deps}")
    assert deps.get(target) == "service_healthy", (
        f"{stack.applier} must depend on {target} with service_healthy: {deps}")
    assert creators, "no service creates topics (kafka-topics.sh --create)"
    for svc in creators:
        assert deps.get(svc) == "service_completed_successfully", (
            f"{stack.applier} must depend on {svc} (it creates the topics) with service_completed_successfully: {deps}")


# --------------------------------------------------------------------------------------------------
# Kafka
# --------------------------------------------------------------------------------------------------


def test_config_loads_with_the_applier_environment(settings: Settings) -> None:
    """The fixture validates the config with the container's environment; this makes that a test."""
    assert settings.source_path is not None


def test_bootstrap_servers_is_an_advertised_in_network_listener(stack: Stack, settings: Settings) -> None:
    """The Kafka client connects to the bootstrap address, then to what the broker advertises: both must
    be reachable from the applier's container (the HOST listener's 127.0.0.1 is not)."""
    kafka = _kafka_service(stack, settings)
    env = environment(stack.service(kafka))
    advertised = listeners(env.get("KAFKA_ADVERTISED_LISTENERS", ""))
    bound = listeners(env.get("KAFKA_LISTENERS", ""))
    for server in settings.source.bootstrap_servers.split(","):
        host, port = host_port(server)
        matching = [name for name, addr in advertised.items() if addr == (host, port)]
        assert matching, (f"source.bootstrap_servers {server!r} is not an advertised listener of {kafka!r} "
                          f"(KAFKA_ADVERTISED_LISTENERS: {advertised})")
        assert all(bound.get(name, (None, None))[1] == port for name in matching), (
            f"listener {matching} is advertised on port {port} but KAFKA_LISTENERS binds {bound}")


def test_kafka_healthcheck_uses_the_in_network_listener(stack: Stack, settings: Settings) -> None:
    """A healthcheck through another listener could pass while the one the applier uses is broken."""
    kafka = _kafka_service(stack, settings)
    checks = invocations(stack.service(kafka), "kafka-broker-api-versions.sh", "healthcheck")
    assert checks, f"{kafka}'s healthcheck does not run kafka-broker-api-versions.sh"
    wanted = {host_port(s) for s in settings.source.bootstrap_servers.split(",")}
    used = {host_port(option(argv, "--bootstrap-server") or ":0") for argv in checks}
    assert used <= wanted, f"{kafka}'s healthcheck connects to {used}, the applier to {wanted}"


def test_subscribed_topics_are_created_if_not_exists(stack: Stack, settings: Settings) -> None:
    """The broker has auto-create off: every topic the applier subscribes to must be created up front,
    idempotently (--if-not-exists), or a second `up` fails on TopicExistsException."""
    created = _topic_creations(stack)
    wanted = list(settings.source.topics or [])
    if settings.source.topic_pattern:
        assert any(re.fullmatch(settings.source.topic_pattern, t) for t in created), (
            f"source.topic_pattern {settings.source.topic_pattern!r} matches none of the created topics "
            f"{sorted(created)}")
    missing = [t for t in wanted if t not in created]
    assert not missing, (
        f"topics in {stack.config_path.name} that no service creates: {missing} (created: {sorted(created)})")
    for topic in wanted:
        for svc, argv in created[topic]:
            assert "--if-not-exists" in argv, f"{svc} creates {topic} without --if-not-exists: {' '.join(argv)}"


def test_topic_creation_uses_the_kafka_image_and_listener(stack: Stack, settings: Settings) -> None:
    """kafka-init runs the broker's own tools (same image, same version) against the in-network listener."""
    kafka = _kafka_service(stack, settings)
    wanted = {host_port(s) for s in settings.source.bootstrap_servers.split(",")}
    for found in _topic_creations(stack).values():
        for svc, argv in found:
            assert stack.service(svc).get("image") == stack.service(kafka).get("image"), (
                f"{svc} uses {stack.service(svc).get('image')}, {kafka} {stack.service(kafka).get('image')}")
            assert host_port(option(argv, "--bootstrap-server") or ":0") in wanted, (
                f"{svc} creates topics through {option(argv, '--bootstrap-server')}, the applier reads {wanted}")
            assert depends_on(stack.service(svc)).get(kafka) == "service_healthy", (
                f"{svc} must wait for {kafka} (depends_on condition: service_healthy)")


# --------------------------------------------------------------------------------------------------
# Target database
# --------------------------------------------------------------------------------------------------


def _db_env(stack: Stack, service: str, dialect: str, key: str, *, raw: bool = False) -> str | None:
    family = "postgresql" if dialect == "postgresql" else "mysql"
    names, default = DB_IMAGE_ENV[family][key]
    env = (raw_environment if raw else environment)(stack.service(service))
    for name in names:
        if name in env:
            return env[name]
    if family == "postgresql" and key == "database":
        return _db_env(stack, service, dialect, "user", raw=raw)
    return default


def test_target_url_matches_the_database_service(stack: Stack, settings: Settings) -> None:
    """The image creates exactly one database and user from its environment; the URL must name those,
    on the container port (not the host-published one)."""
    url = settings.target_url()
    service = _target_service(stack, settings)
    svc = stack.service(service)
    container_ports = {p.target for p in ports(svc)} | {int(str(e).split("/")[0]) for e in svc.get("expose") or []}
    assert url.port in container_ports, (
        f"target.url port {url.port} is not a container port of {service!r} ({sorted(container_ports)}; "
        "inside the network use the container port, e.g. mysql:3306, not the published 13306)")
    db = _db_env(stack, service, settings.target.dialect, "database")
    user = _db_env(stack, service, settings.target.dialect, "user")
    assert url.database == db, f"target.url database {url.database!r}, {service!r} creates {db!r}"
    assert url.username == user, f"target.url user {url.username!r}, {service!r} creates {user!r}"


def test_password_env_is_set_for_the_applier(stack: Stack, raw_config: dict[str, Any],
                                            applier_env: dict[str, str]) -> None:
    """password_env names a variable the applier's container must have, or `applier run` exits 2."""
    name = (raw_config.get("target") or {}).get("password_env")
    assert name, f"{stack.config_path.name} has no target.password_env (keep passwords out of the file)"
    assert name in applier_env, (f"target.password_env {name!r} is not in the {stack.applier!r} service's "
                                 f"environment ({sorted(applier_env)})")
    assert applier_env[name], f"{name} is empty in the {stack.applier!r} service's environment"


def test_applier_password_is_the_database_password(stack: Stack, settings: Settings) -> None:
    """Both sides must come from the same expression (e.g. ${MYSQL_PASSWORD:-applier}), so that setting the
    variable on the host changes them together."""
    service = _target_service(stack, settings)
    name = settings.target.password_env
    assert name is not None
    ours = raw_environment(stack.service(stack.applier)).get(name)
    theirs = _db_env(stack, service, settings.target.dialect, "password", raw=True)
    assert ours == theirs, f"{stack.applier} sets {name}={ours!r}, {service} initialises its user with {theirs!r}"


def test_postgres_alternative_in_the_config_comment_matches(stack: Stack, raw_config: dict[str, Any],
                                                            applier_env: dict[str, str]) -> None:
    """The commented switch to the postgres service must work when uncommented: same checks as the target."""
    text = stack.config_path.read_text()
    url = re.search(r'^#\s*url\s*=\s*"(postgresql[^"]*)"', text, re.M)
    pw = re.search(r'^#\s*password_env\s*=\s*"([^"]*)"', text, re.M)
    assert url is not None, "conf/compose.toml lost its commented switch to the postgres service (docker-compose.yml names it)"
    assert pw, "the commented PostgreSQL url comes without a commented password_env"
    data = {**raw_config, "target": {**raw_config["target"], "url": url.group(1), "password_env": pw.group(1)}}
    alt = parse_config(data, source="<commented postgres target>", env=applier_env,
                       base_dir=stack.config_path.parent)
    u = alt.target_url()
    svc = stack.service(_target_service(stack, alt))
    assert u.port in {p.target for p in ports(svc)}, f"{u.host} has no container port {u.port}"
    assert u.database == _db_env(stack, u.host, "postgresql", "database")
    assert u.username == _db_env(stack, u.host, "postgresql", "user")
    assert raw_environment(stack.service(stack.applier)).get(pw.group(1)) == \
        _db_env(stack, u.host, "postgresql", "password", raw=True)
    assert depends_on(stack.service(stack.applier)).get(u.host) == "service_healthy", (
        f"the comment says switching needs no compose edit: {stack.applier} must wait for {u.host}")


# --------------------------------------------------------------------------------------------------
# The applier's container
# --------------------------------------------------------------------------------------------------


def test_config_path_is_the_mounted_checkout_file(stack: Stack) -> None:
    """`-c` must name a file of this checkout as the container sees it (bind mount of the repository)."""
    assert stack.config_path.is_file(), (
        f"{stack.applier} runs -c {stack.config_in_container}, i.e. {stack.config_path}, which does not exist")
    assert stack.config_path.is_relative_to(REPO), f"{stack.config_path} is outside the repository"


def test_applier_healthcheck_reads_the_same_config(stack: Stack) -> None:
    """`applier status -c FILE` is the healthcheck: the same file as the run, and a start_period that
    covers the first start's apt + pip + Maven installs (several minutes)."""
    svc = stack.service(stack.applier)
    checks = [argv for argv in invocations(svc, "applier", "healthcheck") if argv[1:2] == ["status"]]
    assert checks, f"{stack.applier}'s healthcheck does not run `applier status -c FILE`"
    for argv in checks:
        assert (option(argv, "-c") or option(argv, "--config")) == stack.config_in_container, (
            f"healthcheck reads {option(argv, '-c')}, the run {stack.config_in_container}")
    start = str(svc["healthcheck"].get("start_period", "0s"))
    seconds = sum(int(n) * {"h": 3600, "m": 60, "s": 1}[u] for n, u in re.findall(r"(\d+)([hms])", start))
    assert seconds >= 300, f"{stack.applier}'s healthcheck start_period {start} is shorter than a first start"


def test_checkpoint_dir_is_on_a_named_volume(stack: Stack, settings: Settings) -> None:
    """The checkpoint folder (lock, spill, Spark state) must be writable and not in the checkout: a named
    volume mounted above it."""
    ckpt = PurePosixPath(settings.pipeline.checkpoint_dir)
    assert ckpt.is_absolute(), f"pipeline.checkpoint_dir {ckpt} must be absolute in the container"
    vols = [m for m in mounts(stack.service(stack.applier)) if m.named]
    assert any(ckpt == PurePosixPath(m.target) or ckpt.is_relative_to(m.target) for m in vols), (
        f"pipeline.checkpoint_dir {ckpt} is under none of {stack.applier}'s named volumes "
        f"{[m.target for m in vols]}")


def test_applier_installs_the_mounted_checkout(stack: Stack) -> None:
    """The stock image gets the project with `pip install` from the mounted checkout (the folder holding the
    config), directly or from a copy made of it first; that folder must be the project (pyproject.toml)."""
    for name in (stack.applier, _sample_service(stack)):
        svc = stack.service(name)
        mount = next((m for m in mounts(svc) if not m.named and m.source is not None
                      and PurePosixPath(stack.config_in_container).is_relative_to(m.target)), None)
        assert mount is not None, f"{name} does not mount the folder of {stack.config_in_container}"
        assert (COMPOSE_FILE.parent / mount.source).resolve() == REPO, f"{name} mounts {mount.source}, not the checkout"
        cmds = commands(svc)
        installs = [argv for argv in invocations(svc, "pip") if argv[1:2] == ["install"]]
        assert installs, f"{name} does not run `pip install`"
        for argv in installs:
            paths = [a for a in argv[2:] if a.startswith("/")]
            assert paths, f"{name} runs {' '.join(argv)!r}: no local path to install"
            for path in paths:
                if path.rstrip("/") == mount.target.rstrip("/"):
                    continue
                reads = any(mount.target in cmd for cmd in cmds)
                writes = any(path in cmd for cmd in cmds if PurePosixPath(cmd[0]).name != "pip")
                assert reads and writes, (f"{name} installs {path}, which is neither the mounted checkout "
                                          f"{mount.target} nor filled from it")
    assert (REPO / "pyproject.toml").is_file()


# --------------------------------------------------------------------------------------------------
# Host exposure and declarations
# --------------------------------------------------------------------------------------------------


def test_host_ports_are_bound_to_loopback(stack: Stack) -> None:
    """The services have fixed, weak passwords: publishing them on every interface would expose them."""
    open_ = [f"{name}: {p}" for name, svc in stack.services.items() for p in ports(svc)
             if p.published is not None and p.host_ip not in LOOPBACK]
    assert not open_, f"ports published beyond 127.0.0.1: {open_}"


def test_named_volumes_and_configs_are_declared(stack: Stack) -> None:
    """Compose refuses a service volume or config that the top level does not declare."""
    declared = set(stack.compose.get("volumes") or {})
    used = {m.source for svc in stack.services.values() for m in mounts(svc) if m.named}
    assert used <= declared, f"named volumes used but not declared under volumes: {sorted(used - declared)}"
    configs = set(stack.compose.get("configs") or {})
    wanted = {c if isinstance(c, str) else c["source"]
              for svc in stack.services.values() for c in svc.get("configs") or []}
    assert wanted <= configs, f"configs used but not declared under configs: {sorted(wanted - configs)}"


# --------------------------------------------------------------------------------------------------
# The sample changefeed
# --------------------------------------------------------------------------------------------------


def test_sample_producer_is_behind_a_profile(stack: Stack) -> None:
    """A plain `docker compose up` must not write fake data into a topic a real TiCDC may feed."""
    name = _sample_service(stack)
    assert stack.service(name).get("profiles"), f"{name} has no profiles: it would run on every `up`"
    assert str(stack.service(name).get("restart")) == "no", f"{name} is one-shot: restart: \"no\""


def test_sample_producer_writes_a_topic_the_applier_reads(stack: Stack, settings: Settings) -> None:
    """The sample goes where the applier subscribes, through the listener the applier uses, after the
    topic exists."""
    name = _sample_service(stack)
    svc = stack.service(name)
    env = environment(svc)
    code = _sample_code(stack)
    tree = ast.parse(code)  # a syntax error fails here, not minutes into the container's start
    read = {n.slice.value for n in ast.walk(tree)
            if isinstance(n, ast.Subscript) and isinstance(n.slice, ast.Constant)
            and ast.unparse(n.value) == "os.environ"}
    assert {"SAMPLE_TOPIC", "SAMPLE_BOOTSTRAP"} <= read, f"{name}'s code reads {sorted(read)} from the environment"
    topic, bootstrap = env.get("SAMPLE_TOPIC"), env.get("SAMPLE_BOOTSTRAP")
    topics = settings.source.topics or ()
    pattern = settings.source.topic_pattern
    assert topic in topics or (pattern and re.fullmatch(pattern, topic or "")), (
        f"{name} writes to {topic!r}; {stack.config_path.name} reads {list(topics) or settings.source.topic_pattern}")
    assert bootstrap in settings.source.bootstrap_servers.split(","), (
        f"{name} writes through {bootstrap!r}, the applier reads {settings.source.bootstrap_servers!r}")
    creators = {svc_name for svc_name, _ in _topic_creations(stack).get(topic or "", [])}
    assert creators, f"no service creates {topic!r}, the topic {name} writes"
    for creator in creators:
        assert depends_on(svc).get(creator) == "service_completed_successfully", (
            f"{name} must wait for {creator} to create {topic} (service_completed_successfully)")
    calls = {ast.unparse(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
    assert {"generate", "produce"} <= calls, f"{name}'s code calls {sorted(calls)}, not generate/produce"


def test_sample_changefeed_decodes_and_routes_with_the_config(stack: Stack, settings: Settings) -> None:
    """The sample's protocol is the one the config decodes, and every table it promises a final state for
    is routed somewhere (not ignored), each to its own target table."""
    from applier.devtools import changefeed as workload

    tree = ast.parse(_sample_code(stack))
    gen = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and ast.unparse(n.func) == "generate"]
    assert gen and isinstance(gen[0].args[0], ast.Constant), "generate() must get its protocol as a literal"
    protocol = gen[0].args[0].value
    wl = workload.generate(protocol, partitions=1, txns=2, seed=1, replays=0)
    assert wl.source_protocol == settings.source.protocol, (
        f"the sample is {protocol!r} (source.protocol {wl.source_protocol!r}); "
        f"{stack.config_path.name} decodes {settings.source.protocol!r}")
    for key, value in wl.codec.items():
        assert settings.source.codec.get(key) == value, f"the sample needs [source.codec] {key} = {value!r}"
    router = router_for(settings)
    targets = {table: router.route(workload.SCHEMA, table) for table in wl.expected}
    ignored = [t for t, dest in targets.items() if dest is None]
    assert not ignored, f"the config's routes ignore the sample's tables {workload.SCHEMA}.{ignored}"
    assert len(set(targets.values())) == len(targets), f"sample tables collide in the target: {targets}"
