"""Rows grouped by an integer key: the distinct keys of a chunk and which one each row has.

The analytic tier computes what depends only on a few of a row's columns once
per distinct value of those columns (``kernels.layer_costs``: one layer's
costs; ``kernels.training``: the step's DP sync and optimizer) and hands every
row its group's result. ``group_rows`` finds the groups with an open-addressing
hash table in one pass over the key rows, O(rows) whatever their order; rows
that repeat the previous row's key (the encoder's inner dimensions mostly leave
a key alone) skip the table.
"""

from __future__ import annotations

import numpy as np

from paraspace.kernels.jit import jit

#: an odd multiplier below 2**20 per key column (a key has at most this many
#: columns): with key values below 2**31 the sum of the products stays below
#: 2**55, so hashing never overflows int64 (with NUMBA_DISABLE_JIT either)
_MIX = np.array([0xEB923, 0x8CAAB, 0x68F01, 0xC9BE5, 0xE6C13, 0x75EB1, 0x864F1, 0x4FE21,
                 0xF8A0F, 0xFA323, 0xC5745, 0xAC463, 0xACD63, 0xBBB5B, 0xCDF53, 0xAEC27], dtype=np.int64)
MAX_KEY_COLUMNS = _MIX.shape[0]


@jit(inline=True)
def key_hash(keys, i: int, mix) -> int:
    """A hash of key row ``i``: each column times its own odd multiplier, summed
    (independent multiplies), the high bits folded onto the low ones that pick
    the slot."""
    h = np.int64(0)
    for j in range(keys.shape[1]):
        h += np.int64(keys[i, j]) * mix[j]
    h ^= h >> 29
    h ^= h >> 13
    return h


@jit(inline=True)
def same_key(keys, i: int, other, j: int) -> bool:
    """Key row ``i`` of ``keys`` equals row ``j`` of ``other``."""
    for c in range(keys.shape[1]):
        if keys[i, c] != other[j, c]:
            return False
    return True


@jit
def grown_table(slots, hashes, group_keys):
    """The open-addressing table (``slots``: group or -1; ``hashes``: each slot's
    key hash) re-placed into twice as many slots, and room for twice as many
    group keys."""
    size = 2 * slots.shape[0]
    new_slots = np.full(size, -1, dtype=np.int64)
    new_hashes = np.zeros(size, dtype=np.int64)
    for s in range(slots.shape[0]):
        if slots[s] >= 0:
            t = hashes[s] & (size - 1)
            while new_slots[t] >= 0:
                t = (t + 1) & (size - 1)
            new_slots[t] = slots[s]
            new_hashes[t] = hashes[s]
    new_keys = np.empty((size // 2, group_keys.shape[1]), dtype=group_keys.dtype)
    new_keys[: group_keys.shape[0]] = group_keys
    return new_slots, new_hashes, new_keys


@jit
def place_rows(keys, start: int, n_groups: int, group, first, group_keys, slots, hashes, mix):
    """Group rows ``start``, ``start`` + 1, ... into the table (a new key becomes
    group ``n_groups``, its key kept in ``group_keys``) until the rows end or a new
    key finds ``group_keys`` full; returns (the row to continue at, groups).
    The table has twice as many slots as ``group_keys`` rows: at most half full,
    so probes stay short."""
    n = keys.shape[0]
    mask = slots.shape[0] - 1
    for i in range(start, n):
        if i > 0 and same_key(keys, i, keys, i - 1):
            group[i] = group[i - 1]
            continue
        h = key_hash(keys, i, mix)
        s = h & mask
        found = -1
        while slots[s] >= 0:
            g = slots[s]
            if hashes[s] == h and same_key(keys, i, group_keys, g):
                found = g
                break
            s = (s + 1) & mask
        if found < 0:
            if n_groups == group_keys.shape[0]:
                return i, n_groups
            found = n_groups
            for c in range(keys.shape[1]):
                group_keys[found, c] = keys[i, c]
            first[found] = i
            n_groups += 1
            slots[s] = found
            hashes[s] = h
        group[i] = found
    return n, n_groups


@jit
def group_rows(keys):
    """(each row's group, each group's first row) of the (rows, columns) integer
    array ``keys``; groups are numbered in the order of their first row. Each
    group's key is kept in a small array of its own, so that probing compares
    against memory in cache, not against rows scattered over ``keys``."""
    n = keys.shape[0]
    if keys.shape[1] > _MIX.shape[0]:
        raise ValueError("group_rows: a key has at most MAX_KEY_COLUMNS columns")
    group = np.empty(n, dtype=np.int64)
    first = np.empty(n, dtype=np.int64)
    slots = np.full(64, -1, dtype=np.int64)
    hashes = np.zeros(64, dtype=np.int64)
    group_keys = np.empty((32, keys.shape[1]), dtype=keys.dtype)
    i = 0
    n_groups = 0
    while True:
        # the table and the group keys are grown out here: an array replaced inside
        # the row loop would cost reference counting on every row
        i, n_groups = place_rows(keys, i, n_groups, group, first, group_keys, slots, hashes, _MIX)
        if i == n:
            return group, first[:n_groups].copy()
        slots, hashes, group_keys = grown_table(slots, hashes, group_keys)
