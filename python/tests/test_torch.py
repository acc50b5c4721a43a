"""longattn.torch: autograd (gradcheck in float64), and the drop-ins against dilated-attention-
pytorch's algorithm (written out below in torch, as its modules compute it), on the memory this
build's kernels read (CPU tensors, or CUDA tensors in a CUDA build). Skipped, and says so, where
torch is not installed or, in a CUDA build, sees no GPU."""
import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed: the longattn.torch tests need it")

import longattn  # noqa: E402
from longattn.torch import DilatedAttention, MultiheadDilatedAttention, attention  # noqa: E402

DEVICE = torch.device(longattn.memory_device())
if DEVICE.type == "cuda" and not torch.cuda.is_available():
    pytest.skip("this build's kernels read CUDA memory and torch sees no GPU", allow_module_level=True)
on_cuda = pytest.mark.skipif(DEVICE.type != "cuda", reason="a host build: its kernels read CPU tensors")
on_host = pytest.mark.skipif(DEVICE.type != "cpu", reason="a CUDA build: its kernels do not read numpy arrays")

SPECS = ["dense", "dilated:w=8,16;r=1,2", "dilated:w=8,16;r=1,2;mode=head_groups",
         "block_sparse:pattern=local_window;radius=4"]


def random(*shape, dtype=torch.float64, grad=False):
    return (torch.rand(*shape, dtype=dtype, device=DEVICE) * 2 - 1).requires_grad_(grad)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("spec", SPECS)
def test_gradcheck_in_double(spec, causal):
    q, k, v = (random(1, 19, 2, 8, grad=True) for _ in range(3))
    assert torch.autograd.gradcheck(lambda q, k, v: attention(q, k, v, spec, causal), (q, k, v))


def test_gradcheck_with_a_caller_block_mask():
    q, k, v = (random(1, 40, 2, 4, grad=True) for _ in range(3))
    blocks = (40 + longattn.block_size(q) - 1) // longattn.block_size(q)
    mask = torch.ones(1, 2, blocks, blocks, dtype=torch.bool, device=DEVICE)
    assert torch.autograd.gradcheck(lambda q, k, v: attention(q, k, v, "dense", True, block_mask=mask), (q, k, v))


