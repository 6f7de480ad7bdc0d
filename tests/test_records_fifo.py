"""The device first-in-first-out key -> slot map (``radix/records/fifo.py``) against a Python dict model, through
random assignments (wrapping or not) and invalidations, and its launch count."""

from __future__ import annotations

import random

import torch

from sglang_replayssm.radix.records import fifo
from tests.support.launch_count import OpCounter


def test_the_map_follows_a_dict_through_random_assignments_and_invalidations():
    rng = random.Random(3)
    keys_n, capacity = 40, 9
    index = torch.full((keys_n + 1,), -1, dtype=torch.int64)
    owner = fifo.unassigned_owner(capacity, keys_n, torch.device("cpu"))
    iota = torch.arange(capacity)
    head, model, holder = 0, {}, {}  # key -> slot; slot -> key it was last given to
    for step in range(400):  # noqa: B007 - the step names a failure
        if rng.random() < 0.3:
            dropped = rng.sample(range(keys_n), rng.randint(1, 5))
            index.index_fill_(0, torch.tensor(dropped), -1)  # what invalidation does
            for k in dropped:
                model.pop(k, None)
            continue
        keys = rng.sample(range(keys_n), rng.randint(1, capacity))
        for i, k in enumerate(keys):
            slot = (head + i) % capacity
            previous = holder.get(slot)
            if previous is not None and model.get(previous) == slot:
                del model[previous]
            model[k], holder[slot] = slot, k
        new_head = fifo.assign(index, owner, iota, head, torch.tensor(keys))
        assert new_head == (head + len(keys)) % capacity
        head = new_head
        assert index[:keys_n].tolist() == [model.get(k, -1) for k in range(keys_n)], step
        assert index[keys_n] == -1


def test_a_key_given_a_new_slot_keeps_it_when_its_old_slot_is_taken():
    index = torch.full((11,), -1, dtype=torch.int64)
    owner, iota = fifo.unassigned_owner(4, 10, torch.device("cpu")), torch.arange(4)
    head = fifo.assign(index, owner, iota, 0, torch.tensor([5, 6]))  # slots 0, 1
    index.index_fill_(0, torch.tensor([5]), -1)  # 5 is allocated anew ...
    head = fifo.assign(index, owner, iota, head, torch.tensor([5, 7]))  # ... and gets slot 2
    assert index[5] == 2 and index[6] == 1 and head == 0
    head = fifo.assign(index, owner, iota, head, torch.tensor([1, 2]))  # slots 0 (5's old one), 1 (6's)
    assert head == 2 and index[5] == 2 and index[6] == -1 and index[7] == 3
    assert index[[1, 2]].tolist() == [0, 1]


def test_an_assignment_that_does_not_wrap_launches_six_ops():
    index = torch.full((101,), -1, dtype=torch.int64)
    owner, iota = fifo.unassigned_owner(50, 100, torch.device("cpu")), torch.arange(50)
    keys = torch.arange(10, 30)
    counter = OpCounter()
    with counter:
        head = fifo.assign(index, owner, iota, 5, keys)
    assert head == 25 and counter.total() == 6, dict(counter.launches)
