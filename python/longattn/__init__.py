"""longattn from Python: its fused attention kernels on numpy arrays and torch tensors.

    import numpy as np, longattn
    q, k, v = (np.random.rand(1, 4096, 8, 64).astype(np.float32) for _ in range(3))
    o, lse = longattn.attention_forward(q, k, v, attention="dilated:w=1024,2048;r=1,2", causal=True)
    dq, dk, dv = longattn.attention_backward(q, k, v, o, lse, np.ones_like(o), attention=..., causal=True)

Tensors are [batch, tokens, heads, head dim] (the layout of dilated-attention-pytorch and
flash-attn) of float32, float64, bfloat16 or float16, any strides; the kernels read them where
they are (DLPack, no copies) and write outputs this module allocates with the inputs' library
(numpy or torch). lse is [batch, heads, queries] in float32 (float64 for float64 inputs): what
backward needs. The GIL is released while kernels run. `longattn.torch` has autograd Functions
and nn.Modules (drop-ins for dilated-attention-pytorch's DilatedAttention and
MultiheadDilatedAttention).

In a CUDA build the tensors are torch CUDA tensors on the GPU Kokkos runs on (memory_device()
says which memory a build reads): a call first waits for the work queued on each input's current
torch stream, and returns when its kernels have finished, so its outputs are ready on any stream.

Kokkos starts on the first call (or `initialize(threads=...)`) and stops at interpreter exit.
Bad arguments raise `longattn.Error` (a ValueError) naming the argument, its value and what was
expected.
"""
import atexit

from . import _core
from ._core import AttentionSpec, Error

__all__ = ["AttentionSpec", "Error", "attention_backward", "attention_forward", "block_size", "dilated",
           "execution_space", "initialize", "memory_device"]

atexit.register(_core.finalize)


def initialize(threads=None):
    """Starts Kokkos now; `threads`: the host kernels' thread count (default: OMP_NUM_THREADS or
    every core). Does nothing once Kokkos runs (the first kernel call starts it)."""
    _core.initialize(threads)


def execution_space():
    """The Kokkos execution space the kernels run on ("OpenMP", "Cuda", ...)."""
    return _core.execution_space()


def memory_device():
    """The memory this build's kernels read and write: "cpu" (numpy arrays, torch CPU tensors) or
    "cuda" (torch CUDA tensors)."""
    return _core.memory_device()


def dilated(segment_lengths, dilation_rates, mode="longnet"):
    """The AttentionSpec of dilated attention with segments w_i and rates r_i. mode "longnet":
    every head uses every (w_i, r_i), merged by softmax denominators (LongNet); "head_groups":
    heads split into one group per (w_i, r_i), outputs divided by the group count
    (dilated-attention-pytorch's semantics)."""
    if mode not in ("longnet", "head_groups"):
        raise Error(f"longattn.dilated: argument 'mode' is {mode!r}, expected 'longnet' or 'head_groups'")
    text = "dilated:w=" + ",".join(str(int(w)) for w in segment_lengths) + ";r=" + ",".join(
        str(int(r)) for r in dilation_rates)
    return AttentionSpec(text + (";mode=head_groups" if mode == "head_groups" else ""))


def block_size(like):
    """Tokens per block of a block mask for tensors of `like`'s dtype on this build."""
    return _core.block_size(_readable(like))


def attention_forward(q, k, v, *, attention="dense", causal=False, softmax_scale=None, query_offset=0,
                      key_offset=0, block_mask=None):
    """o = softmax(q k^T * scale) v over the keys `attention` keeps; returns (o, lse).

    attention: an AttentionSpec or its text ("dense", "dilated:w=...;r=...[;mode=head_groups]",
    "block_sparse:pattern=local_window;radius=512", ... as longattn-train's --attention).
    causal: key j visible to query i iff key_offset + j <= query_offset + i. block_mask: a
    caller's block-sparse layout (with attention "dense"), booleans [1 or B, 1 or H, query
    blocks, key blocks] in blocks of block_size(q) tokens."""
    q, k, v = _readable(q), _readable(k), _readable(v)
    batch, queries, heads, _ = _shape("longattn.attention_forward", "q", q)
    _wait_for_producers(q, k, v)
    o = _empty(q, q.shape, q.dtype)
    lse = _empty(q, (batch, heads, queries), _accumulation_type(q))
    _core.forward(q, k, v, o, lse, _spec(attention), bool(causal), softmax_scale, int(query_offset),
                  int(key_offset), _mask(block_mask))
    return o, lse


def attention_backward(q, k, v, o, lse, d_o, *, attention="dense", causal=False, softmax_scale=None,
                       query_offset=0, key_offset=0, block_mask=None):
    """The gradients (dq, dk, dv) of sum(d_o * o), o and lse from attention_forward with the same
    arguments."""
    q, k, v, o, lse, d_o = (_readable(x) for x in (q, k, v, o, lse, d_o))
    for name, x in (("q", q), ("k", k), ("v", v)):
        _shape("longattn.attention_backward", name, x)
    dq, dk, dv = (_empty(x, x.shape, x.dtype) for x in (q, k, v))
    _wait_for_producers(q, k, v, o, lse, d_o)
    _core.backward(q, k, v, o, d_o, lse, dq, dk, dv, _spec(attention), bool(causal), softmax_scale,
                   int(query_offset), int(key_offset), _mask(block_mask))
    return dq, dk, dv


# ---- arrays of either library ----------------------------------------------------------------

def _is_torch(x):
    return type(x).__module__.startswith("torch")


def _readable(x):
    # torch refuses to export a tensor that requires grad; detach() is a view, not a copy.
    return x.detach() if _is_torch(x) else x


def _wait_for_producers(*tensors):
    """Waits for the work queued on the current torch stream of each CUDA tensor's device: the
    kernels run on Kokkos' own stream, which does not wait for torch's (DLPack hands over memory,
    not order)."""
    devices = {x.device for x in tensors if _is_torch(x) and x.is_cuda}
    if devices:
        import torch
        for device in devices:
            torch.cuda.current_stream(device).synchronize()


def _shape(where, name, x):
    """x's shape, a [batch, tokens, heads, head dim] tensor's, else Error."""
    if len(x.shape) != 4:
        raise Error(f"{where}: argument '{name}.ndim' is {len(x.shape)}, expected 4 ([batch, tokens, heads, head dim])")
    return tuple(x.shape)


def _empty(like, shape, dtype):
    if _is_torch(like):
        return like.new_empty(tuple(shape), dtype=dtype)
    import numpy
    return numpy.empty(tuple(shape), dtype=dtype)


def _accumulation_type(x):
    if _is_torch(x):
        import torch
        return torch.float64 if x.dtype == torch.float64 else torch.float32
    import numpy
    return numpy.float64 if x.dtype == numpy.float64 else numpy.float32


def _spec(attention):
    return attention if isinstance(attention, AttentionSpec) else AttentionSpec(str(attention))


def _mask(block_mask):
    if block_mask is None:
        return None
    if _is_torch(block_mask):
        block_mask = block_mask.detach().cpu().numpy()
    import numpy
    return numpy.ascontiguousarray(block_mask, dtype=numpy.uint8)
