"""Naive float64 references of the attention kinds longattn runs, in numpy, written from the
definitions in core/include/longattn/core/ (dilated_attention.hpp, block_sparse_patterns.hpp)."""
import numpy as np


def attention(q, k, v, causal=False, scale=None, keep=None, query_offset=0, key_offset=0):
    """softmax(q k^T scale) v over [B, N, H, D]; keep: a [B or 1, H or 1, Nq, Nk] token mask.
    Returns (o, lse); rows that see no key get o = 0, lse = -inf."""
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    scale = 1 / np.sqrt(q.shape[-1]) if scale is None else scale
    s = np.einsum("bnhd,bmhd->bhnm", q, k) * scale
    visible = np.ones(s.shape, dtype=bool)
    if causal:
        positions_q = query_offset + np.arange(q.shape[1])
        positions_k = key_offset + np.arange(k.shape[1])
        visible &= positions_k[None, :] <= positions_q[:, None]
    if keep is not None:
        visible &= keep
    s = np.where(visible, s, -np.inf)
    top = s.max(axis=-1, keepdims=True)
    finite = np.isfinite(top)
    p = np.where(finite, np.exp(s - np.where(finite, top, 0)), 0)
    total = p.sum(axis=-1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        o = np.einsum("bhnm,bmhd->bnhd", np.where(total > 0, p / total, 0), v)
        lse = np.where(total[..., 0] > 0, np.log(total[..., 0]) + top[..., 0], -np.inf)
    return o, lse


def dilated_selection(tokens, segment, rate, offset):
    """The token positions a (segment length, rate, offset) pass selects, per segment."""
    return [np.arange(start + offset, min(start + segment, tokens), rate) for start in range(0, tokens, segment)]


def dilated_pass(q, k, v, heads, segment, rate, offset, causal, scale):
    """One configuration's attention for the given heads: (o, lse) over all tokens, o = 0 and
    lse = -inf where the pass selects nothing."""
    batch, tokens, _, dim = q.shape
    o = np.zeros((batch, tokens, len(heads), dim))
    lse = np.full((batch, len(heads), tokens), -np.inf)
    for picked in dilated_selection(tokens, segment, rate, offset):
        if len(picked) == 0:
            continue
        part_o, part_lse = attention(q[:, picked][:, :, heads], k[:, picked][:, :, heads], v[:, picked][:, :, heads],
                                     causal, scale)
        o[:, picked] = part_o
        lse[:, :, picked] = part_lse
    return o, lse


def dilated_longnet(q, k, v, segment_lengths, rates, causal=False, scale=None):
    """LongNet: every head uses every configuration (offset head mod rate), merged by LSE."""
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    batch, tokens, heads, dim = q.shape
    parts = []
    for w, r in zip(segment_lengths, rates):
        o = np.zeros(q.shape)
        lse = np.full((batch, heads, tokens), -np.inf)
        for h in range(heads):
            o[:, :, [h]], lse[:, [h]] = dilated_pass(q, k, v, [h], w, r, h % r, causal, scale)
        parts.append((o, lse))
    lse = np.logaddexp.reduce([p[1] for p in parts], axis=0)
    o = np.zeros(q.shape)
    for part_o, part_lse in parts:
        with np.errstate(invalid="ignore"):
            weight = np.where(np.isfinite(lse), np.exp(part_lse - np.where(np.isfinite(lse), lse, 0)), 0)
        o += part_o * weight.transpose(0, 2, 1)[..., None]
    return o, lse


def head_groups(heads, groups):
    """Group sizes as equal as possible, the earlier groups one larger."""
    sizes = [heads // groups + (1 if i < heads % groups else 0) for i in range(groups)]
    starts = np.cumsum([0] + sizes)
    return [list(range(starts[i], starts[i + 1])) for i in range(groups)]


def dilated_head_groups(q, k, v, segment_lengths, rates, causal=False, scale=None):
    """dilated-attention-pytorch's semantics: head group i uses configuration i (offset i mod
    r_i), tokens it does not select get 0, the output divided by the group count."""
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    batch, tokens, heads, _ = q.shape
    o = np.zeros(q.shape)
    lse = np.full((batch, heads, tokens), -np.inf)
    for i, (group, w, r) in enumerate(zip(head_groups(heads, len(rates)), segment_lengths, rates)):
        o[:, :, group], lse[:, group] = dilated_pass(q, k, v, group, w, r, i % r, causal, scale)
    return o / len(rates), lse


def token_mask(block_mask, block, queries, keys):
    """A [.., query blocks, key blocks] block mask as a [.., Nq, Nk] token mask."""
    qb = np.arange(queries) // block
    kb = np.arange(keys) // block
    return block_mask[..., qb[:, None], kb[None, :]]


def local_window_blocks(block, queries, keys, radius):
    """local_window's blocks: some query of the block and some key within `radius` tokens."""
    qb, kb = np.arange((queries + block - 1) // block), np.arange((keys + block - 1) // block)
    q_first, q_last = qb * block, np.minimum(qb * block + block, queries) - 1
    k_first, k_last = kb * block, np.minimum(kb * block + block, keys) - 1
    gap = np.maximum(0, np.maximum(k_first[None, :] - q_last[:, None], q_first[:, None] - k_last[None, :]))
    return (gap <= radius)[None, None]
