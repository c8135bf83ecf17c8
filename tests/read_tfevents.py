#!/usr/bin/python3
"""An independent reader of TensorBoard event files, for the tests: Debian's Python protobuf (messages
declared here from TensorFlow's field numbers) and crc32c. Checks every record's framing and CRCs, that each
record re-encodes to the same bytes, the file_version event, the text summaries, and that the scalars
TensorBoard would show (after applying SessionLog START purges, file by file) equal metrics.jsonl.

Usage: read_tfevents.py LOGGING_DIR OUTPUT_DIR [--files N] [--truncated-ok] [--args-text]
"""
import argparse
import glob
import json
import math
import os
import struct
import sys

import crc32c
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

F = descriptor_pb2.FieldDescriptorProto


def schema():
    fdp = descriptor_pb2.FileDescriptorProto(name="tb_test.proto", package="tbtest", syntax="proto3")

    def message(name, fields, oneof=None):
        m = fdp.message_type.add(name=name)
        if oneof:  # TensorFlow's oneofs keep a zero value on the wire (a 0.0 simple_value is encoded)
            m.oneof_decl.add(name=oneof[0])
        for fname, number, ftype, repeated, type_name in fields:
            f = m.field.add(name=fname, number=number, type=ftype,
                            label=F.LABEL_REPEATED if repeated else F.LABEL_OPTIONAL)
            if type_name:
                f.type_name = ".tbtest." + type_name
            if oneof and fname in oneof[1]:
                f.oneof_index = 0

    message("Dim", [("size", 1, F.TYPE_INT64, False, None), ("name", 2, F.TYPE_STRING, False, None)])
    message("Shape", [("dim", 2, F.TYPE_MESSAGE, True, "Dim")])
    message("Tensor", [("dtype", 1, F.TYPE_INT32, False, None), ("tensor_shape", 2, F.TYPE_MESSAGE, False, "Shape"),
                       ("string_val", 8, F.TYPE_BYTES, True, None)])
    message("PluginData", [("plugin_name", 1, F.TYPE_STRING, False, None), ("content", 2, F.TYPE_BYTES, False, None)])
    message("Metadata", [("plugin_data", 1, F.TYPE_MESSAGE, False, "PluginData"),
                         ("display_name", 2, F.TYPE_STRING, False, None)])
    # Declaration order puts the oneof's members together (protobuf requires it); the wire order is by number.
    message("Value", [("tag", 1, F.TYPE_STRING, False, None), ("node_name", 7, F.TYPE_STRING, False, None),
                      ("metadata", 9, F.TYPE_MESSAGE, False, "Metadata"),
                      ("simple_value", 2, F.TYPE_FLOAT, False, None), ("tensor", 8, F.TYPE_MESSAGE, False, "Tensor")],
            oneof=("value", {"simple_value", "tensor"}))
    message("Summary", [("value", 1, F.TYPE_MESSAGE, True, "Value")])
    message("SessionLog", [("status", 1, F.TYPE_INT32, False, None), ("checkpoint_path", 2, F.TYPE_STRING, False, None),
                           ("msg", 3, F.TYPE_STRING, False, None)])
    message("Event", [("wall_time", 1, F.TYPE_DOUBLE, False, None), ("step", 2, F.TYPE_INT64, False, None),
                      ("file_version", 3, F.TYPE_STRING, False, None), ("summary", 5, F.TYPE_MESSAGE, False, "Summary"),
                      ("session_log", 7, F.TYPE_MESSAGE, False, "SessionLog")],
            oneof=("what", {"file_version", "summary", "session_log"}))
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    desc = pool.FindMessageTypeByName("tbtest.Event")
    if hasattr(message_factory, "GetMessageClass"):
        return message_factory.GetMessageClass(desc)
    return message_factory.MessageFactory(pool).GetPrototype(desc)


Event = schema()


