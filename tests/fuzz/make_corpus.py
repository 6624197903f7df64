#!/usr/bin/env python3
"""Writes the seed corpus of the fuzz harnesses into tests/fuzz/corpus/.

Seeds are small valid inputs in each harness's input format (see the
comment at the top of each *_fuzzer.cc), so that fuzzing starts from
requests the code accepts. Protobufs are encoded by hand (field numbers from
proto/*.proto), so this needs nothing but Python. Re-run after changing a
harness's input format: python3 tests/fuzz/make_corpus.py
"""
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))


def varint(v):
    out = bytearray()
    v &= (1 << 64) - 1
    while True:
        b = v & 0x7F
        v >>= 7
        out.append(b | (0x80 if v else 0))
        if not v:
            return bytes(out)


def field(num, value):
    """A varint field (int) or a length-delimited one (bytes/str)."""
    if isinstance(value, int):
        return varint(num << 3) + varint(value)
    if isinstance(value, str):
        value = value.encode()
    return varint(num << 3 | 2) + varint(len(value)) + value


def msg(*fields):
    return b"".join(field(n, v) for n, v in fields)


def u16(v):
    return struct.pack("<H", v)


def lv(b):  # the harnesses' [u16 length][bytes] field
    return u16(len(b)) + b


def floats(*xs):
    return struct.pack("<%df" % len(xs), *xs)


def write(target, name, data):
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


# DataHeader: 1 protocol_version, 2 op, 3 request_id, 4 worker_rank,
# 5 partition_id, 6 round, 7 epoch, 8 num_elements, 9 dtype, 14 codec.
INIT, PUSH, PULL, PUSH_PULL = 1, 2, 3, 4


def header(op, rank, rid, rnd, n, codec=None):
    f = [(1, 1), (2, op), (3, rid), (4, rank), (5, 5), (6, rnd), (7, 3), (8, n), (9, 1)]
    if codec:
        f.append((14, codec))
    return msg(*f)


def request(op, rank, rid, rnd, values):
    """A raw-header request (kind 2: raw header, with a payload)."""
    return bytes([2]) + lv(header(op, rank, rid, rnd, len(values))) + lv(floats(*values))


def pull(rank, rid, rnd, n):
    return bytes([0]) + lv(header(PULL, rank, rid, rnd, n)) + lv(b"")


def data_plane():
    w = [1.0, 2.0, 3.0, 4.0]
    g = [0.5, -0.5, 0.25, 0.0]
    for variant, name in [(0x00, "sync"), (0x01, "async"), (0x02, "sync_deterministic"),
                          (0x04, "sum_only"), (0x80, "sync_replicated"), (0x81, "async_replicated")]:
        seq = bytes([variant, 3])  # n = 4
        seq += request(INIT, 0, 1, 0, w)
        seq += request(PUSH, 0, 2, 0, g) + request(PUSH_PULL, 1, 1, 0, g)
        seq += pull(0, 3, 1, 4)
        write("data_plane", name, seq)
    # Compressed pushes: fp16 (variant bits 3-5 = 1) with 4 halves.
    seq = bytes([0x08, 3]) + request(INIT, 0, 1, 0, w)
    seq += bytes([2]) + lv(header(PUSH, 0, 2, 0, 4, "fp16")) + lv(struct.pack("<4e", 0.5, -0.5, 0.25, 0))
    write("data_plane", "sync_fp16", seq)
    # Built headers (kind 1|2): fields chosen by the harness.
    built = bytes([0x01, 3, 3, 0, INIT - 1, 0, 1, 0, 4]) + lv(floats(*w))
    built += bytes([3, 0, PUSH - 1, 1, 2, 0, 4]) + lv(floats(*g))
    write("data_plane", "built_headers", built)
    # Payloads at odd addresses (kind bit 4), as ZeroMQ may hand them over.
    write("data_plane", "misaligned_payloads", bytes([0, 3]) + request(INIT, 0, 1, 0, w) +
          bytes([6]) + lv(header(PUSH, 0, 2, 0, 4)) + lv(floats(*g)) +
          bytes([6]) + lv(header(PUSH_PULL, 1, 1, 0, 4)) + lv(floats(*g)))
    # A membership change (kind 15) between rounds.
    write("data_plane", "membership", bytes([0, 3]) + request(INIT, 0, 1, 0, w) + bytes([15, 2]) +
          request(PUSH, 0, 2, 0, g))


