# Run in raw/: pools the two orders' rounds. Per round before/after (best of the round's 2
# repetitions a side; before = the build without the shared block steps, after = with them):
# 10 rounds with before first (raw-before-first-*.txt, A = before) and 10 with after first
# (raw-after-first-*.txt, A = after); then the same for the quiet rerun (recheck-*.txt). Its
# output is ../pooled-orders.txt.
import collections, glob, statistics
def rounds(path, before):
    d = collections.defaultdict(list)
    for l in open(path):
        i, s, n, v = l.split(); d[(int(i), s)].append(float(v))
    after = 'B' if before == 'A' else 'A'
    return [min(d[(i, before)]) / min(d[(i, after)]) for i in sorted({i for i, _ in d})], n
for f in sorted(glob.glob('raw-before-first-*.txt')) + sorted(glob.glob('recheck-before-first-*.txt')):
    first, n = rounds(f, 'A')
    second, _ = rounds(f.replace('before-first-', 'after-first-'), 'B')
    n = ('quiet rerun: ' if f.startswith('recheck') else '') + n
    both = first + second
    print(f"{n:70s} before/after: before first {statistics.median(first):.3f}, after first {statistics.median(second):.3f}, "
          f"20 rounds {statistics.median(both):.3f} (range {min(both):.3f}-{max(both):.3f})")