def masked(data):
    c = crc32c.crc32c(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def fail(msg):
    print("read_tfevents: FAIL: " + msg)
    sys.exit(1)


def read_events(path, truncated_ok):
    raw = open(path, "rb").read()
    events, pos = [], 0
    while pos < len(raw):
        if len(raw) - pos < 12:
            if truncated_ok:
                break
            fail(f"{path}: {len(raw) - pos} stray bytes at offset {pos}")
        (length,) = struct.unpack_from("<Q", raw, pos)
        (len_crc,) = struct.unpack_from("<I", raw, pos + 8)
        if len_crc != masked(raw[pos:pos + 8]):
            fail(f"{path}: length CRC mismatch at offset {pos}")
        end = pos + 12 + length + 4
        if end > len(raw):
            if truncated_ok:
                break
            fail(f"{path}: record at offset {pos} runs past the end")
        data = raw[pos + 12:pos + 12 + length]
        (data_crc,) = struct.unpack_from("<I", raw, pos + 12 + length)
        if data_crc != masked(data):
            fail(f"{path}: data CRC mismatch at offset {pos}")
        ev = Event()
        ev.ParseFromString(data)
        try:  # fields this schema does not know (protobuf 4.21 has UnknownFields; later ones may not)
            if len(ev.UnknownFields()) or any(len(v.UnknownFields()) for v in ev.summary.value):
                fail(f"{path}: record at offset {pos} holds fields TensorBoard's schema does not have")
        except AttributeError:
            pass
        if ev.SerializeToString(deterministic=True) != data:
            fail(f"{path}: record at offset {pos} does not re-encode to its bytes (unknown or misordered fields)")
        events.append(ev)
        pos = end
    return events


def rewrite(key):
    if key.startswith("eval_"):
        return "eval/" + key[5:]
    if key.startswith("test_"):
        return "test/" + key[5:]
    return "train/" + key


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("logging_dir")
    ap.add_argument("output_dir")
    ap.add_argument("--files", type=int, default=0, help="expected number of event files (0: any >= 1)")
    ap.add_argument("--truncated-ok", action="store_true", help="a killed run: the last record may be cut")
    ap.add_argument("--require", default="", help="comma-separated tags that must appear")
    ap.add_argument("--session-starts", default=None, help="comma-separated steps of the SessionLog STARTs expected")
    a = ap.parse_args()
    files = glob.glob(os.path.join(a.logging_dir, "events.out.tfevents.*"))
    if not files or (a.files and len(files) != a.files):
        fail(f"{a.logging_dir}: {len(files)} event files, expected {a.files or 'some'}")
    per_file = []
    for f in files:
        name = os.path.basename(f).split(".")
        if len(name) < 6 or len(name[3]) != 10 or not name[3].isdigit():
            fail(f"{f}: not named events.out.tfevents.<10-digit time>.<host>.<pid>.<n>")
        evs = read_events(f, a.truncated_ok)
        if not evs or evs[0].file_version != "brain.Event:2":
            fail(f"{f}: the first event is not file_version brain.Event:2")
        per_file.append((evs[0].wall_time, f, evs))
    per_file.sort()  # the order the files were written in
    scalars, texts, records, starts = {}, {}, 0, []
    for _, f, evs in per_file:
        for ev in evs[1:]:
            records += 1
            if ev.session_log.status == 1:  # START: TensorBoard drops earlier data at steps >= this one
                starts.append(ev.step)
                scalars = {k: v for k, v in scalars.items() if k[1] < ev.step}
                continue
            for v in ev.summary.value:
                if v.metadata.plugin_data.plugin_name == "text":
                    t = v.tensor
                    if t.dtype != 7 or [d.size for d in t.tensor_shape.dim] != [1] or len(t.string_val) != 1:
                        fail(f"{f}: text summary {v.tag} is not a DT_STRING tensor of shape [1]")
                    texts[v.tag] = t.string_val[0].decode("utf-8")
                else:
                    # An evaluation's line repeats the epoch of the train line at its step (as HF's).
                    if (v.tag, ev.step) in scalars and scalars[(v.tag, ev.step)] != v.simple_value:
                        fail(f"{f}: {v.tag} at step {ev.step} logged twice with different values, no purge")
                    scalars[(v.tag, ev.step)] = v.simple_value
    # metrics.jsonl, as TensorBoard should show it: every number of every line at the line's step.
    expected = {}
    lines = [json.loads(l) for l in open(os.path.join(a.output_dir, "metrics.jsonl")) if l.strip()]
    for entry in lines:
        for k, v in entry.items():
            if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool):
                expected[(rewrite(k), entry["step"])] = struct.unpack("<f", struct.pack("<f", v))[0]
    if a.session_starts is not None and starts != [int(s) for s in a.session_starts.split(",") if s]:
        fail(f"SessionLog START events at steps {starts}, expected {a.session_starts}")
    if not expected:
        fail("metrics.jsonl holds no numbers")
    if a.truncated_ok:  # a kill between the metrics.jsonl line and the event flush loses the last step only
        last = max(s for _, s in expected)
        missing = set(expected) - set(scalars)
        if any(s != last for _, s in missing):
            fail(f"killed run: TensorBoard lacks steps before the last logged one: {sorted(missing)[:5]}")
        expected = {k: v for k, v in expected.items() if k in scalars}
    if set(scalars) != set(expected):
        extra, missing = sorted(set(scalars) - set(expected)), sorted(set(expected) - set(scalars))
        fail(f"scalars differ from metrics.jsonl: extra {extra[:5]}, missing {missing[:5]}")
    for k, v in expected.items():
        got = scalars[k]
        if not (got == v or (math.isnan(got) and math.isnan(v))):
            fail(f"{k[0]} at step {k[1]}: {got} in TensorBoard, {v} in metrics.jsonl")
    for tag in filter(None, a.require.split(",")):
        if not any(t == tag for t, _ in scalars) and tag not in texts:
            fail(f"tag {tag} not found")
    if "args/text_summary" in texts:
        args = json.loads(texts["args/text_summary"])
        saved = json.load(open(os.path.join(a.output_dir, "training_args.json")))
        if args.get("output_dir") != saved.get("output_dir") or args.get("logging_dir") != a.logging_dir.rstrip("/"):
            fail("args text summary does not match training_args.json")
    tags = sorted({t for t, _ in scalars})
    print(f"read_tfevents: OK: {len(per_file)} file(s), {records} records, {len(scalars)} scalars over "
          f"{len(tags)} tags ({', '.join(tags)}), text {sorted(texts)}")


main()
