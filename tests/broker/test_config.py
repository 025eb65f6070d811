"""Broker settings: defaults, server.properties syntax, --set overrides, and
refusals that name the setting, where it came from and how to fix it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from faultline.broker.config import LONG_MAX, SETTINGS, ConfigError, load_config, parse_properties


def load(tmp_path: Path, properties: str | None = None, overrides: list[str] | None = None,
         listen: str = "127.0.0.1:9092", node_id: int = 1):
    config_file = None
    if properties is not None:
        config_file = tmp_path / "server.properties"
        config_file.write_text(properties)
    return load_config(node_id, listen, tmp_path / "data", config_file, overrides)


def refusal(tmp_path: Path, **kwargs) -> str:
    with pytest.raises(ConfigError) as info:
        load(tmp_path, **kwargs)
    return str(info.value)


# --- defaults -------------------------------------------------------------------------------


def test_defaults_are_kafkas(tmp_path):
    config = load(tmp_path)
    assert config.node_id == 1
    assert (config.host, config.port) == ("127.0.0.1", 9092)
    assert config.data_dir == tmp_path / "data"
    assert config.advertised == ("127.0.0.1", 9092)
    expected = {
        "auto.create.topics.enable": True,
        "num.partitions": 1,
        "default.replication.factor": 1,
        "min.insync.replicas": 1,
        "log.segment.bytes": 1073741824,
        "log.index.interval.bytes": 4096,
        "log.flush.interval.messages": LONG_MAX,
        "log.flush.interval.ms": None,
        "log.flush.scheduler.interval.ms": LONG_MAX,
        "message.max.bytes": 1048588,
        "socket.request.max.bytes": 104857600,
        "log.message.timestamp.type": "CreateTime",
        "advertised.listeners": None,
        "producer.id.block.size": 1000,
        "zookeeper.connect": None,
        "zookeeper.session.timeout.ms": 18000,
        "replica.lag.time.max.ms": 30000,
        "replica.fetch.wait.max.ms": 500,
        "replica.fetch.min.bytes": 1,
        "replica.fetch.max.bytes": 1048576,
        "replica.fetch.backoff.ms": 1000,
        "replica.high.watermark.checkpoint.interval.ms": 5000,
        "unclean.leader.election.enable": False,
        "controlled.shutdown.enable": True,
        "controlled.shutdown.max.retries": 3,
        "controlled.shutdown.retry.backoff.ms": 5000,
        "faultline.truncation": "leader-epoch",
        "faultline.high.watermark.below.min.isr": False,
    }
    assert config.values == expected
    for name, value in expected.items():
        assert config[name] == value
    assert set(SETTINGS) == set(expected), "a setting was added without a default test"


def test_an_empty_file_gives_the_defaults(tmp_path):
    assert load(tmp_path, "").values == load(tmp_path).values


# --- server.properties syntax ---------------------------------------------------------------


def test_comments_and_blank_lines_are_skipped(tmp_path):
    config = load(tmp_path, "# a comment\n"
                            "! another comment\n"
                            "   # an indented comment: num.partitions=9\n"
                            "\n"
                            "   \n"
                            "\t! num.partitions=8\n"
                            "num.partitions=3\n")
    assert config["num.partitions"] == 3


def test_equals_colon_and_whitespace_separators(tmp_path):
    config = load(tmp_path, "num.partitions=3\n"
                            "min.insync.replicas : 2\n"
                            "log.segment.bytes 5000\n"
                            "message.max.bytes\t=\t7000\n"
                            "  log.index.interval.bytes:100\n"
                            "log.message.timestamp.type   LogAppendTime\n")
    assert config["num.partitions"] == 3
    assert config["min.insync.replicas"] == 2
    assert config["log.segment.bytes"] == 5000
    assert config["message.max.bytes"] == 7000
    assert config["log.index.interval.bytes"] == 100
    assert config["log.message.timestamp.type"] == "LogAppendTime"


def test_backslash_continues_a_line(tmp_path):
    config = load(tmp_path, "log.segment.bytes=10\\\n"
                            "      00\\\n"
                            "  0\n"
                            "num.partitions=4\n")
    assert config["log.segment.bytes"] == 10000
    assert config["num.partitions"] == 4


def test_an_even_number_of_backslashes_does_not_continue(tmp_path):
    parsed = parse_properties("advertised.listeners=host:1\\\\\nnum.partitions=2\n", "f")
    assert parsed["num.partitions"] == ("2", "f:2")
    # As in Java, the escaped backslash stands for one backslash.
    assert parsed["advertised.listeners"][0] == "host:1\\"


def test_escaped_separators_in_a_value_are_unescaped(tmp_path):
    # java.util.Properties.store writes ':' and '=' escaped, and Properties.load
    # reads `PLAINTEXT\://host\:19092` back as `PLAINTEXT://host:19092`.
    config = load(tmp_path, "advertised.listeners=PLAINTEXT\\://broker.example\\:19092\n")
    assert config["advertised.listeners"] == "PLAINTEXT://broker.example:19092"
    assert config.advertised == ("broker.example", 19092)


def test_later_lines_override_earlier_ones(tmp_path):
    config = load(tmp_path, "num.partitions=3\nnum.partitions=5\n")
    assert config["num.partitions"] == 5


def test_parse_properties_reports_where_each_value_came_from():
    text = "# header\nnum.partitions=3\n\nlog.segment.bytes=1\\\n  000\nnum.partitions=7\n"
    parsed = parse_properties(text, "server.properties")
    assert parsed == {
        "num.partitions": ("7", "server.properties:6"),
        "log.segment.bytes": ("1000", "server.properties:4"),
    }


def test_windows_line_endings(tmp_path):
    config = load(tmp_path, "num.partitions=3\r\nauto.create.topics.enable=false\r\n")
    assert config["num.partitions"] == 3
    assert config["auto.create.topics.enable"] is False


def test_values_are_typed(tmp_path):
    config = load(tmp_path, "auto.create.topics.enable=FALSE\n"
                            "log.flush.interval.ms=250\n"
                            "log.flush.interval.messages=1\n"
                            "advertised.listeners=PLAINTEXT://broker.example:19092\n")
    assert config["auto.create.topics.enable"] is False
    assert config["log.flush.interval.ms"] == 250
    assert config["log.flush.interval.messages"] == 1
    assert config.advertised == ("broker.example", 19092)
    assert load(tmp_path, "log.flush.interval.ms=null\n")["log.flush.interval.ms"] is None


def test_a_missing_file_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="cannot read the config file .*nope.properties"):
        load_config(1, "127.0.0.1:9092", tmp_path, tmp_path / "nope.properties")


# --- --set overrides ----------------------------------------------------------------------


def test_set_overrides_the_file(tmp_path):
    config = load(tmp_path, "num.partitions=3\nmin.insync.replicas=2\n",
                  overrides=["num.partitions=6", " log.segment.bytes = 4096 "])
    assert config["num.partitions"] == 6
    assert config["min.insync.replicas"] == 2  # from the file, not overridden
    assert config["log.segment.bytes"] == 4096


def test_the_last_set_wins(tmp_path):
    assert load(tmp_path, overrides=["num.partitions=2", "num.partitions=9"])["num.partitions"] == 9


def test_set_value_may_contain_equals_signs(tmp_path):
    config = load(tmp_path, overrides=["advertised.listeners=a=b:1"])
    assert config["advertised.listeners"] == "a=b:1"


@pytest.mark.parametrize("item", ["num.partitions", "=3", "  =3", ""])
def test_set_without_key_value_is_refused(tmp_path, item):
    message = refusal(tmp_path, overrides=[item])
    assert "--set" in message and "key=value" in message


# --- refusals ----------------------------------------------------------------------------------


def test_unknown_setting_in_the_file_names_it_and_its_line(tmp_path):
    message = refusal(tmp_path, properties="num.partitions=3\n# c\nlog.retention.hours=168\n")
    assert "log.retention.hours" in message
    assert f"{tmp_path / 'server.properties'}:3" in message
    assert "unknown setting" in message


def test_unknown_setting_after_a_continuation_names_its_first_line(tmp_path):
    message = refusal(tmp_path, properties="num.partitions=\\\n  3\ncompression.type=gzip\n")
    assert "server.properties:3" in message and "compression.type" in message


def test_unknown_setting_in_set_names_it_and_set(tmp_path):
    message = refusal(tmp_path, overrides=["num.partitions=2", "log.retention.ms=1000"])
    assert "log.retention.ms" in message
    assert message.startswith("--set")


@pytest.mark.parametrize("key, value", [
    ("num.partitions", "0"),
    ("num.partitions", "-1"),
    ("num.partitions", "three"),
    ("num.partitions", ""),
    ("num.partitions", "1.5"),
    ("log.message.timestamp.type", "Foo"),
    ("log.message.timestamp.type", "createtime"),
    ("auto.create.topics.enable", "maybe"),
    ("auto.create.topics.enable", "1"),
    ("default.replication.factor", "0"),
    ("faultline.truncation", "epoch"),
    ("unclean.leader.election.enable", "yes"),
    ("zookeeper.session.timeout.ms", "10"),
    ("log.segment.bytes", "13"),
    ("log.segment.bytes", str(2**31)),
    ("message.max.bytes", "-5"),
    ("log.flush.interval.messages", "0"),
    ("log.flush.interval.ms", "0"),
    ("producer.id.block.size", "0"),
    ("advertised.listeners", "no-port-here"),
    ("advertised.listeners", "a:1,b:2"),
])
@pytest.mark.parametrize("source", ["file", "set"])
def test_invalid_value_is_refused_naming_the_setting(tmp_path, key, value, source):
    if source == "file":
        message = refusal(tmp_path, properties=f"# first\n{key}={value}\n")
        where = "advertised.listeners" if key == "advertised.listeners" else "server.properties:2"
    else:
        message = refusal(tmp_path, overrides=[f"{key}={value}"])
        where = "advertised.listeners" if key == "advertised.listeners" else "--set"
    assert key in message
    assert where in message


@pytest.mark.parametrize("key, flag", [
    ("broker.id", "--node-id"),
    ("node.id", "--node-id"),
    ("listeners", "--listen"),
    ("log.dirs", "--data-dir"),
    ("log.dir", "--data-dir"),
])
def test_command_line_settings_in_the_file_point_to_the_flag(tmp_path, key, flag):
    message = refusal(tmp_path, properties=f"num.partitions=2\n{key}=1\n")
    assert key in message
    assert flag in message
    assert "server.properties:2" in message
    message = refusal(tmp_path, overrides=[f"{key}=1"])
    assert key in message and flag in message and "--set" in message


def test_the_first_bad_setting_is_reported_even_when_later_ones_are_fine(tmp_path):
    message = refusal(tmp_path, properties="bogus.one=1\nnum.partitions=2\n")
    assert "bogus.one" in message


# --- --listen and --node-id -------------------------------------------------------------------


@pytest.mark.parametrize("listen, expected", [
    ("127.0.0.1:9092", ("127.0.0.1", 9092)),
    ("PLAINTEXT://localhost:19092", ("localhost", 19092)),
    ("[::1]:9093", ("::1", 9093)),
    (":9094", ("0.0.0.0", 9094)),
    ("broker-1.example:1", ("broker-1.example", 1)),
    ("h:65535", ("h", 65535)),
])
def test_good_listen_values(tmp_path, listen, expected):
    config = load(tmp_path, listen=listen)
    assert (config.host, config.port) == expected
    assert config.advertised == expected


@pytest.mark.parametrize("listen", [
    "", "localhost", "localhost:", "localhost:0", "localhost:65536", "localhost:port",
    "localhost:-1", "127.0.0.1:9092,127.0.0.1:9093", "PLAINTEXT://", "9092",
])
def test_bad_listen_values_are_refused(tmp_path, listen):
    message = refusal(tmp_path, listen=listen)
    assert message.startswith("--listen")
    assert re.search(r"HOST:PORT", message)


def test_negative_node_id_is_refused(tmp_path):
    assert "--node-id" in refusal(tmp_path, node_id=-1)
    assert load(tmp_path, node_id=0).node_id == 0