def seed_dilated_attention(query, key, value, segment_lengths, dilation_rates, is_causal=False):
    """dilated-attention-pytorch's DilatedAttention.forward, its algorithm in plain torch (the
    seed calls xformers or SDPA per segment; here an explicit softmax)."""
    b, n, h, d = query.shape
    groups = len(dilation_rates)
    sizes = [h // groups + (1 if i < h % groups else 0) for i in range(groups)]
    out = torch.zeros_like(query)
    start = 0
    for i, (g, r, s) in enumerate(zip(sizes, dilation_rates, segment_lengths)):
        heads = slice(start, start + g)
        start += g
        offset = i % r
        q, k, v = (x[:, :, heads].reshape(b, n // s, s, g, d)[:, :, offset::r] for x in (query, key, value))
        q, k, v = (x.reshape(b * (n // s), -1, g, d).transpose(1, 2) for x in (q, k, v))
        scores = q @ k.transpose(-1, -2) / d ** 0.5
        if is_causal:
            scores = scores.masked_fill(torch.ones_like(scores, dtype=torch.bool).triu(1), float("-inf"))
        x = (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, n // s, -1, g, d)
        part = torch.zeros(b, n // s, s, g, d, dtype=query.dtype, device=query.device)
        part[:, :, offset::r] = x
        out = out + torch.nn.functional.pad(part.reshape(b, n, g, d), (0, 0, heads.start, h - heads.stop))
    return out / groups


@pytest.mark.parametrize("causal", [False, True])
def test_dilated_attention_is_the_seed_modules_attention(causal):
    segments, rates = [64, 128], [1, 2]
    ours = DilatedAttention(segment_lengths=segments, dilation_rates=rates)
    q, k, v = (random(2, 256, 5, 16, grad=True) for _ in range(3))
    d_o = random(2, 256, 5, 16)
    got = ours(q, k, v, is_causal=causal)
    got_grads = torch.autograd.grad(got, (q, k, v), d_o)
    want = seed_dilated_attention(q, k, v, segments, rates, causal)
    want_grads = torch.autograd.grad(want, (q, k, v), d_o)
    assert torch.allclose(got, want, atol=1e-12)
    for a, b in zip(got_grads, want_grads):
        assert torch.allclose(a, b, atol=1e-12)


def test_multihead_dilated_attention_matches_its_composition():
    torch.manual_seed(7)
    module = MultiheadDilatedAttention(embed_dim=64, num_heads=4, dilation_rates=[1, 2], segment_lengths=[32, 64],
                                       dtype=torch.float64, device=DEVICE)
    assert {name for name, _ in module.named_parameters()} == {
        f"{p}.{w}" for p in ("q_proj", "k_proj", "v_proj", "out_proj", "q_ln", "k_ln") for w in ("weight", "bias")}
    x = random(2, 128, 64, grad=True)
    got = module(x, x, x, is_causal=True)
    assert got.shape == (2, 128, 64)
    q = module.q_ln(module.q_proj(x)).view(2, 128, 4, 16)
    k = module.k_ln(module.k_proj(x)).view(2, 128, 4, 16)
    v = module.v_proj(x).view(2, 128, 4, 16)
    a = seed_dilated_attention(q, k, v, [32, 64], [1, 2], True).reshape(2, 128, 64)
    want = module.out_proj(module.q_ln(a))
    assert torch.allclose(got, want, atol=1e-12)
    got_grad, = torch.autograd.grad(got.square().sum(), x)
    want_grad, = torch.autograd.grad(want.square().sum(), x)
    assert torch.allclose(got_grad, want_grad, atol=1e-10)
    out, weights = module(x, need_weights=True)
    assert weights is None and torch.allclose(out, module(x))


def test_bfloat16_tensors_within_bfloat16_rounding():
    q, k, v = (random(1, 300, 4, 64, dtype=torch.bfloat16) for _ in range(3))
    got = attention(q, k, v, "dilated:w=64,128;r=1,2", True).double()
    want = attention(q.double(), k.double(), v.double(), "dilated:w=64,128;r=1,2", True)
    assert ((got - want).abs().max() / want.abs().max()).item() < 1e-2


def test_tensors_are_read_in_place():
    x = random(2, 64, 4, 32, dtype=torch.float32)
    for t in (x, x[:, ::2], x.transpose(1, 2), x[..., 1:3, :]):
        assert longattn._core.data_pointer(t) == t.data_ptr()
    o, lse = longattn.attention_forward(x[:, ::2], x[:, ::2], x[:, ::2])
    assert isinstance(o, torch.Tensor) and o.dtype == torch.float32 and lse.shape == (2, 4, 32)


def test_what_the_drop_ins_cannot_do_is_refused():
    with pytest.raises(ValueError, match="attention_dropout"):
        DilatedAttention([64], [1], attention_dropout=0.1)
    module = MultiheadDilatedAttention(32, 2, [1], [16], device=DEVICE)
    x = torch.rand(1, 16, 32, device=DEVICE)
    with pytest.raises(ValueError, match="mask"):
        module(x, attn_mask=torch.ones(16, 16, dtype=torch.bool, device=DEVICE))
    with pytest.raises(ValueError, match="divisible"):
        MultiheadDilatedAttention(30, 4, [1], [16])
    with pytest.raises(longattn.Error, match="q.device|q.dtype"):
        attention(*(torch.zeros(1, 8, 1, 8, dtype=t, device=DEVICE) for t in (torch.int64, torch.float32, torch.float32)))


@on_host
def test_numpy_and_torch_give_the_same_result():
    q, k, v = (np.random.rand(1, 50, 2, 16).astype(np.float32) for _ in range(3))
    o_numpy, _ = longattn.attention_forward(q, k, v, causal=True)
    o_torch = attention(*(torch.from_numpy(x) for x in (q, k, v)), causal=True)
    assert np.array_equal(o_numpy, o_torch.numpy())


@on_cuda
def test_host_tensors_are_refused_by_a_cuda_build():
    x = torch.zeros(1, 8, 1, 8)
    with pytest.raises(longattn.Error, match="q.device.*cpu.*cuda"):
        longattn.attention_forward(x, x, x)


@on_cuda
def test_inputs_written_on_another_stream_are_waited_for():
    q, k, v = (random(1, 256, 2, 64, dtype=torch.float32) for _ in range(3))
    want = attention(q, k, v, causal=True)
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.cuda._sleep(200_000_000)  # about 0.1 s of GPU time before q's copy is written
        late = q * 1
        got = attention(late, k, v, causal=True)
    torch.cuda.synchronize()
    assert torch.equal(got, want)
