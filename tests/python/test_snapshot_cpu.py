"""The PyTorch memory snapshot reader (gvmalloc.snapshot, tools/snapshot_to_trace.py)
without torch or a GPU: the snapshot PyTorch 2.11 wrote on an H200 (stacks
stripped, data/small_snapshot.pickle), snapshots without history, bad and
truncated pickles, pickles that name classes. And, where the GPU script's
paired outputs are kept (tools/gpu-snapshot-pair.sh), that a snapshot and a
record_trace of the same run read to the same events.
Runs under pytest or `python3 -m unittest`; CTest name python_snapshot."""

import gzip
import os
import pickle
import subprocess
import sys
import tempfile
import unittest

import _support  # noqa: F401  (puts the package on sys.path)
from gvmalloc import snapshot

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "data")
ROOT = os.path.dirname(os.path.dirname(HERE))
TOOL = os.path.join(HERE, "..", "..", "tools", "snapshot_to_trace.py")
SMALL = os.path.join(DATA, "small_snapshot.pickle")


def events(text):
    """The trace's events, ids renumbered in order of allocation."""
    ids = {}
    out = []
    for line in text.splitlines():
        f = line.split()
        if not f or f[0].startswith("#"):
            continue
        if f[0] == "a":
            ids[f[1]] = len(ids)
            out.append(("a", ids[f[1]], int(f[2]), int(f[3])))
        else:
            out.append(("f", ids[f[1]], int(f[2])))
    return out


def read_bytes(path):
    with open(path, "rb") as f:
        return f.read()


def entry(action, addr, size, stream=0):
    return {"action": action, "addr": addr, "size": size, "stream": stream, "time_us": 0, "frames": []}


class SmallSnapshot(unittest.TestCase):
    def test_reads_to_the_recorded_events(self):
        snap = snapshot.load(SMALL)
        conv = snapshot.convert(snap, None, SMALL)
        self.assertEqual(conv.device, 0)
        self.assertEqual(conv.allocations, 115)
        self.assertEqual(conv.frees, 106)
        self.assertEqual(len(conv.streams), 2)
        self.assertEqual(conv.unmatched_frees, 0)
        # Every free_requested pairs with the alloc at its address before it.
        live = {}
        expected = []
        for e in snap["device_traces"][0]:
            if e["action"] == "alloc":
                live[e["addr"]] = (len(expected), e["size"])
                expected.append(("a", e["size"], e["stream"]))
            elif e["action"] == "free_requested":
                expected.append(("f", live.pop(e["addr"])[1], e["stream"]))
        got = events(conv.text())
        self.assertEqual(len(got), len(expected))
        sizes = {}
        for g, x in zip(got, expected):
            self.assertEqual(g[0], x[0])
            if g[0] == "a":
                sizes[g[1]] = g[2]
                self.assertEqual((g[2], g[3]), (x[1], x[2]))
            else:
                self.assertEqual((sizes[g[1]], g[2]), (x[1], x[2]))

    def test_what_pytorch_reserved_comes_from_the_segment_events(self):
        snap = snapshot.load(SMALL)
        conv = snapshot.convert(snap, 0, SMALL)
        segs = sum(e["size"] for e in snap["device_traces"][0] if e["action"] == "segment_alloc")
        self.assertEqual(conv.pytorch["peak_reserved_bytes"], segs)
        self.assertEqual(conv.pytorch["reserved_before_history"], 0)
        self.assertIn("expandable_segments off", conv.pytorch["allocator"])

    def test_a_snapshot_of_gvmallocs_backend_names_gvmalloc_as_its_allocator(self):
        # gvmalloc's backend answers _snapshot() with its own settings (its
        # segments grow, so expandable_segments is on, and the configuration
        # string is gvmalloc's): the recorded run's figures are gvmalloc's,
        # not PyTorch's caching allocator's.
        snap = snapshot.load(SMALL)
        snap["allocator_settings"] = dict(snap["allocator_settings"], expandable_segments=True,
                                          PYTORCH_CUDA_ALLOC_CONF="gvmalloc GVM_CONF: reserve_slack:0.02")
        conv = snapshot.convert(snap, 0, SMALL)
        self.assertTrue(conv.pytorch["gvmalloc"])
        self.assertNotIn("PyTorch's caching allocator", conv.pytorch["allocator"])
        self.assertIn("gvmalloc's PyTorch backend (GVM_CONF: reserve_slack:0.02)", conv.pytorch["allocator"])
        self.assertIn("# gvmalloc's PyTorch backend reserved at most", conv.text())
        self.assertFalse(snapshot.convert(snapshot.load(SMALL), 0, SMALL).pytorch["gvmalloc"])

    def test_the_tool_writes_a_trace_gvm_replay_reads(self):
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "t.trace.gz")
            summary = os.path.join(tmp, "s.txt")
            r = subprocess.run([sys.executable, TOOL, SMALL, "-o", out, "--summary", summary],
                               capture_output=True, text=True)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn("115 allocations and 106 frees on 2 stream(s)", r.stdout)
            with gzip.open(out, "rt") as f:
                text = f.read()
            self.assertEqual(len(events(text)), 221)
            with open(summary) as f:
                fields = dict(line.split("=", 1) for line in f.read().splitlines())
            self.assertEqual(fields["pytorch_peak_reserved_bytes"], "115343360")
            self.assertEqual(fields["peak_live_bytes"], "75845720")
            self.assertEqual(fields["recorded_by_gvmalloc"], "0")


