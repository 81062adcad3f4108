#!/usr/bin/env python3
"""Design study: peak reserved / peak live of a trace under gvmalloc's layout.

A model, in Python, of the arena policy (docs/design-notes.md): best-fit with
coalescing over one contiguous virtual range, blocks rounded to 512 B, physical
chunks made for exactly the unmapped granules a block needs (up to
MAX_CHUNK_MIB each), and - with SLACK >= 0 - wholly free chunks released before
growing while reserved would pass live x (1 + SLACK). It counts chunks made and
released. It is how the defaults of max_chunk_size and reserve_slack were
chosen; the real figures come from gvm-replay.

  tools/frag_sim.py [TRACE] [MAX_CHUNK_MIB] [SLACK]
  tools/frag_sim.py traces/gpt2_train.trace.gz 128 0.02
  tools/frag_sim.py traces/gpt2_train.trace.gz 128 -1     # never release
"""
import bisect
import gzip
import sys

G = 2 << 20  # granule


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else "traces/gpt2_train.trace.gz"
    max_chunk = (int(sys.argv[2]) if len(sys.argv) > 2 else 128) << 20
    slack = float(sys.argv[3]) if len(sys.argv) > 3 else 0.02
    opener = gzip.open if path.endswith(".gz") else open
    events = []
    with opener(path, "rt") as f:
        for line in f:
            p = line.split()
            if p:
                events.append((p[0] == "a", int(p[1]), int(p[2]) if p[0] == "a" else 0))

    # Blocks of one huge region: addr -> [size, free]; free set sorted by (size, addr).
    blocks = {0: [1 << 42, True]}
    free = [(1 << 42, 0)]
    nxt, prv = {0: None}, {0: None}

    def take(n):
        i = bisect.bisect_left(free, (n, -1))
        sz, a = free.pop(i)
        blocks[a][1] = False
        if sz > n:
            b = a + n
            blocks[a][0] = n
            blocks[b] = [sz - n, True]
            bisect.insort(free, (sz - n, b))
            nx = nxt[a]
            nxt[b], prv[b], nxt[a] = nx, a, b
            if nx is not None:
                prv[nx] = b
        return a

    def give(a):
        sz = blocks[a][0]
        blocks[a][1] = True
        nx = nxt[a]
        if nx is not None and blocks[nx][1]:
            free.remove((blocks[nx][0], nx))
            sz += blocks[nx][0]
            n2 = nxt[nx]
            nxt[a] = n2
            if n2 is not None:
                prv[n2] = a
            del blocks[nx], nxt[nx], prv[nx]
        pv = prv[a]
        if pv is not None and blocks[pv][1]:
            free.remove((blocks[pv][0], pv))
            sz += blocks[pv][0]
            nxt[pv] = nxt[a]
            if nxt[a] is not None:
                prv[nxt[a]] = pv
            del blocks[a], nxt[a], prv[a]
            a = pv
        blocks[a][0] = sz
        bisect.insort(free, (sz, a))

    chunk_of = {}  # granule -> chunk start
    chunks = {}  # chunk start -> size
    live_in = {}  # granule -> live blocks over it
    reserved = peak_reserved = live = peak_live = 0
    made = released = 0
    where = {}

    def chunk_free(h):
        return all(live_in.get(g, 0) == 0 for g in range(h // G, (h + chunks[h]) // G))

    for is_alloc, ident, nbytes in events:
        if not is_alloc:
            a, m, n = where.pop(ident)
            live -= n
            for g in range(a // G, (a + m - 1) // G + 1):
                live_in[g] -= 1
            give(a)
            continue
        m = (nbytes + 511) // 512 * 512
        a = take(m)
        where[ident] = (a, m, nbytes)
        live += nbytes
        g0, g1 = a // G, (a + m - 1) // G
        for g in range(g0, g1 + 1):
            live_in[g] = live_in.get(g, 0) + 1
        runs, g = [], g0
        while g <= g1:
            if g in chunk_of:
                g += 1
                continue
            s = g
            while g <= g1 and g not in chunk_of:
                g += 1
            runs.append((s, g - s))
        need = sum(n for _, n in runs) * G
        if need and slack >= 0 and reserved + need > live * (1 + slack):
            cached = sorted(((chunks[h], h) for h in chunks if chunk_free(h)), reverse=True)
            while cached and reserved + need > live * (1 + slack):
                sz, h = cached.pop(0)
                for k in range(h // G, (h + sz) // G):
                    del chunk_of[k]
                del chunks[h]
                reserved -= sz
                released += 1
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
    print("max_chunk %d MiB, slack %g: peak reserved / peak live %.4f, chunks made %d, released %d"
          % (max_chunk >> 20, slack, peak_reserved / peak_live, made, released))


if __name__ == "__main__":
    main()
