#!/usr/bin/env python3
"""Design study: peak reserved / peak live of a trace under gvmalloc's layout.

A model, in Python, of the arena policy (docs/design-notes.md): best-fit with
coalescing over one contiguous virtual range, blocks rounded to 512 B, physical
chunks made for exactly the unmapped granules a block needs (up to
MAX_CHUNK_MIB each), and - with SLACK >= 0 - wholly free chunks released before
growing while reserved would pass live x (1 + SLACK). It counts chunks made and
released. It is how the defaults of max_chunk_size and reserve_slack were
chosen; the real figures come from gvm-replay. Streams are not modelled.

  tools/frag_sim.py [TRACE] [MAX_CHUNK_MIB] [SLACK]
  tools/frag_sim.py traces/gpt2_train.trace.gz 128 0.02
  tools/frag_sim.py traces/gpt2_train.trace.gz 128 -1     # never release

STITCH=peak|all adds a policy gvmalloc does not have (docs/design-notes.md,
"Free chunk ends"): a request that would grow is made instead of the free end
of one chunk that holds live data and the free start of another, both handles
mapped whole a second time side by side at a new address, with new memory for
what they lack between them - when that needs fewer new bytes than the best
fit's growth (peak: only where the growth would raise the peak of reserved
bytes; all: wherever). The two free ends stay lent to the block until it is
freed; its new memory is a chunk of its own (among the chunks made), released
with its free. The calls of the second mappings (two maps and their access,
two unmaps at the free) are counted apart. STITCH_LIFE=N, an oracle that
reads the trace ahead, stitches only blocks freed within N events;
STITCH_GUESS=N, without reading ahead, only blocks of a size whose last block
lived at most N events. STITCH_KEEP=1 keeps a freed stitched block whole, for
a later request of at least half its size, until a growth needs its runs or
the slack release its new memory.
"""
import bisect
import gzip
import os
import sys

G = 2 << 20  # granule


def read_events(path):
    opener = gzip.open if path.endswith(".gz") else open
    events = []
    with opener(path, "rt") as f:
        for line in f:
            p = line.split()
            if p and not p[0].startswith("#"):
                events.append((p[0] == "a", int(p[1]), int(p[2]) if p[0] == "a" else 0))
    return events


