#!/usr/bin/env python3
"""Design study: PyTorch's allocator with expandable segments, modelled on a trace.

A model, in Python, of how PyTorch's CUDACachingAllocator places blocks when
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (our reading of its
behaviour, written for this study): one segment per (stream, pool), requests
rounded to 512 B, those up to 1 MiB in a small pool of their own; a request
takes the best-fitting free mapped block (preferring, among the fits, one with
no unmapped space behind it), else the first unmapped range in address order
- joined with the free block before it - with 2 MiB pages mapped for what it
lacks; the block is split whenever 512 B or more are left; frees merge with
free neighbours of the same kind; nothing is unmapped (no empty_cache). It
prints peak reserved (mapped pages) / peak live (requested bytes).

It reproduces the recorded figures of traces/peers.csv where they come from
real PyTorch runs on an H200 (ResNet-50 1.0111 against 1.011, GPT-2 1.0782
against 1.079), and shows how much of a peer's figure is the luck of
placement (docs/design-notes.md, "The synthetic traces beside the peers, on the H200"):

  tools/expandable_sim.py traces/resnet50_train.trace.gz
  SMALL=0 tools/expandable_sim.py TRACE...      # one pool for every size
  WALK=0 tools/expandable_sim.py TRACE...       # plain best fit
"""
import bisect
import gzip
import os
import sys

G = 2 << 20  # page (granule) of the segments
# Requests up to SMALL bytes go to the small pool (0: one pool for all);
# WALK=0 drops the best fit's preference for blocks with no unmapped space
# behind them.
SMALL = int(os.environ.get("SMALL", 1 << 20))
WALK = os.environ.get("WALK", "1") == "1"

class Seg:
    """One expandable segment: a huge virtual range of blocks, each allocated
    ('a'), free and mapped ('f') or unmapped ('u'); pages are mapped at the
    head of an unmapped block when a request needs them, and never unmapped."""

    def __init__(self):
        self.blocks = {0: [1 << 40, 'u']}  # addr -> [size, state a/f/u]
        self.nxt = {0: None}; self.prv = {0: None}
        self.free = []     # (size, addr) of mapped free blocks
        self.unm = [0]     # addrs of unmapped blocks, sorted
        self.mapped = 0
    def _link_after(self, a, b):
        nx = self.nxt[a]; self.nxt[b] = nx; self.prv[b] = a; self.nxt[a] = b
        if nx is not None: self.prv[nx] = b
    def _unlink(self, b):
        p, n = self.prv[b], self.nxt[b]
        if p is not None: self.nxt[p] = n
        if n is not None: self.prv[n] = p
        del self.nxt[b]; del self.prv[b]; del self.blocks[b]
    def _rm_free(self, a):
        i = bisect.bisect_left(self.free, (self.blocks[a][0], a)); assert self.free[i] == (self.blocks[a][0], a); self.free.pop(i)
    def _merge(self, a):
        # a is free mapped (not in free set); merge with free mapped neighbours; returns new addr
        n = self.nxt[a]
        if n is not None and self.blocks[n][1] == 'f':
            self._rm_free(n); self.blocks[a][0] += self.blocks[n][0]; self._unlink(n)
        p = self.prv[a]
        if p is not None and self.blocks[p][1] == 'f':
            self._rm_free(p); self.blocks[p][0] += self.blocks[a][0]; self._unlink(a); a = p
        return a
    def _map(self, a, size):
        sz = self.blocks[a][0]; m = min(sz, -(-size // G) * G)
        self.unm.remove(a)
        self.mapped += m
        if m < sz:
            b = a + m; self.blocks[b] = [sz - m, 'u']; self._link_after(a, b); bisect.insort(self.unm, b)
            self.blocks[a][0] = m
        self.blocks[a][1] = 'f'
        a = self._merge(a)
        bisect.insort(self.free, (self.blocks[a][0], a))
        return a
    def exp_size(self, a):
        n = self.nxt[a]
        return self.blocks[a][0] + (self.blocks[n][0] if n is not None and self.blocks[n][1] == 'u' else 0)
    def alloc(self, s):
        i = bisect.bisect_left(self.free, (s, -1))
        if i < len(self.free):
            while WALK and i + 1 < len(self.free) and self.exp_size(self.free[i + 1][1]) < self.exp_size(self.free[i][1]):
                i += 1
            sz, a = self.free.pop(i)
        else:
            a = None
            for u in self.unm:
                c = u; p = self.prv[u]
                if p is not None and self.blocks[p][1] == 'f': c = p
                tot, x = 0, c
                while tot < s and x is not None and self.blocks[x][1] != 'a':
                    tot += self.blocks[x][0]; x = self.nxt[x]
                if tot >= s: a = c; break
            if self.blocks[a][1] == 'u':
                a = self._map(a, min(self.blocks[a][0], s))
            while self.blocks[a][0] < s:
                n = self.nxt[a]
                a2 = self._map(n, min(s - self.blocks[a][0], self.blocks[n][0]))
                assert a2 == a, (a2, a)
            self._rm_free(a)
        sz = self.blocks[a][0]
        self.blocks[a][1] = 'a'
        if sz - s >= 512:
            b = a + s; self.blocks[a][0] = s; self.blocks[b] = [sz - s, 'f']; self._link_after(a, b)
            bisect.insort(self.free, (sz - s, b))
        return a
    def release(self, a):
        self.blocks[a][1] = 'f'
        a = self._merge(a)
        bisect.insort(self.free, (self.blocks[a][0], a))

def main(path):
    segs = {}
    live = {}; cur = 0; peak_live = 0; peak_res = 0; peak_ev = 0
    op = gzip.open if path.endswith('.gz') else open
    with op(path, 'rt') as f:
        for ev, line in enumerate(f):
            p = line.split()
            if not p or p[0].startswith('#'):
                continue
            if p[0] == 'a':
                n = int(p[2]); st = p[3] if len(p) > 3 else '0'
                s = 512 if n < 512 else -(-n // 512) * 512
                key = (st, s <= SMALL)
                seg = segs.get(key) or segs.setdefault(key, Seg())
                a = seg.alloc(s)
                live[p[1]] = (seg, a, n); cur += n
                peak_live = max(peak_live, cur)
                res = sum(x.mapped for x in segs.values())
                if res > peak_res: peak_res = res; peak_ev = ev
            else:
                seg, a, n = live.pop(p[1]); seg.release(a); cur -= n
    print(path, 'peak live %.1f MiB, peak reserved %.1f MiB (event %d), ratio %.4f; small pools %s MiB' % (
        peak_live / 2**20, peak_res / 2**20, peak_ev, peak_res / peak_live,
        [round(x.mapped / 2**20, 1) for k, x in segs.items() if k[1]]))

if __name__ == "__main__":
    for t in sys.argv[1:] or ["traces/resnet50_train.trace.gz"]:
        main(t)
