"""Names and subnets of the local backend, without touching the host."""

from __future__ import annotations

import ipaddress

from faultline.control.names import (BRIDGE_RE, IFNAMSIZ, NAMESPACE_RE, VETH_RE, bridge_name, choose_subnet,
                                     namespace_name, tag_for, veth_name)


def test_a_short_run_id_is_the_tag_and_a_long_one_is_hashed():
    assert tag_for("a1b2c3") == "a1b2c3"
    long = tag_for("queue-2026-01-01T00:00:00")
    assert long == tag_for("queue-2026-01-01T00:00:00") and len(long) == 8 and long.isalnum()


def test_names_fit_and_parse_back_unambiguously():
    for tag in ("b", "bbbbbbbb", "n1n1n1n1", "a0"):
        for index in (1, 9, 200):
            veth = veth_name(tag, index)
            assert len(veth) <= IFNAMSIZ and VETH_RE.match(veth).groups() == (tag, str(index))
        assert len(bridge_name(tag)) <= IFNAMSIZ and BRIDGE_RE.match(bridge_name(tag))[1] == tag
        assert NAMESPACE_RE.match(namespace_name(tag, "n-1.x")).groups() == (tag, "n-1.x")
    for stranger in ("flannel.1", "flb", "fl", "faultline-x", "faultlinex-a-n1", "docker0", "flABCn1"):
        assert not (VETH_RE.match(stranger) or BRIDGE_RE.match(stranger) or NAMESPACE_RE.match(stranger))


def test_subnet_is_stable_per_tag_and_skips_taken_networks():
    first = choose_subnet("abc123", [])
    assert first == choose_subnet("abc123", []) and first.prefixlen == 24
    assert int(str(first.network_address).split(".")[1]) >= 200
    # A host route covering it, or another run holding it, pushes the choice on.
    assert not choose_subnet("abc123", [first]).overlaps(first)
    wide = ipaddress.ip_network(f"{first.network_address}/16", strict=False)
    assert not choose_subnet("abc123", [wide]).overlaps(wide)
