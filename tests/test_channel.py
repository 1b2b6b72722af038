"""The channel every cross-thread hand-off goes through: order, capacity, failure and closing."""

import threading
import time

import pytest

from neutronorch.orchestration.channel import Channel, Closed


def test_items_are_taken_by_key_whatever_the_order_they_arrive_in():
    channel = Channel("test")
    channel.put(2, "b")
    channel.put(1, "a")
    assert channel.take(1) == "a" and channel.take(2, remove=False) == "b" and len(channel) == 1


def test_a_bounded_channel_holds_its_producer_back():
    channel = Channel("test", capacity=2)
    put = []

    def produce():
        for i in range(5):
            channel.put(i, i)
            put.append(i)

    thread = threading.Thread(target=produce)
    thread.start()
    deadline = time.monotonic() + 10
    while len(put) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.2)
    assert put == [0, 1]  # the third put waits for room
    assert [channel.take(i) for i in range(5)] == list(range(5))
    thread.join(5)
    assert put == list(range(5))


def test_a_failure_arrives_after_the_items_put_before_it():
    channel = Channel("test")
    channel.put(0, "first")
    channel.fail(ValueError("stage broke"))
    assert channel.take(0) == "first"
    with pytest.raises(ValueError, match="stage broke"):
        channel.take(1)


def test_closing_wakes_producers_and_consumers_and_returns_what_was_left():
    channel = Channel("test", capacity=1)
    channel.put(0, "left")
    outcomes = []

    def wait(action):
        try:
            action()
        except Closed:
            outcomes.append("closed")

    threads = [threading.Thread(target=wait, args=(lambda: channel.put(1, "more"),)),
               threading.Thread(target=wait, args=(lambda: channel.take(7),))]
    for t in threads:
        t.start()
    time.sleep(0.1)
    assert channel.close() == ["left"]
    for t in threads:
        t.join(5)
    assert outcomes == ["closed", "closed"]
    with pytest.raises(Closed):
        channel.put(2, "late")