class Region:
    """The blocks of one huge virtual range: addr -> [size, free], the free
    ones also by (size, addr), every start in address order."""

    def __init__(self):
        self.blocks = {0: [1 << 42, True]}
        self.free = [(1 << 42, 0)]
        self.nxt, self.prv = {0: None}, {0: None}
        self.starts = [0]

    def _split(self, a, n):
        """Block a (free, out of the free list) keeps n bytes; the rest is a
        new free block after it."""
        sz = self.blocks[a][0]
        b = a + n
        self.blocks[a][0] = n
        self.blocks[b] = [sz - n, True]
        bisect.insort(self.free, (sz - n, b))
        bisect.insort(self.starts, b)
        nx = self.nxt[a]
        self.nxt[b], self.prv[b], self.nxt[a] = nx, a, b
        if nx is not None:
            self.prv[nx] = b

    def take(self, n):
        i = bisect.bisect_left(self.free, (n, -1))
        sz, a = self.free.pop(i)
        self.blocks[a][1] = False
        if sz > n:
            self._split(a, n)
        return a

    def block_at(self, addr):
        """The block holding addr."""
        return self.starts[bisect.bisect_right(self.starts, addr) - 1]

    def take_at(self, addr, n):
        """Exactly [addr, addr + n), which must lie in one free block."""
        a = self.block_at(addr)
        sz, free = self.blocks[a]
        assert free and addr + n <= a + sz
        self.free.remove((sz, a))
        if addr > a:
            self.blocks[a][0] = addr - a
            bisect.insort(self.free, (addr - a, a))
            self.blocks[addr] = [a + sz - addr, True]
            bisect.insort(self.starts, addr)
            nx = self.nxt[a]
            self.nxt[addr], self.prv[addr], self.nxt[a] = nx, a, addr
            if nx is not None:
                self.prv[nx] = addr
            a = addr
        self.blocks[a][1] = False
        if self.blocks[a][0] > n:
            self._split(a, n)
        return a

    def _unlink(self, b):
        n2 = self.nxt[b]
        p = self.prv[b]
        self.nxt[p] = n2
        if n2 is not None:
            self.prv[n2] = p
        del self.blocks[b], self.nxt[b], self.prv[b]
        self.starts.pop(bisect.bisect_left(self.starts, b))

    def give(self, a):
        blocks = self.blocks
        sz = blocks[a][0]
        blocks[a][1] = True
        nx = self.nxt[a]
        if nx is not None and blocks[nx][1]:
            self.free.remove((blocks[nx][0], nx))
            sz += blocks[nx][0]
            self._unlink(nx)
        pv = self.prv[a]
        if pv is not None and blocks[pv][1]:
            self.free.remove((blocks[pv][0], pv))
            sz += blocks[pv][0]
            self._unlink(a)
            a = pv
        blocks[a][0] = sz
        bisect.insort(self.free, (sz, a))


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else "traces/gpt2_train.trace.gz"
    max_chunk = (int(sys.argv[2]) if len(sys.argv) > 2 else 128) << 20
    slack = float(sys.argv[3]) if len(sys.argv) > 3 else 0.02
    stitch = os.environ.get("STITCH", "")
    if stitch not in ("", "peak", "all"):
        sys.exit("STITCH: peak or all, not %r" % stitch)
    keep = os.environ.get("STITCH_KEEP", "0") == "1"
    life = int(os.environ.get("STITCH_LIFE", "0"))
    guess = int(os.environ.get("STITCH_GUESS", "0"))
    last_life = {}  # STITCH_GUESS: rounded size -> events its last block lived
    born = {}  # ident -> event of its allocation
    events = read_events(path)
    # STITCH_LIFE=N (an oracle, from the trace's future): stitch only blocks
    # freed within N events of their allocation.
    freed_at, open_at = {}, {}
    for i, (is_alloc, ident, _) in enumerate(events):
        if is_alloc:
            open_at[ident] = i
        elif ident in open_at:
            freed_at[open_at.pop(ident)] = i

    r = Region()
    chunk_of = {}  # granule -> chunk start
    chunks = {}  # chunk start -> size
    live_in = {}  # granule -> live blocks over it
    reserved = peak_reserved = live = peak_live = 0
    made = released = 0
    stitched = stitch_calls = reused = 0
    kept = []  # STITCH_KEEP: freed stitched blocks, whole: (size, pieces, new)
    where = {}

    def chunk_free(h):
        return all(live_in.get(g, 0) == 0 for g in range(h // G, (h + chunks[h]) // G))

    def dissolve(pieces, new):
        """A stitched block's free runs back where they are, its new memory
        and its second mappings gone."""
        nonlocal reserved, released, stitch_calls
        for a, m in pieces:
            count(a, m, -1)
            r.give(a)
        reserved -= new
        released += 1 if new else 0
        stitch_calls += 2  # the two second mappings unmapped

    def release_for(need):
        """Kept stitched blocks, then wholly free chunks, largest first, while
        a growth of `need` bytes would pass live x (1 + SLACK)."""
        nonlocal reserved, released
        if not need or slack < 0 or reserved + need <= live * (1 + slack):
            return
        while kept and reserved + need > live * (1 + slack):
            dissolve(*kept.pop()[1:])
        cached = sorted(((chunks[h], h) for h in chunks if chunk_free(h)), reverse=True)
        while cached and reserved + need > live * (1 + slack):
            sz, h = cached.pop(0)
            for k in range(h // G, (h + sz) // G):
                del chunk_of[k]
            del chunks[h]
            reserved -= sz
            released += 1

    def place(m):
        """The best fit for m bytes, taken, and the granule runs it lacks."""
        a = r.take(m)
        g0, g1 = a // G, (a + m - 1) // G
        runs, g = [], g0
        while g <= g1:
            if g in chunk_of:
                g += 1
                continue
            s = g
            while g <= g1 and g not in chunk_of:
                g += 1
            runs.append((s, g - s))
        return a, runs, sum(n for _, n in runs) * G

    def count(a, m, d):
        for g in range(a // G, (a + m - 1) // G + 1):
            live_in[g] = live_in.get(g, 0) + d

    def free_ends():
        """The largest free end of one chunk holding live data and free start
        of another: ((bytes, chunk), (bytes, chunk)) pairs, best first."""
        ends, starts = [], []
        for h, sz in chunks.items():
            if chunk_free(h):
                continue
            b = r.block_at(h + sz - 1)
            ends.append((h + sz - max(b, h) if r.blocks[b][1] else 0, h))
            b = r.block_at(h)
            starts.append((min(b + r.blocks[b][0], h + sz) - h if r.blocks[b][1] else 0, h))
        ends.sort(reverse=True)
        starts.sort(reverse=True)
        best = None
        for e in ends[:2]:
            for s in starts[:2]:
                if e[1] != s[1] and (best is None or e[0] + s[0] > best[0][0] + best[1][0]):
                    best = (e, s)
        return best

    for i, (is_alloc, ident, nbytes) in enumerate(events):
        if not is_alloc:
            w = where.pop(ident)
            if ident in born:
                last_life[(w[-1] + 511) // 512 * 512] = i - born.pop(ident)
            live -= w[-1]
            if w[0] == "stitch":
                _, pieces, new, size, n = w
                if keep:
                    kept.append((size, pieces, new))
                else:
                    dissolve(pieces, new)
                continue
            _, a, m, n = w
            count(a, m, -1)
            r.give(a)
            continue
        m = (nbytes + 511) // 512 * 512
        live += nbytes
        born[ident] = i
        fits = [k for k in kept if m <= k[0] <= 2 * m]
        if fits:  # a kept stitched block of at most twice the request
            k = min(fits, key=lambda k: k[0])
            kept.remove(k)
            where[ident] = ("stitch", k[1], k[2], k[0], nbytes)
            reused += 1
            peak_live = max(peak_live, live)
            continue
        a, runs, need = place(m)
        if need and kept:  # the kept blocks' runs may serve it: back first
            r.give(a)
            while kept:
                dissolve(*kept.pop()[1:])
            a, runs, need = place(m)
        short = not life or freed_at.get(i, len(events)) - i <= life
        if guess:
            short = short and last_life.get(m, guess + 1) <= guess
        if need and stitch and short and (stitch == "all" or reserved + need > peak_reserved):
            best = free_ends()
            if best is not None:
                (end, ha), (start, hb) = best
                new = max(0, m - end - start + G - 1) // G * G
                if new < need:
                    r.give(a)
                    pieces = []
                    if end:
                        pieces.append((r.take_at(ha + chunks[ha] - end, end), end))
                    if start:
                        pieces.append((r.take_at(hb, start), start))
                    for pa, pm in pieces:
                        count(pa, pm, +1)
                    where[ident] = ("stitch", pieces, new, end + new + start, nbytes)
                    release_for(new)
                    reserved += new
                    made += 1 if new else 0
                    stitched += 1
                    stitch_calls += 4  # the two second mappings and their access
                    peak_reserved = max(peak_reserved, reserved)
                    peak_live = max(peak_live, live)
                    continue
        where[ident] = ("block", a, m, nbytes)
        count(a, m, +1)
        release_for(need)
        for s, n in runs:
            while n > 0:
                sz = min(n * G, max_chunk)
                chunks[s * G] = sz
                for k in range(s, s + sz // G):
                    chunk_of[k] = s * G
                reserved += sz
                made += 1
                s += sz // G
                n -= sz // G
        peak_reserved = max(peak_reserved, reserved)
        peak_live = max(peak_live, live)
    line = "max_chunk %d MiB, slack %g: peak reserved / peak live %.4f, chunks made %d, released %d" % (
        max_chunk >> 20, slack, peak_reserved / peak_live, made, released)
    if stitch:
        line += "; stitch %s: %d blocks stitched, %d driver calls for their second mappings" % (
            stitch, stitched, stitch_calls)
        if keep:
            line += ", %d reused whole" % reused
    print(line)


if __name__ == "__main__":
    main()
