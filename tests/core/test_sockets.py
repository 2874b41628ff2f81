"""The kernel's per-connection byte counts (``ss -tinpe``) read for a job's processes: only
connections to the outside count, and only bytes that arrived between two readings."""

from __future__ import annotations

from feedbench.core.sockets import _connections, arrived, outside

SS = """\
0      0      127.0.0.1:40000     127.0.0.1:9000 users:(("python",pid=11,fd=5)) ino:101 sk:1 <->
\t ts sack cubic wscale:7,7 rto:204 bytes_sent:120 bytes_acked:121 bytes_received:5000 segs_out:4
0      0      127.0.0.1:40001     127.0.0.1:29500 users:(("python",pid=11,fd=6)) ino:102 sk:2 <->
\t ts sack cubic bytes_sent:10 bytes_received:777 segs_out:2
0      0      127.0.0.1:29500     127.0.0.1:40001 users:(("python",pid=12,fd=7)) ino:103 sk:3 <->
\t ts sack cubic bytes_sent:777 bytes_received:10 segs_out:2
0      0      127.0.0.1:40002     10.0.0.5:443 users:(("pt_data_worker",pid=13,fd=9),("python",pid=11,fd=9)) ino:104 sk:4 <->
\t ts sack cubic bytes_received:42 segs_out:1
0      0      127.0.0.1:50000     127.0.0.1:9000 users:(("other",pid=99,fd=3)) ino:105 sk:5 <->
\t ts sack cubic bytes_received:123456 segs_out:9
"""  # noqa: E501 (ss's own lines)


def test_each_connection_by_inode_with_its_owners_and_bytes_received():
    found = _connections(SS)
    assert sorted(found) == [101, 102, 103, 104, 105]
    assert found[101].owners == {11} and found[101].received == 5000
    assert (found[101].local, found[101].peer) == ("127.0.0.1:40000", "127.0.0.1:9000")
    assert found[104].owners == {11, 13} and found[104].received == 42  # a forked worker too


def test_bytes_arrived_between_two_readings():
    assert arrived({101: 5000, 104: 42}, {101: 5000, 104: 42}) == 0  # nothing moved: stopped
    assert arrived({101: 5000}, {101: 6024}) == 1024
    assert arrived({101: 5000, 102: 9}, {101: 5000, 106: 300}) == 300  # a new connection's all


def test_only_connections_to_the_outside_count():
    found = _connections(SS)
    # 11 and 12 are one job: their store connection (40001 <-> 29500) is left out both ways
    assert outside(found, [11, 12]) == {101: 5000, 104: 42}
    assert outside(found, [13]) == {104: 42}  # a worker sharing its parent's socket
    assert outside(found, [11], inside=[12]) == {101: 5000, 104: 42}
    assert outside(found, [11]) == {101: 5000, 102: 777, 104: 42}  # 12 not known: outside
    assert outside(found, [42]) == {}
