#!/usr/bin/env python3
"""bench/torch_programs.py's side-by-side run without torch or a GPU: the
programs' runs are replaced by made-up results and the clock by a fake one, so
that the order of the runs, the --deadline (a run starts only when it should
end in time), both tables and the exit status are checked on any machine.
Usage: torch_programs_test.py PATH/TO/torch_programs.py
"""
import importlib.util
import io
import json
import os
import sys
import tempfile
from contextlib import redirect_stdout

FAILURES = []


def check(cond, what):
    if not cond:
        FAILURES.append(what)


def load(path):
    spec = importlib.util.spec_from_file_location("torch_programs", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def fake_result(program, allocator, step_ms, wall_s):
    return {"allocator": allocator, "median_step_s": step_ms / 1e3, "steps": 16,
            "peak_reserved": (1000 if allocator == "native" else 900) * (1 << 20),
            "checks": ["0x1p+0", "0x1p-1"], "alloc_pair_us": {"4096": 2.0, "1048576": 2.5,
                                                              "67108864": 3.0},
            "profile": "(the profiler's table of %s, %s)" % (program, allocator),
            "alloc_ops": {"steps": 4, "alloc_ops_self_cpu_ms_per_step": 1.5,
                          "alloc_ops_calls_per_step": 500.0, "all_ops_self_cpu_ms_per_step": 30.0,
                          "by_op": {"aten::empty": {"calls": 1600, "self_cpu_ms": 4.0},
                                    "aten::empty_strided": {"calls": 400, "self_cpu_ms": 2.0}},
                          "gpu": None if allocator == "expandable" else
                          {"gpu_busy_ms_per_step": 80.0, "gpu_span_ms_per_step": step_ms,
                           "gpu_idle_ms_per_step": step_ms - 80.0, "gpu_activities_per_step": 900.0}},
            "allocations_per_step": 600.0, "backend": "x", "wall_s": wall_s,
            "gvmalloc": {"driver_calls": [{"call": "cuMemMap", "calls": 10, "ms": 1.0}],
                         "device0": {"fences": 0},
                         "timed_steps": {"chunks_mapped": 0, "chunks_unmapped": 0, "fences": 0,
                                         "driver_calls": 2, "driver_ms": 0.05}}}


def run(tp, argv, walls, fail=()):
    """main(argv) with every run taking walls[program] fake seconds."""
    clock = [0.0]
    started = []

    def run_one(program, allocator, steps, timeout):
        started.append((program, allocator, timeout))
        clock[0] += walls[program]
        if (program, allocator) in fail:
            return {"allocator": allocator, "error": "no result (exit 1)", "stderr": "boom"}
        return fake_result(program, allocator, 100.0 if allocator != "gvm" else 90.0, walls[program])

    tp.run_one = run_one
    tp.time.monotonic = lambda: clock[0]
    out = io.StringIO()
    with redirect_stdout(out):
        rc = tp.main(argv)
    return rc, started, out.getvalue()


def main(path):
    tp = load(path)
    walls = {"resnet50": 30.0, "gpt2": 20.0, "llama": 40.0}
    with tempfile.TemporaryDirectory() as d:
        # No deadline: every program with every allocator, then ResNet-50's second native run.
        rc, started, text = run(tp, ["--out", d], walls)
        check(rc == 0, "exit status %d with every run passing" % rc)
        check([(p, a) for p, a, _ in started] ==
              [(p, a) for p in ("resnet50", "gpt2", "llama") for a in ("native", "gvm", "expandable")]
              + [("resnet50", "native#2")], "the order of the runs: %s" % started)
        check("=== PyTorch programs" in text and "=== Where the time goes" in text, "both tables")
        check(os.path.exists(os.path.join(d, "torch-programs.json")), "the JSON is written")
        with open(os.path.join(d, "torch-programs.txt")) as f:
            saved = f.read()
        check("=== Where the time goes" in saved, "the second table is in the text file")
        # gvm's row: 90 ms step, 0.900x; 600 allocations a step x 2 us = 1.2 ms; 1.5 ms of 90.
        row = [l for l in saved.splitlines() if l.startswith("gpt2") and " gvm " in l]
        check(len(row) == 3, "one gpt2 gvm row in each table: %s" % row)
        if len(row) == 3:
            check("0.900x" in row[0] and "0.900x" in row[0].split("MiB")[1], "ratios: " + row[0])
            check("600.0" in row[1] and "1.67%" in row[1] and "1.200" in row[1], "time row: " + row[1])
            # The GPU's side: 80 ms busy in a 90 ms span, 10 ms idle.
            check(row[2].split()[2:] == ["90.00", "80.000", "90.000", "10.000", "900.0"],
                  "GPU row: " + row[2])
        check("=== The GPU's side of a step" in saved, "the GPU table")
        check("gpt2      expandable  (the profiler recorded no device activity)" in saved,
              "a run without device activities says so")
        # The busy time is the union of the activities: [0,10] and [5,12] overlap.
        g = tp.gpu_timeline([(0.0, 10e3), (5e3, 12e3), (20e3, 30e3)], 2)
        check(g == {"gpu_busy_ms_per_step": 11.0, "gpu_span_ms_per_step": 15.0,
                    "gpu_idle_ms_per_step": 4.0, "gpu_activities_per_step": 1.5}, "gpu_timeline: %s" % g)
        check(tp.gpu_timeline([], 4) is None, "no activities: no figures")
        check("aten::empty 1600 calls 4.0 ms" in saved, "the allocating operators, per operator")
        check("gvmalloc driver calls (all of the run): cuMemMap 10 calls 1.0 ms" in saved,
              "gvmalloc's driver calls")
        check("gvmalloc in the timed steps alone: chunks_mapped 0, chunks_unmapped 0, fences 0, "
              "driver_calls 2, driver_ms 0.05" in saved, "gvmalloc's driver calls in the timed steps")

        # A deadline of 150 s: resnet 3 x 30 = 90, gpt2 2 x 20 = 130 s; gpt2's third run
        # needs 20 s x 1.2 = 24 s, 20 are left: not run; llama, not run yet, is judged
        # by the longest run so far (36 s): not run either.
        rc, started, text = run(tp, ["--out", d, "--deadline", "150"], walls)
        check(rc == 0, "runs not started are not failures (exit %d)" % rc)
        check([(p, a) for p, a, _ in started] ==
              [("resnet50", a) for a in ("native", "gvm", "expandable")] +
              [("gpt2", "native"), ("gpt2", "gvm")], "runs under the deadline: %s" % started)
        check(all(t <= 240 for _, _, t in started), "a run's timeout is at most 240 s")
        check("gpt2      expandable  not run: 20 s left of the --deadline, a run takes about 24 s"
              in text, "the run left out says why:\n" + text)
        check("llama     native      not run" in text, "llama is reported as not run")
        check("run(s) not started" in text, "the count of runs not started")

        # Two rounds: each run against the native and expandable runs of its own round
        # (the fake runs: "gvm" 90 ms, every other name - gvm#2 too - 100 ms; round 2 has
        # no expandable run).
        rc, started, text = run(tp, ["--out", d, "--programs", "gpt2", "--allocators",
                                     "gvm,native,expandable,gvm#2,native#2"], walls)
        check(rc == 0, "two rounds run (exit %d)" % rc)
        check("=== Rounds" in text, "the rounds table:\n" + text)
        rounds = [l.split() for l in text.splitlines() if l.split()[-2:-1] == ["of"]]
        row = [r for r in rounds if r[:2] == ["gpt2", "gvm"]]
        check(row == [["gpt2", "gvm", "2", "0.900", "1.000", "0.900", "—", "1", "of", "2"]],
              "gvm's rounds row: %s" % row)
        row = [r for r in rounds if r[:2] == ["gpt2", "expandable"]]
        check(row == [["gpt2", "expandable", "1", "1.000", "1.000", "1", "of", "1"]],
              "expandable's rounds row: %s" % row)
        check(tp.split_round("gvm#12") == ("gvm", 12) and tp.split_round("gvm-keep") == ("gvm-keep", 1),
              "round names")
        medians = [l.split() for l in text.split("=== Rounds, the median")[-1].splitlines()
                   if l.startswith("gpt2")]
        check(["gpt2", "gvm", "0.950", "0.900"] in medians and
              ["gpt2", "expandable", "1.000", "1.000"] in medians,
              "the medians over rounds: %s" % medians)
        # --rounds: each round the one before rotated by one, named alloc#r from round 2.
        rc, started, text = run(tp, ["--out", d, "--programs", "gpt2", "--allocators",
                                     "gvm,expandable,native", "--rounds", "3"], walls)
        check([a for _, a, _ in started] ==
              ["gvm", "expandable", "native", "expandable#2", "native#2", "gvm#2",
               "native#3", "gvm#3", "expandable#3"], "rotated rounds: %s" % started)
        check(tp.rotated_rounds(["a", "b"], 3) == ["a", "b", "b#2", "a#2", "a#3", "b#3"],
              "two allocators, three rounds")
        for bad in (["--rounds", "0"], ["--allocators", "gvm#2,native", "--rounds", "2"]):
            try:
                tp.main(["--out", d] + bad)
                check(False, "%s is refused" % bad)
            except SystemExit as e:
                check("--rounds" in str(e), "%s is refused with a message naming --rounds: %s"
                      % (bad, e))
        rc, started, text = run(tp, ["--out", d, "--programs", "gpt2"], walls)
        check("=== Rounds" not in text, "one round: no rounds table")
        # ResNet-50 in rounds that name a second native run already: no repeat is
        # added (it would be a second "native#2", taking round 2's place).
        rc, started, text = run(tp, ["--out", d, "--programs", "resnet50", "--allocators",
                                     "native,gvm,native#2,gvm#2"], walls)
        check([a for _, a, _ in started] == ["native", "gvm", "native#2", "gvm#2"],
              "no repeat beside a named second native run: %s" % started)

        # A failed run: exit status 1, the others still run and are compared.
        rc, started, text = run(tp, ["--out", d, "--programs", "gpt2"], walls,
                                fail={("gpt2", "gvm")})
        check(rc == 1, "a failed run makes the exit status 1")
        check(len(started) == 3, "the runs after a failure still run")
        check("gpt2      gvm         FAILED: no result (exit 1)" in text, "the failure is in the table")
        json.dumps(text)

        # gvm-base: gvmalloc of another build tree, refused before any run
        # without GVM_BASE_BUILD or its libraries; an unknown name too.
        for env, bad in ((None, "GVM_BASE_BUILD"), (d, "is not there")):
            os.environ.pop("GVM_BASE_BUILD", None)
            if env is not None:
                os.environ["GVM_BASE_BUILD"] = env
            try:
                run(tp, ["--out", d, "--programs", "gpt2", "--allocators", "gvm,gvm-base"], walls)
                check(False, "gvm-base without its libraries is refused")
            except SystemExit as e:
                check(bad in str(e), "gvm-base refused saying %r: %s" % (bad, e))
        libs = os.path.join(d, "base", "allocator")
        os.makedirs(libs)
        for name in ("libgvmalloc.so", "libgvmalloc_torch.so"):
            open(os.path.join(libs, name), "w").close()
        os.environ["GVM_BASE_BUILD"] = os.path.join(d, "base")
        check(tp.base_libraries(os.environ["GVM_BASE_BUILD"])["GVMALLOC_LIBRARY"] ==
              os.path.join(libs, "libgvmalloc.so"), "gvm-base's library is the base tree's")
        rc, started, text = run(tp, ["--out", d, "--programs", "gpt2", "--allocators",
                                     "gvm,gvm-base,native", "--rounds", "2"], walls)
        check(rc == 0 and [a for _, a, _ in started] ==
              ["gvm", "gvm-base", "native", "gvm-base#2", "native#2", "gvm#2"],
              "gvm-base in rotated rounds: %s" % started)
        os.environ.pop("GVM_BASE_BUILD", None)
        # The timed steps' driver calls, split by entry point: only those called
        # between the readings, the slowest first.
        then = {"fences": 1, "driver_calls": 3, "driver_ns": 5_000_000,
                "by_call": {"cuMemMap": (2, 4_000_000), "cuEventSynchronize": (1, 1_000_000),
                            "cuMemCreate": (0, 0)}}
        now = {"fences": 4, "driver_calls": 9, "driver_ns": 19_000_000,
               "by_call": {"cuMemMap": (3, 5_500_000), "cuEventSynchronize": (4, 11_000_000),
                           "cuMemCreate": (0, 0), "cuMemUnmap": (1, 2_500_000)}}
        d2 = tp.counters_since(now, then)
        check(d2 == {"fences": 3, "driver_calls": 6, "driver_ms": 14.0,
                     "by_call": "cuEventSynchronize 3 / 10.000 ms; cuMemUnmap 1 / 2.500 ms; "
                                "cuMemMap 1 / 1.500 ms"}, "counters_since: %s" % d2)
        try:
            run(tp, ["--out", d, "--allocators", "gvm,nativ"], walls)
            check(False, "an unknown allocator is refused")
        except SystemExit as e:
            check("nativ" in str(e) and "known" in str(e), "unknown allocator message: %s" % e)
    if FAILURES:
        print("FAILED checks:")
        for f in FAILURES:
            print("  - " + f)
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
