#!/usr/bin/env python3
"""keel-bench's TensorBoard event files: their framing, and read back with TensorBoard's reader.

The fixture (tests/bench/fixture/report_fixture.cc) writes one event file per run with
bench/tfevents.h's EventWriter, as keel-bench does, and lists every scalar it wrote in
scalars.tsv. Two parts, two CTest tests:

  --part framing: needs nothing but python3. Per run: one event file whose every record's
    CRC-32C framing is right (checked here independently), one record per scalar plus the
    brain.Event:2 version record first; a copy with one flipped byte is refused.
  --part tensorboard: TensorBoard's EventAccumulator finds exactly the tags loss, mfu,
    tokens_per_s and ettr with the written steps, wall times and values (as float32), its
    loader sees the version record, and its record reader refuses the damaged copy. Exits 77
    (ctest: skipped) without the `tensorboard` package, before it checks anything.

  tfevents_read_test.py --fixture BIN --part framing|tensorboard
"""
import argparse
import collections
import glob
import os
import shutil
import struct
import subprocess
import sys
import tempfile

SKIP = 77
TAGS = {"loss", "mfu", "tokens_per_s", "ettr"}


def crc32c(data):
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
    return crc ^ 0xFFFFFFFF


def masked(data):
    c = crc32c(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def check_framing(path):
    """The records of a TFRecord file, or the first thing wrong with its framing."""
    with open(path, "rb") as f:
        b = f.read()
    at, n = 0, 0
    while at < len(b):
        if len(b) - at < 12:
            return "record %d: cut short in its header" % n
        (length,) = struct.unpack_from("<Q", b, at)
        (hcrc,) = struct.unpack_from("<I", b, at + 8)
        if hcrc != masked(b[at:at + 8]):
            return "record %d: length CRC %08x, want %08x" % (n, hcrc, masked(b[at:at + 8]))
        if len(b) - at - 12 < length + 4:
            return "record %d: cut short in its data" % n
        data = b[at + 12:at + 12 + length]
        (dcrc,) = struct.unpack_from("<I", b, at + 12 + length)
        if dcrc != masked(data):
            return "record %d: data CRC %08x, want %08x" % (n, dcrc, masked(data))
        at += 16 + length
        n += 1
    return n


def first_file_version(path):
    """The file_version (Event field 3, a string) of the file's first record, or None."""
    with open(path, "rb") as f:
        b = f.read()
    if len(b) < 12:
        return None
    (length,) = struct.unpack_from("<Q", b, 0)
    data = b[12:12 + length]
    at = 0
    while at < len(data):
        key, at = varint(data, at)
        field, wire = key >> 3, key & 7
        if wire == 0:
            _, at = varint(data, at)
        elif wire == 1:
            at += 8
        elif wire == 5:
            at += 4
        elif wire == 2:
            n, at = varint(data, at)
            if field == 3:
                return data[at:at + n].decode("utf-8", "replace")
            at += n
        else:
            return None
    return None


def varint(b, at):
    v, shift = 0, 0
    while True:
        c = b[at]
        at += 1
        v |= (c & 0x7F) << shift
        shift += 7
        if not c & 0x80:
            return v, at


def damaged_copy(src, work):
    """A copy of src with one byte flipped inside its second record's data."""
    with open(src, "rb") as f:
        b = bytearray(f.read())
    (first_len,) = struct.unpack_from("<Q", b, 0)
    b[16 + first_len + 12 + 3] ^= 0x20
    bad = work + "/bad/events.out.tfevents.0.damaged"
    os.makedirs(os.path.dirname(bad), exist_ok=True)
    with open(bad, "wb") as f:
        f.write(b)
    return bad


def event_file(out, run, failures):
    """The run's one event file, or None (and a failure) when there is not exactly one."""
    files = glob.glob(os.path.join(out, "tb", run, "events.out.tfevents.*"))
    if len(files) != 1:
        failures.append("%s: %d event files" % (run, len(files)))
        return None
    return files[0]


def check_framing_part(out, want, work):
    failures = []
    for run in sorted(want):
        path = event_file(out, run, failures)
        if path is None:
            continue
        framing = check_framing(path)
        n = sum(len(v) for v in want[run].values())
        print("%-12s framing: %s" % (run, framing if isinstance(framing, str)
                                     else "%d records, CRCs right" % framing))
        if isinstance(framing, str):
            failures.append("%s: %s" % (run, framing))
        elif framing != n + 1:
            failures.append("%s: %d records, want %d" % (run, framing, n + 1))
        version = first_file_version(path)
        if version != "brain.Event:2":
            failures.append("%s: the first record's file_version is %r, not brain.Event:2"
                            % (run, version))
    src = glob.glob(os.path.join(out, "tb", sorted(want)[0], "events.out.tfevents.*"))[0]
    if not isinstance(check_framing(damaged_copy(src, work)), str):
        failures.append("the framing check took a record with a wrong CRC")
    return failures


def check_tensorboard_part(out, want, work, event_accumulator, event_file_loader):
    failures = []
    for run in sorted(want):
        path = event_file(out, run, failures)
        if path is None:
            continue
        first = next(iter(event_file_loader.EventFileLoader(path).Load()), None)
        if first is None or first.file_version != "brain.Event:2":
            failures.append("%s: the first record is not the brain.Event:2 version" % run)

        acc = event_accumulator.EventAccumulator(
            os.path.join(out, "tb", run), size_guidance={event_accumulator.SCALARS: 0})
        acc.Reload()
        tags = set(acc.Tags()["scalars"])
        if tags != TAGS:
            failures.append("%s: tags %s, want %s" % (run, sorted(tags), sorted(TAGS)))
        for tag in sorted(TAGS & tags):
            got = [(e.step, e.wall_time, e.value) for e in acc.Scalars(tag)]
            exp = want[run][tag]
            if [g[0] for g in got] != [w[0] for w in exp]:
                failures.append("%s/%s: steps %s, want %s"
                                % (run, tag, [g[0] for g in got], [w[0] for w in exp]))
                continue
            for (step, wall, value), (_, wwall, wvalue) in zip(got, exp):
                as_f32 = struct.unpack("<f", struct.pack("<f", wvalue))[0]
                if wall != wwall or value != as_f32:
                    failures.append("%s/%s step %d: (%r, %r), want (%r, %r)"
                                    % (run, tag, step, wall, value, wwall, as_f32))
                    break
        print("%-12s %4d scalars read back" % (run, sum(len(acc.Scalars(t)) for t in TAGS & tags)))

    # TensorBoard's reader checks the CRCs: one flipped byte in a record's data is refused.
    src = glob.glob(os.path.join(out, "tb", sorted(want)[0], "events.out.tfevents.*"))[0]
    bad = damaged_copy(src, work)
    # It stops at a record whose CRC is wrong (as if cut short): it reads the first only.
    whole = len(list(event_file_loader.RawEventFileLoader(src).Load()))
    read = len(list(event_file_loader.RawEventFileLoader(bad).Load()))
    print("damaged copy: TensorBoard read %d of its %d records (want 1)" % (read, whole))
    if read != 1 or whole < 3:
        failures.append("TensorBoard's reader took %d records of a file whose second has a "
                        "wrong CRC (want 1)" % read)
    return failures


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fixture", required=True, help="keel-bench-report-fixture")
    ap.add_argument("--part", choices=["framing", "tensorboard"], required=True)
    args = ap.parse_args()
    if args.part == "tensorboard":
        # The only skip, and before any check: the framing part runs everywhere.
        try:
            from tensorboard.backend.event_processing import event_accumulator
            from tensorboard.backend.event_processing import event_file_loader
        except ImportError as e:
            print("SKIPPED: python3 has no tensorboard package (%s); pip install tensorboard"
                  % e)
            return SKIP

    work = tempfile.mkdtemp(prefix="keel-tfevents-read-")
    try:
        out = work + "/out"
        subprocess.run([args.fixture, out], check=True)
        want = collections.defaultdict(lambda: collections.defaultdict(list))
        with open(out + "/scalars.tsv", encoding="utf-8") as f:
            for line in f:
                run, tag, step, wall, value = line.rstrip("\n").split("\t")
                want[run][tag].append((int(step), float(wall), float(value)))
        if len(want) < 2:
            print("FAILED: the fixture wrote scalars of %d runs" % len(want))
            return 1
        if args.part == "framing":
            failures = check_framing_part(out, want, work)
        else:
            failures = check_tensorboard_part(out, want, work, event_accumulator,
                                              event_file_loader)
        if failures:
            print("FAILED:\n  " + "\n  ".join(failures))
            return 1
        print("OK: " + ("every record framed right, the version record first"
                        if args.part == "framing"
                        else "TensorBoard reads every scalar back as written"))
        return 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
