"""longattn's attention as PyTorch autograd Functions and nn.Modules.

    from longattn.torch import DilatedAttention, MultiheadDilatedAttention, attention

`DilatedAttention` and `MultiheadDilatedAttention` take the constructor arguments and tensor
shapes of dilated-attention-pytorch's modules of the same names (its semantics: heads split into
one group per (segment length, dilation rate), outputs divided by the group count; the
multi-head module's LayerNorms of q and k, and of the attention output before the output
projection, MAGNETO-style), so a model swaps its import. What they cannot do is refused, not
ignored: attention dropout above 0, attention masks, attention weights. `attention` is the
autograd Function of any spec longattn runs (dense, dilated in both modes, block-sparse
patterns, a caller's block mask).

Tensors stay where they are (CPU tensors on a host build, CUDA tensors on a CUDA build); inputs
whose last dimension is not contiguous are made contiguous first (the kernels read head rows).
"""
import torch
from torch import nn

import longattn

__all__ = ["DilatedAttention", "MultiheadDilatedAttention", "attention"]


def _rows_contiguous(x):
    return x if x.stride(-1) == 1 else x.contiguous()


class _Attention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, spec, causal, softmax_scale, block_mask):
        q, k, v = (_rows_contiguous(x) for x in (q, k, v))
        config = dict(attention=spec, causal=causal, softmax_scale=softmax_scale, block_mask=block_mask)
        o, lse = longattn.attention_forward(q, k, v, **config)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.config = config
        return o

    @staticmethod
    def backward(ctx, d_o):
        q, k, v, o, lse = ctx.saved_tensors
        dq, dk, dv = longattn.attention_backward(q, k, v, o, lse, _rows_contiguous(d_o), **ctx.config)
        return dq, dk, dv, None, None, None, None


def attention(q, k, v, attention="dense", causal=False, softmax_scale=None, block_mask=None):
    """softmax(q k^T * scale) v over [batch, tokens, heads, head dim] tensors, differentiable in
    q, k and v; `attention` a longattn.AttentionSpec or its text (see longattn.attention_forward)."""
    spec = attention if isinstance(attention, longattn.AttentionSpec) else longattn.AttentionSpec(str(attention))
    return _Attention.apply(q, k, v, spec, bool(causal), softmax_scale, block_mask)


class DilatedAttention(nn.Module):
    """Dilated attention (LongNet) over [batch, tokens, heads, head dim] tensors, as
    dilated_attention_pytorch.DilatedAttention: head group i attends within segments of
    segment_lengths[i] tokens to every dilation_rates[i]-th token (offset i mod rate).

    op, enable_memory_pool, enable_profiling, lightweight_pool, device and dtype are the seed
    module's and change nothing here (longattn has its own kernels and memory pool)."""

    def __init__(self, segment_lengths, dilation_rates, softmax_scale=None, attention_dropout=0.0, op=None,
                 enable_memory_pool=False, enable_profiling=False, lightweight_pool=True, device=None,
                 dtype=None):
        super().__init__()
        if len(segment_lengths) != len(dilation_rates):
            raise ValueError("segment_lengths and dilation_rates must have the same length")
        if attention_dropout != 0.0:
            raise ValueError(f"longattn DilatedAttention: attention_dropout is {attention_dropout}, expected 0.0 "
                             "(longattn's kernels have no attention dropout)")
        self.segment_lengths = list(segment_lengths)
        self.dilation_rates = list(dilation_rates)
        self.softmax_scale = softmax_scale
        self.spec = longattn.dilated(self.segment_lengths, self.dilation_rates, mode="head_groups")

    def forward(self, query, key, value, is_causal=False, attention_mask=None):
        if attention_mask is not None:
            raise ValueError("longattn DilatedAttention: attention_mask is given, expected None "
                             "(masks are not supported; use is_causal or a block_sparse spec)")
        return attention(query, key, value, self.spec, is_causal, self.softmax_scale)

    def extra_repr(self):
        return f"segment_lengths={self.segment_lengths}, dilation_rates={self.dilation_rates}"