class BadSnapshots(unittest.TestCase):
    def load_bytes(self, data):
        with self.assertRaises(snapshot.SnapshotError) as cm:
            snapshot.convert(snapshot.loads(data, "x.pickle"), None, "x.pickle")
        return str(cm.exception)

    def test_without_history_it_says_how_to_record_one(self):
        for traces in ([], [[]], [[], []]):
            msg = self.load_bytes(pickle.dumps({"segments": [], "device_traces": traces}, protocol=4))
            self.assertIn("has no allocation history", msg)
            self.assertIn("torch.cuda.memory._record_memory_history(", msg)
            self.assertIn("torch.cuda.memory._dump_snapshot(", msg)
        snap = pickle.dumps({"segments": []}, protocol=4)  # _snapshot() with no history key
        self.assertIn("_record_memory_history", self.load_bytes(snap))

    def test_a_history_of_segments_only_has_nothing_to_replay(self):
        snap = {"segments": [], "device_traces": [[entry("segment_alloc", 1 << 30, 2 << 20)]]}
        self.assertIn("no allocation", self.load_bytes(pickle.dumps(snap, protocol=4)))

    def test_truncated_files_are_named_truncated(self):
        data = read_bytes(SMALL)
        for cut in (2, 100, len(data) // 2, len(data) - 1):
            msg = self.load_bytes(data[:cut])
            self.assertIn("truncated", msg, cut)

    def test_not_a_pickle(self):
        for data in (b"", b"junk", b"a 1 512 0\nf 1 0\n", b"\x1f\x8bnot gzip"):
            msg = self.load_bytes(data)
            self.assertTrue("not a PyTorch memory snapshot" in msg or "gzip error" in msg
                            or "empty file" in msg, msg)
        msg = self.load_bytes(pickle.dumps([1, 2, 3], protocol=4))
        self.assertIn("not a PyTorch memory snapshot", msg)

    def test_a_pickle_that_names_a_class_is_refused_without_running_it(self):
        class Boom:
            def __reduce__(self):
                return (os.system, ("echo should-not-run",))
        data = pickle.dumps({"segments": [], "device_traces": [[Boom()]]}, protocol=4)
        msg = self.load_bytes(data)
        self.assertIn("refers to", msg)
        self.assertIn("nothing of it was run", msg)

    def test_gzip_compressed_snapshots_are_read(self):
        data = gzip.compress(read_bytes(SMALL))
        conv = snapshot.convert(snapshot.loads(data, "x.pickle.gz"), None, "x.pickle.gz")
        self.assertEqual(conv.allocations, 115)

    def test_a_device_without_history_is_named(self):
        snap = snapshot.load(SMALL)
        with self.assertRaises(snapshot.SnapshotError) as cm:
            snapshot.convert(snap, 3, SMALL)
        self.assertIn("no allocation history for device 3 (devices with one: 0)", str(cm.exception))

    def test_frees_from_before_the_history_are_counted_and_left_out(self):
        h = [entry("free_requested", 4096, 512), entry("alloc", 8192, 1024), entry("free_requested", 8192, 1024)]
        conv = snapshot.convert({"segments": [], "device_traces": [h]}, None, "s")
        self.assertEqual(conv.unmatched_frees, 1)
        self.assertEqual(events(conv.text()), [("a", 0, 1024, 0), ("f", 0, 0)])

    def test_the_tool_exits_1_with_one_line(self):
        with tempfile.TemporaryDirectory() as tmp:
            bad = os.path.join(tmp, "bad.pickle")
            with open(bad, "wb") as f:
                f.write(b"junk")
            r = subprocess.run([sys.executable, TOOL, bad, "-o", os.path.join(tmp, "o.trace")],
                               capture_output=True, text=True)
            self.assertEqual(r.returncode, 1)
            self.assertEqual(len(r.stderr.strip().splitlines()), 1, r.stderr)
            self.assertIn("snapshot_to_trace: ", r.stderr)
            self.assertNotIn("Traceback", r.stderr)
            r = subprocess.run([sys.executable, TOOL, os.path.join(tmp, "none.pickle")],
                               capture_output=True, text=True)
            self.assertEqual(r.returncode, 1)
            self.assertIn("cannot read", r.stderr)


class RecordTraceWithoutTorch(unittest.TestCase):
    def test_says_what_it_needs(self):
        try:
            import torch  # noqa: F401
            self.skipTest("torch is installed: the GPU test (tools/gpu-snapshot-pair.sh) covers record_trace")
        except ImportError:
            pass
        from gvmalloc.record_trace import RecordTraceError, record_trace
        with self.assertRaises(RecordTraceError) as cm:
            with record_trace(os.path.join(tempfile.gettempdir(), "never.trace")):
                pass
        self.assertIn("needs PyTorch", str(cm.exception))

    def test_the_trace_names_the_file_not_the_directory(self):
        # The trace's first line names where it came from; a directory of the
        # recording machine would travel with every copy of the file.
        from gvmalloc.record_trace import source_label
        self.assertEqual(source_label(os.path.join("some", "dir", "step.trace.gz")),
                         "record_trace('step.trace.gz')")
        for path in ["traces/" + n for n in os.listdir(os.path.join(ROOT, "traces")) if n.endswith(".gz")] + [
                os.path.join("tests", "python", "data", "paired_record.trace.gz")]:
            with gzip.open(os.path.join(ROOT, path), "rt") as f:
                first = f.readline()
            if first.startswith("# gvmalloc trace of record_trace("):
                self.assertNotIn("/", first.split("'")[1], path)

    def test_gvmalloc_torch_exports_it(self):
        # gvmalloc.torch imports torch, so where torch is missing its exports
        # are read from the source: record_trace is in gvmalloc.torch.__all__
        # and bound there to gvmalloc.record_trace's function (the name
        # docs/replay.md gives; it was once only the submodule's).
        import ast
        import gvmalloc
        path = os.path.join(os.path.dirname(gvmalloc.__file__), "torch.py")
        with open(path) as f:
            tree = ast.parse(f.read())
        exported, imported = set(), set()
        for node in tree.body:
            if isinstance(node, ast.Assign) and any(
                    isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
                exported = {e.value for e in node.value.elts}
            if isinstance(node, ast.ImportFrom) and node.module == "gvmalloc.record_trace":
                imported |= {a.asname or a.name for a in node.names}
        self.assertIn("record_trace", exported)
        self.assertIn("record_trace", imported)


# GVM_SNAPSHOT_PAIR_DIR: where tools/gpu-snapshot-pair.sh just wrote them (it runs this test).
PAIR_DIR = os.environ.get("GVM_SNAPSHOT_PAIR_DIR", DATA)
PAIR = os.path.join(PAIR_DIR, "paired_snapshot.pickle"), os.path.join(PAIR_DIR, "paired_record.trace.gz")


@unittest.skipUnless(all(os.path.exists(p) for p in PAIR),
                     "the GPU script's paired outputs are not kept yet (tools/gpu-snapshot-pair.sh "
                     "writes paired_snapshot.pickle and paired_record.trace.gz; copy them to tests/python/data)")
class SnapshotAndRecordTraceOfOneRun(unittest.TestCase):
    def test_read_to_the_same_events(self):
        conv = snapshot.convert(snapshot.load(PAIR[0]), None, PAIR[0])
        with gzip.open(PAIR[1], "rt") as f:
            recorded = events(f.read())
        self.assertGreater(len(recorded), 0)
        self.assertEqual(events(conv.text()), recorded)


if __name__ == "__main__":
    unittest.main()