def codec():
    n = 8
    x = floats(0.5, -1.0, 0.0, 2.0, -0.25, 1e-3, 3.0, -3.0)
    # Codec index (CodecNames order), params byte, u16 n, u64 seed, payload.
    for i in range(7):
        write("codec", "codec%d_floats" % i, bytes([i, 0x21]) + u16(n) + struct.pack("<Q", 7) + x)
        write("codec", "codec%d_empty" % i, bytes([i, 0x05]) + u16(0) + struct.pack("<Q", 1))


def config():
    write("config", "minimal", b"consistency: SYNC\nnum_servers: 2\nnum_workers: 2\n")
    write("config", "full", b"""consistency: ASYNC
num_servers: 3
num_workers: 4
partition_bytes: 65536
replication: 2
optimizer { kind: ADAM learning_rate: 0.001 }
compression { codec: "topk:ratio=0.1" pull_codec: "fp16" }
""")
    write("config", "sum_only", b"consistency: SYNC\nnum_servers: 1\nnum_workers: 2\nupdate_mode: SUM_ONLY\n"
          b"compression { codec: \"2bit:threshold=0.5\" }\n")
    write("config", "overrides", b"consistency: SYNC\nnum_servers: 1\nnum_workers: 1\n\0"
          b"optimizer.learning_rate=0.5\nconsistency=async\nnum_workers=3")
    write("config", "checkpoint", b"consistency: SYNC\nnum_servers: 2\nnum_workers: 2\n"
          b"checkpoint { dir: \"/tmp/ckpt\" every_rounds: 10 }\n")


def scheduler():
    SERVER, WORKER = 1, 2
    reg_s = msg((1, 1), (2, SERVER), (4, "tcp://127.0.0.1:7001"), (5, "host-a"))
    reg_w = msg((1, 1), (2, WORKER), (3, 0), (5, "host-b"))
    tensor = msg((1, "w"), (2, 3), (2, 4), (3, 1))  # TensorSpec name, shape [3, 4], float32
    define = msg((1, 2), (2, tensor))
    heartbeat = msg((1, 1), (2, 1), (3, 0))
    barrier = msg((1, 2), (2, "init"))
    call = lambda method, body: bytes([method]) + lv(body)
    write("scheduler", "rendezvous", bytes([0]) + call(0, reg_s) + call(0, reg_w) + call(2, define) +
          call(1, heartbeat) + call(3, barrier) + call(4, b""))
    write("scheduler", "checkpoint", bytes([0]) + call(0, reg_s) + call(0, reg_w) + call(2, define) +
          call(5, msg((1, "/tmp/ckpt"))) + call(4, b""))
    write("scheduler", "liveness", bytes([0x06]) + call(0, reg_s) + call(0, reg_w) + bytes([0xff]) +
          call(1, heartbeat) + call(4, b""))


def sealed():
    hdr = header(2, 0, 1, 0, 4)
    body = floats(1, 2, 3, 4)
    genuine = lambda kind: bytes([kind]) + lv(hdr) + lv(body)
    write("sealed", "genuine", genuine(1) + genuine(1 | 4) + genuine(1))
    write("sealed", "replay", genuine(1 | 8) + genuine(1 | 8) + bytes([3, 1, 3, 0, 3, 1]))
    write("sealed", "tampered", genuine(2) + u16(7) + bytes([0x10]) + genuine(2) + u16(3) + bytes([1]))
    write("sealed", "raw", bytes([0]) + lv(bytes(80)) + lv(body) + bytes([4]) + lv(bytes(5)) + lv(b""))


# replica_fuzzer.cc's requests. Kinds: 0 a replica update, 11 a worker's
# request, 14 confirmations, 15 a new map. A replica update's kind index
# (bits 3-5): 0 PUSH, 2 PUSH_PULL (forwarded), 4 INIT, 5 SNAPSHOT; payload
# modes: 0 n floats, 2 encoded in the round's push codec, 4 a snapshot.
R_PUSH, R_FORWARDED, R_INIT, R_SNAPSHOT = 0, 2, 4, 5


def replica_update(kind, n, rnd=0, rank=0, rrid=0, contributors=0, summed=(), batch=(), mode=0, tail=None):
    lists = len(summed) | len(batch) << 2 | 1 << 5  # lr_scale 1
    out = bytes([0, kind << 3, 3, rnd, rank, rrid, contributors, lists]) + bytes(summed)
    for w, rid in batch:
        out += bytes([w, rid])
    out += bytes([mode])
    return out + (tail if tail is not None else values(n))


def worker_request(op_index, rank, rid, rnd, n):
    return bytes([11, op_index, rank, rid, rnd]) + values(n, 5)


