"""Rank 0's store for the trainer ranks and the weight broadcast: it listens on the address the
cluster gives the node, on a port no other process can take between its choice and its use."""

import datetime
import socket
import threading

import pytest
import torch.distributed as dist

from nostall.runtime.distributed import open_store


def test_the_store_holds_its_port_from_the_moment_it_is_chosen():
    store = open_store("127.0.0.1", 2)
    with socket.socket() as other:  # another process's try at the same port
        with pytest.raises(OSError):
            other.bind(("127.0.0.1", store.port))
    joined = []

    def rank_1():
        client = dist.TCPStore("127.0.0.1", store.port, 2, False, datetime.timedelta(seconds=30))
        client.set("rank 1", "here")
        joined.append(client.get("rank 0").decode())

    thread = threading.Thread(target=rank_1)
    thread.start()
    store.set("rank 0", "here")
    assert store.get("rank 1") == b"here"
    thread.join(30)
    assert joined == ["here"]


def test_an_address_this_node_does_not_have_is_named():
    with pytest.raises(RuntimeError, match=r"cannot listen on 192\.0\.2\.1 \(this node's cluster"):
        open_store("192.0.2.1", 2)  # TEST-NET-1: never a local address
