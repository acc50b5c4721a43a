"""longattn's Python functions on numpy arrays against the float64 references (reference.py):
fresh random inputs, odd sizes, both causal settings, gradients by finite differences."""
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import longattn
import reference

if longattn.memory_device() != "cpu":
    pytest.skip(f"this build's kernels read {longattn.memory_device()} memory, not numpy arrays' (test_torch.py "
                "runs there)", allow_module_level=True)

rng = np.random.default_rng()


def random(*shape, dtype=np.float64):
    return (rng.random(shape) * 2 - 1).astype(dtype)


def relative_error(got, want):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return np.abs(got - want).max() / max(np.abs(want).max(), 1e-30)


def check_lse(got, want):
    assert np.array_equal(np.isinf(got), np.isinf(want))
    finite = np.isfinite(want)
    assert np.allclose(got[finite], want[finite], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype,tolerance", [(np.float32, 2e-5), (np.float64, 1e-12), (np.float16, 3e-3)])
def test_dense_forward(causal, dtype, tolerance):
    q, k, v = (random(2, 77, 3, 40, dtype=dtype) for _ in range(3))
    o, lse = longattn.attention_forward(q, k, v, causal=causal)
    want_o, want_lse = reference.attention(q, k, v, causal)
    assert o.dtype == dtype and o.shape == q.shape
    assert lse.dtype == (np.float64 if dtype == np.float64 else np.float32) and lse.shape == (2, 3, 77)
    assert relative_error(o, want_o) < tolerance
    check_lse(lse, want_lse)


@pytest.mark.parametrize("causal", [False, True])
def test_queries_and_keys_of_different_lengths_with_offsets(causal):
    q = random(1, 45, 2, 24)
    k, v = random(1, 131, 2, 24), random(1, 131, 2, 24)
    o, lse = longattn.attention_forward(q, k, v, causal=causal, softmax_scale=0.3, query_offset=100, key_offset=17)
    want_o, want_lse = reference.attention(q, k, v, causal, 0.3, query_offset=100, key_offset=17)
    assert relative_error(o, want_o) < 1e-12
    check_lse(lse, want_lse)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("mode", ["longnet", "head_groups"])
def test_dilated_forward(causal, mode):
    q, k, v = (random(2, 203, 5, 32) for _ in range(3))
    w, r = [32, 64, 128], [1, 2, 4]
    o, lse = longattn.attention_forward(q, k, v, attention=longattn.dilated(w, r, mode), causal=causal)
    fn = reference.dilated_longnet if mode == "longnet" else reference.dilated_head_groups
    want_o, want_lse = fn(q, k, v, w, r, causal)
    assert relative_error(o, want_o) < 1e-12
    check_lse(lse, want_lse)


@pytest.mark.parametrize("causal", [False, True])
def test_block_sparse_pattern_and_caller_mask(causal):
    q, k, v = (random(1, 300, 2, 16, dtype=np.float32) for _ in range(3))
    block = longattn.block_size(q)
    blocks = reference.local_window_blocks(block, 300, 300, 100)
    want_o, want_lse = reference.attention(q, k, v, causal, keep=reference.token_mask(blocks, block, 300, 300))
    o, lse = longattn.attention_forward(q, k, v, attention="block_sparse:pattern=local_window;radius=100",
                                        causal=causal)
    assert relative_error(o, want_o) < 2e-5
    check_lse(lse, want_lse)

    # A caller's mask, one pattern per head, the diagonal kept (no empty rows) plus random blocks.
    count = (300 + block - 1) // block
    mask = (rng.random((1, 2, count, count)) < 0.4) | np.eye(count, dtype=bool)
    o, lse = longattn.attention_forward(q, k, v, causal=causal, block_mask=mask)
    want_o, want_lse = reference.attention(q, k, v, causal, keep=reference.token_mask(mask, block, 300, 300))
    assert relative_error(o, want_o) < 2e-5
    check_lse(lse, want_lse)


def finite_difference_checks(f, tensors, grads, d_o, samples=48, step=1e-6):
    """Compares grads with d sum(d_o * f(tensors)) / d tensors by central differences (float64)
    at `samples` random elements of each tensor; returns the largest relative error."""
    worst = 0.0
    for t, g in zip(tensors, grads):
        scale = max(np.abs(g).max(), 1e-30)
        for flat in rng.choice(t.size, size=min(samples, t.size), replace=False):
            index = np.unravel_index(flat, t.shape)
            saved = t[index]
            t[index] = saved + step
            plus = np.sum(d_o * f(*tensors))
            t[index] = saved - step
            minus = np.sum(d_o * f(*tensors))
            t[index] = saved
            worst = max(worst, abs((plus - minus) / (2 * step) - g[index]) / scale)
    return worst


CASES = {
    "dense": dict(attention="dense"),
    "dilated longnet": dict(attention="dilated:w=8,16;r=1,2"),
    "dilated head_groups": dict(attention="dilated:w=8,16;r=1,2;mode=head_groups"),
    "block_sparse": dict(attention="block_sparse:pattern=local_window;radius=4"),
}


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("case", sorted(CASES))
def test_backward_against_finite_differences(case, causal):
    q, k, v, d_o = (random(1, 19, 2, 8) for _ in range(4))
    config = dict(CASES[case], causal=causal)
    o, lse = longattn.attention_forward(q, k, v, **config)
    grads = longattn.attention_backward(q, k, v, o, lse, d_o, **config)
    forward = lambda *x: longattn.attention_forward(*x, **config)[0]  # noqa: E731
    assert finite_difference_checks(forward, [q, k, v], grads, d_o) < 1e-6


def test_inputs_are_read_in_place_and_strided_views_are_not_copied():
    base = random(2, 64, 4, 32, dtype=np.float32)
    for array in (base, base[:, ::2], base[:, :, 1:3], base.transpose(0, 2, 1, 3)[:, :, :, :]):
        assert longattn._core.data_pointer(array) == array.__array_interface__["data"][0]
    q = base[:, ::2]  # every other token: strides, not a copy
    k, v = random(2, 32, 4, 32, dtype=np.float32), random(2, 32, 4, 32, dtype=np.float32)
    o, _ = longattn.attention_forward(q, k, v)
    assert relative_error(o, reference.attention(q, k, v)[0]) < 2e-5


def test_bad_arguments_name_what_was_expected():
    q = random(1, 16, 2, 8, dtype=np.float32)
    with pytest.raises(longattn.Error, match="q.dtype.*int32"):
        longattn.attention_forward(q.astype(np.int32), q, q)
    with pytest.raises(longattn.Error, match="k.dtype.*float64"):
        longattn.attention_forward(q, q.astype(np.float64), q)
    with pytest.raises(longattn.Error, match="q.ndim.*3"):
        longattn.attention_forward(q[0], q[0], q[0])
    with pytest.raises(longattn.Error, match="k's extents"):
        longattn.attention_forward(q, q[:, :, :1], q)
    with pytest.raises(longattn.Error, match="spec"):
        longattn.attention_forward(q, q, q, attention="dilated:w=8;r=3")
    with pytest.raises(longattn.Error, match="block_mask.shape"):
        longattn.attention_forward(q, q, q, block_mask=np.ones((1, 1, 5, 5), bool))
    with pytest.raises(longattn.Error, match="mode"):
        longattn.dilated([8], [1], mode="sideways")
    o = np.empty((1, 16, 2, 8), np.float32)[:, ::1, :, :]
    lse = np.empty((1, 2, 32), np.float32)[:, :, ::2]  # not contiguous: outputs must be
    with pytest.raises(longattn.Error, match="lse.strides"):
        longattn._core.forward(q, q, q, o, lse, longattn.AttentionSpec("dense"), False, None, 0, 0, None)
    with pytest.raises(longattn.Error, match="overlapping"):
        longattn._core.forward(q, q, q, q, np.empty((1, 2, 16), np.float32), longattn.AttentionSpec("dense"),
                               False, None, 0, 0, None)


def test_forward_timed_in_cpp_writes_the_forward_results():
    q, k, v = (random(1, 70, 2, 16, dtype=np.float32) for _ in range(3))
    o, lse = np.zeros_like(q), np.zeros((1, 2, 70), np.float32)
    seconds = longattn._core.forward_seconds(q, k, v, o, lse, longattn.AttentionSpec("dense"), True, 3)
    assert seconds > 0
    want_o, want_lse = longattn.attention_forward(q, k, v, causal=True)
    assert np.array_equal(o, want_o) and np.array_equal(lse, want_lse)
    with pytest.raises(longattn.Error, match="calls.*0.*positive"):
        longattn._core.forward_seconds(q, k, v, o, lse, longattn.AttentionSpec("dense"), True, 0)


def test_the_gil_is_released_while_kernels_run():
    q, k, v = (random(1, 4096, 8, 64, dtype=np.float32) for _ in range(3))
    longattn.attention_forward(q[:, :64], k[:, :64], v[:, :64])  # Kokkos started
    done = threading.Event()
    worker = threading.Thread(target=lambda: (longattn.attention_forward(q, k, v), done.set()))
    began = time.perf_counter()
    worker.start()
    counted = 0
    while not done.is_set():
        counted += 1
        time.sleep(0)
    worker.join()
    elapsed = time.perf_counter() - began
    # While the kernels ran (tens of ms or more) this thread kept the interpreter: a held GIL
    # lets it count a handful at most, at the thread switches around the call.
    assert elapsed > 0.01 and counted > 100, (elapsed, counted)


def test_kokkos_starts_once_and_stops_at_exit():
    code = ("import numpy as np, longattn; x = np.ones((1, 8, 1, 8), np.float32); "
            "longattn.attention_forward(x, x, x); longattn.initialize(threads=1); "
            "print(longattn._core.is_initialized(), longattn._core.concurrency())")
    env = dict(os.environ, OMP_NUM_THREADS="2")
    env.pop("OMP_PROC_BIND", None)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "2"]  # the second initialize changed nothing
    assert "Kokkos" not in done.stderr and "OMP_PROC_BIND" not in done.stderr, done.stderr