def values(n, step=7):
    """The input bytes of n values: the harness reads at most 64 and mixes the rest."""
    return bytes((i * step) % 64 for i in range(min(n, 64)))


def n_byte(n):
    """n as the harness reads it: bit 6 a partition of 1024 + 8k elements (large enough for a codec)."""
    return 0x40 | (n - 1024) // 8 if n >= 1024 else n - 1


def replica():
    n = 4
    # Sync, raw, SGD: INIT, two rounds' sums, promotion (map kind 1), a worker's push and pull.
    seq = bytes([0x00, 0x00, n - 1]) + replica_update(R_INIT, n)
    seq += replica_update(R_PUSH, n, 0, contributors=2) + replica_update(R_PUSH, n, 0, contributors=2)
    seq += bytes([15, 1]) + worker_request(1, 0, 1, 0, n) + worker_request(3, 1, 1, 0, n) + bytes([14, 3])
    write("replica", "sync_rounds", seq)
    # Sync 2bit (codec 2): forwarded pushes, a round summed from them, promotion mid-round.
    n = 1024
    seq = bytes([0x40, 0x00, n_byte(n)]) + replica_update(R_INIT, n)
    seq += replica_update(R_FORWARDED, n, 0, 0, 1, mode=2) + replica_update(R_FORWARDED, n, 0, 1, 2, mode=2)
    seq += replica_update(R_PUSH, n, 0, contributors=2, summed=(1, 0), mode=6, tail=b"")
    seq += replica_update(R_FORWARDED, n, 0, 0, 3, mode=2) + bytes([15, 2]) + worker_request(1, 1, 4, 0, n)
    write("replica", "sync_2bit_forwarded", seq)
    # SSP in rounds (staleness 1), topk (codec 4), Adam: forwarded pushes ahead, then promotion.
    seq = bytes([0x81 | 0x08, 0x00, n_byte(n)]) + replica_update(R_INIT, n)
    for rnd in (0, 1):
        for w in (0, 1):
            seq += replica_update(R_FORWARDED, n, rnd, w, 1 + rnd, mode=2)
    seq += replica_update(R_PUSH, n, 0, contributors=2) + bytes([15, 1]) + worker_request(0, 0, 3, 0, n)
    write("replica", "ssp_rounds_forwarded", seq)
    # Async: an INIT and batches of pushes; SSP on arrival the same.
    n = 4
    for variant, name in [(0x03, "async_batches"), (0x02, "ssp_arrival_batches")]:
        seq = bytes([variant, 0x00, n - 1]) + replica_update(R_INIT, n)
        seq += replica_update(R_PUSH, n, 0, contributors=1, batch=[(0, 1)])
        seq += replica_update(R_PUSH, n, 0, contributors=2, batch=[(0, 2), (1, 1)])
        seq += bytes([15, 1]) + worker_request(0, 1, 2, 0, n)
        write("replica", name, seq)
    # A re-created copy (variant2 bit 3) of a sync, sum-only, 2bit with pull codec partition:
    # refused updates before its snapshot (weights, aggregate, ids, digests and rejoins, INIT flag, feedback, answer).
    n = 1024
    snapshot = values(2 * n) + bytes(9) + bytes([1]) + values(n) + lv(b"")
    seq = bytes([0x50, 0x09, n_byte(n)]) + replica_update(R_PUSH, n, 0, contributors=2)
    seq += replica_update(R_SNAPSHOT, n, 0, mode=4, tail=snapshot) + replica_update(R_PUSH, n, 0, contributors=2)
    write("replica", "snapshot_sum_only", seq)
    # Three servers (variant2 bit 1): server 0 dies and server 2 takes over; then this copy
    # is promoted and server 2 re-created (its snapshot goes out).
    n = 8
    seq = bytes([0x00, 0x02, n - 1]) + replica_update(R_INIT, n) + bytes([15, 4])
    seq += replica_update(R_PUSH, n, 0, contributors=2) + bytes([15, 5]) + worker_request(1, 0, 1, 1, n)
    seq += bytes([14, 3])
    write("replica", "three_servers", seq)
    pair(0x00, 0x00, 4, "pair_sync")
    pair(0x40, 0x00, 1024, "pair_sync_2bit")
    pair(0x44, 0x00, 1024, "pair_sync_2bit_deterministic")
    pair(0x89, 0x00, 1024, "pair_ssp_rounds_topk_adam")
    pair(0x50, 0x01, 1024, "pair_sum_only_2bit_pull")
    pair(0x20, 0x01, 1024, "pair_sync_fp16_pull")
    pair(0x03, 0x00, 4, "pair_async")
    # Async pushes batched (bit 7 opens and closes a batch): applied as one update.
    write("replica", "pair_async_batch", bytes([0x03, 0x00, 0x83]) + pair_push(0, 4, init=True) + bytes([4, 7]) +
          bytes([0x80]) + bytes(4) + bytes([0x88]) + bytes(4) + bytes([4, 7]))
    pair(0x02, 0x04, 4, "pair_ssp_arrival")
    # The backup's copy dropped in maps only the primary installs (map 4), rounds it misses, then
    # given back (map 3): the backup makes its copy anew from the primary's snapshot; once, the
    # primary dies before that snapshot arrives (map 5); once, both servers skip the maps that
    # drop the copy and give it back (map 0x44).
    for variant, name, end in [(0x00, "pair_sync_copy_given_back", b""), (0x03, "pair_async_copy_given_back", b""),
                               (0x89, "pair_ssp_rounds_adam_copy_given_back", b""),
                               (0x00, "pair_sync_copy_given_back_primary_dies", bytes([7, 5])),
                               (0x00, "pair_sync_copy_given_back_both_skipped", bytes([7, 0x44]))]:
        n = 1024 if variant & 0x80 else 4
        seq = bytes([variant, 0x00, 0x80 | n_byte(n)]) + pair_push(0, n, init=True) + bytes([4, 7])
        seq += pair_push(0, n) + pair_push(1, n) + bytes([4, 7]) + bytes([7, 4])
        seq += pair_push(0, n) + pair_push(1, n) + bytes([4, 7]) + bytes([7, 3]) + end
        seq += pair_push(0, n) + pair_push(1, n) + bytes([4, 7]) * 3
        seq += pair_push(0, n, retry=True) + pair_push(1, n, retry=True) + bytes([4, 7]) * 2
        write("replica", name, seq)
    # A worker removed and rejoined in one map (0x9c: the servers skipped its removal) while
    # the round waits for it.
    n = 4
    seq = bytes([0x00, 0x00, 0x80 | n_byte(n)]) + pair_push(0, n, init=True) + bytes([4, 7])
    seq += pair_push(0, n) + pair_push(1, n) + bytes([4, 7]) + pair_push(0, n) + bytes([4, 7])
    seq += bytes([7, 0x9c]) + bytes([4, 7]) * 2 + pair_push(0, n) + bytes([4, 7]) * 2
    seq += pair_push(1, n) + pair_push(0, n) + bytes([4, 7]) * 2
    write("replica", "pair_sync_worker_removed_and_rejoined_in_one_map", seq)
    # This server's backup copy given back in maps it skipped (map byte bit 6), then its snapshot.
    n = 1024
    snapshot = values(2 * n) + bytes(9) + bytes([1]) + values(n) + lv(b"")
    seq = bytes([0x50, 0x01, n_byte(n)]) + replica_update(R_INIT, n) + replica_update(R_PUSH, n, 0, contributors=2)
    seq += bytes([15, 0x40]) + replica_update(R_PUSH, n, 1, contributors=2)
    seq += replica_update(R_SNAPSHOT, n, 1, mode=4, tail=snapshot) + replica_update(R_PUSH, n, 1, contributors=2)
    write("replica", "copy_given_back", seq)


