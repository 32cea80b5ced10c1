"""The CLI's contract with operators: exit codes, key-naming errors, secrets never printed."""

from __future__ import annotations


from applier.cli import EXIT_CONFIG, EXIT_TARGET, main
from tests.unit.helpers import CLI_CONF as GOOD, write_conf as write

def test_config_error_names_the_key_and_exits_2(tmp_path, capsys) -> None:
    cfg = write(tmp_path, GOOD.replace("protocol =", "protocl ="))
    assert main(["run", "-c", cfg]) == EXIT_CONFIG
    err = capsys.readouterr().err
    assert "source.protocl" in err and "did you mean 'protocol'" in err


def test_validate_masks_the_password(tmp_path, capsys) -> None:
    assert main(["validate", "-c", write(tmp_path, GOOD)]) == 0
    out = capsys.readouterr()
    assert "Sup3rS3cret" not in out.out + out.err


def test_unreachable_target_is_reported_without_the_password(tmp_path, capsys) -> None:
    assert main(["status", "-c", write(tmp_path, GOOD)]) == EXIT_TARGET
    err = capsys.readouterr().err
    assert "[target] url" in err and "Sup3rS3cret" not in err


def test_missing_java_exits_2_naming_the_install_command(tmp_path, capsys, monkeypatch) -> None:
    import applier.pipeline
    from applier.session import java_binary

    # the pipeline's first Spark step, without needing a target: the check it runs before starting the JVM
    monkeypatch.setattr(applier.pipeline, "run", lambda *a, **k: java_binary())
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert main(["run", "-c", write(tmp_path, GOOD)]) == EXIT_CONFIG
    err = capsys.readouterr().err
    assert err.startswith("setup error:") and "apt-get install -y openjdk-17-jre-headless" in err


def test_unreachable_kafka_exits_5_naming_the_servers_before_spark_starts(tmp_path, capsys) -> None:
    import socket
    import time

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))  # bound, not listening: connections are refused
        port = s.getsockname()[1]
        cfg = write(tmp_path, GOOD.replace("127.0.0.1:1\"\ntopics", f"127.0.0.1:{port}\"\ntopics"))
        t0 = time.monotonic()
        assert main(["run", "-c", cfg]) == EXIT_TARGET
    err = capsys.readouterr().err
    assert f"127.0.0.1:{port}" in err and "source.bootstrap_servers" in err and "refused" in err.lower()
    assert "Sup3rS3cret" not in err and time.monotonic() - t0 < 15


def test_java_cause_unwraps_to_the_innermost_exception() -> None:
    from applier.pipeline import java_cause

    class J:
        def __init__(self, text, cause=None):
            self.text, self.cause = text, cause

        def getCause(self):
            return self.cause

        def toString(self):
            return self.text

    class Py4J(Exception):
        java_exception = J("org.apache.kafka.common.KafkaException: failed",
                           J("org.apache.kafka.common.errors.SaslAuthenticationException: Authentication failed"))

    assert java_cause(Py4J("An error occurred while calling o46.listTopics.")) == \
        "org.apache.kafka.common.errors.SaslAuthenticationException: Authentication failed"
    assert java_cause(ValueError("plain\nmore")) == "plain"


def test_a_run_stopped_by_a_signal_prints_one_line_and_exits_128_plus_its_number(tmp_path, capsys,
                                                                                  monkeypatch) -> None:
    import signal

    import applier.pipeline
    from applier.processor import BatchReport

    res = applier.pipeline.RunResult(3, BatchReport(applied_ts=42), signal=signal.SIGTERM)
    monkeypatch.setattr(applier.pipeline, "run", lambda *a, **k: res)
    assert main(["run", "-c", write(tmp_path, GOOD)]) == 128 + signal.SIGTERM
    out = capsys.readouterr()
    assert out.out == ""
    # the target (unreachable here) is asked first; this run's own applied ts stands in for it
    assert out.err.splitlines() == ["stopping on SIGTERM: progress is committed up to applied ts 42 "
                                    "(applier_pipelines.applied_ts), after 3 micro-batch(es) in this run; run again "
                                    "to go on"]


def test_a_second_run_says_the_pipeline_is_running_whatever_the_metrics_port(tmp_path, capsys) -> None:
    """The per-pipeline lock comes before the metrics endpoint: a second run used to stop with "Address already
    in use" (exit 2), naming no running pipeline."""
    import fcntl
    import socket

    with socket.socket() as broker, socket.socket() as metrics:
        broker.bind(("127.0.0.1", 0))
        broker.listen()  # a "Kafka" that accepts connections: the run gets as far as it can without one
        metrics.bind(("127.0.0.1", 0))
        metrics.listen()  # the running pipeline's metrics port
        text = GOOD.replace('"127.0.0.1:1"\ntopics', f'"127.0.0.1:{broker.getsockname()[1]}"\ntopics')
        cfg = write(tmp_path, text + f"[metrics]\nport = {metrics.getsockname()[1]}\n")
        lock = tmp_path / "ck" / "applier.lock"
        lock.parent.mkdir(parents=True)
        with open(lock, "a+") as held:
            fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)  # the running pipeline holds it
            held.write("pid 4242, started 2026-01-01 00:00:00 +0000")
            held.flush()
            assert main(["run", "-c", cfg]) == 1
    err = capsys.readouterr().err
    assert "pipeline p is already running on this host (pid 4242, started 2026-01-01 00:00:00 +0000)" in err
    assert "Address already in use" not in err and "cannot serve metrics" not in err


def test_a_message_the_upstream_tidb_cannot_complete_exits_5_with_its_own_reason(tmp_path, capsys,
                                                                                 monkeypatch) -> None:
    """A handle-key-only row TiDB cannot serve (its GC passed the ts, or it is unreachable) is no fault of the
    message: exit 5 with the reason's own fix, not exit 3 with advice about the protocol; a malformed message
    still exits 3."""
    import applier.pipeline
    from applier.cli import EXIT_DECODE
    from applier.events import DecodeError, SourcePosition

    def fail(upstream: bool):
        def run(*a, **k):
            raise DecodeError(SourcePosition("t", 0, 7), "the new row of `s`.`t`: TiDB's GC has passed ...",
                              protocol="canal-json", upstream=upstream)
        return run

    monkeypatch.setattr(applier.pipeline, "run", fail(True))
    assert main(["run", "-c", write(tmp_path, GOOD)]) == EXIT_TARGET
    err = capsys.readouterr().err
    assert "TiDB's GC has passed" in err and "source.protocol must match" not in err
    monkeypatch.setattr(applier.pipeline, "run", fail(False))
    assert main(["run", "-c", write(tmp_path, GOOD)]) == EXIT_DECODE
    assert "source.protocol must match" in capsys.readouterr().err