class MultiheadDilatedAttention(nn.Module):
    """Multi-head dilated attention over [batch, tokens, embed_dim] tensors, as
    dilated_attention_pytorch.MultiheadDilatedAttention (same parameters and names: q_proj,
    k_proj, v_proj, out_proj, q_ln, k_ln; same initialization), the attention itself longattn's."""

    def __init__(self, embed_dim, num_heads, dilation_rates, segment_lengths, dropout=0.0, bias=True,
                 layer_norm=True, layer_norm_eps=1e-5, gamma_init=1.0, device=None, dtype=None, op=None):
        super().__init__()
        if embed_dim % num_heads != 0:
            raise ValueError(f"embed_dim ({embed_dim}) must be divisible by num_heads ({num_heads})")
        if len(dilation_rates) != len(segment_lengths):
            raise ValueError(f"len(dilation_rates) ({len(dilation_rates)}) must be equal to "
                             f"len(segment_lengths) ({len(segment_lengths)})")
        self.embed_dim, self.num_heads = embed_dim, num_heads
        self.head_dim = embed_dim // num_heads
        self.layer_norm, self.gamma_init = layer_norm, gamma_init
        factory = dict(device=device, dtype=dtype)
        self.q_proj = nn.Linear(embed_dim, embed_dim, bias=bias, **factory)
        self.k_proj = nn.Linear(embed_dim, embed_dim, bias=bias, **factory)
        self.v_proj = nn.Linear(embed_dim, embed_dim, bias=bias, **factory)
        self.out_proj = nn.Linear(embed_dim, embed_dim, bias=bias, **factory)
        self.attention = DilatedAttention(segment_lengths, dilation_rates, attention_dropout=dropout)
        if layer_norm:
            self.q_ln = nn.LayerNorm(embed_dim, eps=layer_norm_eps, **factory)
            self.k_ln = nn.LayerNorm(embed_dim, eps=layer_norm_eps, **factory)
        else:
            self.q_ln = self.k_ln = None
        self._reset_parameters()

    def _reset_parameters(self):
        # MAGNETO's initialization, as the seed module: gain gamma_init on every projection.
        for projection in (self.q_proj, self.k_proj, self.v_proj, self.out_proj):
            nn.init.xavier_normal_(projection.weight, gain=self.gamma_init)
            if projection.bias is not None:
                nn.init.zeros_(projection.bias)

    def forward(self, query, key=None, value=None, key_padding_mask=None, need_weights=False, attn_mask=None,
                is_causal=False, average_attn_weights=True):
        if key_padding_mask is not None or attn_mask is not None:
            raise ValueError("longattn MultiheadDilatedAttention: key_padding_mask and attn_mask must be None "
                             "(masks are not supported; use is_causal)")
        key = query if key is None else key
        value = query if value is None else value
        if query.dim() != 3 or key.dim() != 3 or value.dim() != 3:
            raise ValueError(f"Expected 3D tensors (batch, seq_len, embed_dim), got shapes: query={tuple(query.shape)}, "
                             f"key={tuple(key.shape)}, value={tuple(value.shape)}")
        batch, tokens, embed = query.shape
        if key.shape[:2] != (batch, tokens) or value.shape[:2] != (batch, tokens):
            raise ValueError("Batch size and sequence length must match for query, key, value. Got "
                             f"query={tuple(query.shape)}, key={tuple(key.shape)}, value={tuple(value.shape)}")
        if embed != self.embed_dim:
            raise ValueError(f"Input embedding dimension ({embed}) doesn't match expected ({self.embed_dim})")
        q, k, v = self.q_proj(query), self.k_proj(key), self.v_proj(value)
        if self.layer_norm:
            q, k = self.q_ln(q), self.k_ln(k)
        heads = (batch, tokens, self.num_heads, self.head_dim)
        x = self.attention(q.view(heads), k.view(heads), v.view(heads), is_causal=is_causal)
        x = x.reshape(batch, tokens, self.embed_dim)
        if self.layer_norm:
            x = self.q_ln(x)  # the seed's post-attention LayerNorm reuses q_ln
        output = self.out_proj(x)
        return (output, None) if need_weights else output