# Pair mode (n byte bit 7): a real primary and backup. Kinds: bits 0-2 < 4 a
# worker's push (bit 0 a retry, bit 1 INIT, bits 3-6 the worker, bit 7 opens or
# closes a batch first), 4-6 deliver up to 8 messages, 7 a map (0 same, 1 the
# primary dies, 2 the backup dies, 3 the dead server comes back, or the one
# that skipped maps gets its copy back, 4 the backup's copy dropped in maps
# the backup skips, 0x44 dropped and given back in maps both skip).
def pair_push(w, n, retry=False, init=False):
    return bytes([w << 3 | (1 if retry else 0) | (2 if init else 0)]) + values(n, 9)


def pair(variant, variant2, n, name):
    deliver = bytes([4, 7])
    seq = bytes([variant, variant2, 0x80 | n_byte(n)]) + pair_push(0, n, init=True) + deliver
    for _ in range(2):
        seq += pair_push(0, n) + pair_push(1, n) + deliver
    seq += bytes([7, 1]) + pair_push(0, n, retry=True) + pair_push(1, n, retry=True) + bytes([7, 3]) + deliver * 2
    seq += pair_push(0, n) + pair_push(1, n) + deliver
    write("replica", name, seq)


if __name__ == "__main__":
    data_plane()
    replica()
    codec()
    config()
    scheduler()
    sealed()
