# Run in raw/: pools the two orders' rounds. Per round before/after (best of the round's 2
# repetitions a side): 10 rounds with the before side first (raw-*.txt, A = before) and 10 with it
# second (raw-swapped-*.txt, A = after). Its output is ../pooled-orders.txt.
import collections, glob, statistics
def rounds(path, before):
    d = collections.defaultdict(list)
    for l in open(path):
        i, s, n, v = l.split(); d[(int(i), s)].append(float(v))
    after = 'B' if before == 'A' else 'A'
    return [min(d[(i, before)]) / min(d[(i, after)]) for i in sorted({i for i, _ in d})], n
for f in sorted(glob.glob('raw-swapped-*.txt')):
    first, n = rounds(f.replace('raw-swapped-', 'raw-'), 'A')
    second, _ = rounds(f, 'B')
    both = first + second
    print(f"{n:70s} before/after: before first {statistics.median(first):.3f}, before second {statistics.median(second):.3f}, "
          f"20 rounds {statistics.median(both):.3f} (range {min(both):.3f}-{max(both):.3f})")
