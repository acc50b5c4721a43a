"""longattn-train's model in PyTorch, layer for layer, for the comparison scripts (torch only here).

Parameters are longattn-train's groups (apps/train/include/longattn/train/model.hpp), by the same
names and layouts: a LayerNorm is one [2, E] tensor (gamma, then beta), W_qkv is [3E, E] (rows q,
k, v), Linear weights are [out, in]. The step:

  x = tok[ids] (+ pos[t] with learned positions)
  each block: h1 = LN(x); Q, K, V = h1 W_qkv^T + b_qkv (rotary: Q, K turned by their positions);
              A = causal softmax(Q K^T / sqrt(D)) V; x2 = x + LN_sub(A) W_out^T + b_out;
              h2 = LN(x2); x = x2 + GELU_tanh(h2 W1^T + b1) W2^T + b2
  logits = LN(x) W_head^T + b_head; loss = sum_r weight_r CE(logits_r, target_r) / sum of weights

AdamW is longattn's formula (optimizer.hpp), written out rather than torch.optim.AdamW's, so the
two sides differ only in rounding: global-norm clipping, bias-corrected moments, decoupled decay on
the groups longattn decays, its warmup and cosine schedule.
"""
import math

VOCAB = 256


def shape(name, embed, context):
    """The [rows, cols] (or [count]) of longattn-train's parameter group `name`."""
    E, F, V = embed, 4 * embed, VOCAB
    leaf = name.split(".", 1)[1] if name.startswith("layer") else name
    shapes = {
        "head.norm": (2, E), "head.weight": (V, E), "head.bias": (V,),
        "mlp.w2": (E, F), "mlp.b2": (E,), "mlp.w1": (F, E), "mlp.b1": (F,), "norm2": (2, E),
        "attention.w_out": (E, E), "attention.b_out": (E,), "attention.sub_norm": (2, E),
        "attention.w_qkv": (3 * E, E), "attention.b_qkv": (3 * E,), "norm1": (2, E),
        "embedding.tokens": (V, E), "embedding.positions": (context, E),
    }
    return shapes[leaf]


def random_parameters(torch, layers, embed, context, positions="learned", generator=None):
    """Parameters of the model's shapes, GPT-2-like random values (for timing only)."""
    names = ["embedding.tokens"] + (["embedding.positions"] if positions == "learned" else [])
    for l in range(layers):
        names += [f"layer{l}.{leaf}" for leaf in ("norm1", "attention.w_qkv", "attention.b_qkv", "attention.sub_norm",
                                                  "attention.w_out", "attention.b_out", "norm2", "mlp.w1",
                                                  "mlp.b1", "mlp.w2", "mlp.b2")]
    names += ["head.norm", "head.weight", "head.bias"]
    out = {}
    for name in names:
        s = shape(name, embed, context)
        if name.endswith("norm") or name.endswith("norm1") or name.endswith("norm2"):
            value = torch.stack([torch.ones(embed), torch.zeros(embed)])
        elif len(s) == 1:
            value = torch.zeros(s)
        else:
            value = torch.randn(s, generator=generator) * 0.02
        out[name] = value
    return out


def rotate(torch, x, positions, base=10000.0):
    """Rotary embedding of x [B, H, n, D] (rotary.hpp's layout: pairs (i, i + D/2)); angles in double."""
    D = x.shape[-1]
    inverse = base ** (-2.0 * torch.arange(D // 2, dtype=torch.float64) / D)
    angles = positions.to(torch.float64)[:, None] * inverse[None, :]
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    x0, x1 = x[..., : D // 2], x[..., D // 2:]
    return torch.cat([x0 * cos - x1 * sin, x1 * cos + x0 * sin], dim=-1)


def loss(torch, p, ids, targets, weights, layers, heads, positions, dtype):
    """The weighted mean cross-entropy of the batch, parameters `p` (name -> tensor) cast to dtype."""
    F = torch.nn.functional
    w = {name: value.to(dtype) for name, value in p.items()}
    B, n = ids.shape
    E = w["embedding.tokens"].shape[1]
    D = E // heads
    t = torch.arange(n, device=ids.device)

    def norm(x, name):
        return F.layer_norm(x, (E,), w[name][0], w[name][1], 1e-5)

    x = w["embedding.tokens"][ids]
    if positions == "learned":
        x = x + w["embedding.positions"][t]
    for l in range(layers):
        a = f"layer{l}."
        q, k, v = F.linear(norm(x, a + "norm1"), w[a + "attention.w_qkv"], w[a + "attention.b_qkv"]).split(E, dim=2)
        q, k, v = (y.view(B, n, heads, D).transpose(1, 2) for y in (q, k, v))
        if positions == "rotary":
            q, k = rotate(torch, q, t), rotate(torch, k, t)
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, n, E)
        x = x + F.linear(norm(att, a + "attention.sub_norm"), w[a + "attention.w_out"], w[a + "attention.b_out"])
        u = F.linear(norm(x, a + "norm2"), w[a + "mlp.w1"], w[a + "mlp.b1"])
        x = x + F.linear(F.gelu(u, approximate="tanh"), w[a + "mlp.w2"], w[a + "mlp.b2"])
    logits = F.linear(norm(x, "head.norm"), w["head.weight"], w["head.bias"]).float()
    per_token = F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1), reduction="none")
    return (per_token * weights.reshape(-1)).sum() / weights.sum()


def learning_rate(lr, min_lr, warmup, step, steps):
    """optimizer.cpp's learning_rate: linear warmup, then cosine decay to min_lr."""
    if step < warmup:
        return lr * (step + 1) / warmup
    decay = steps - warmup
    progress = min(1.0, (step - warmup) / decay) if decay > 0 else 1.0
    return min_lr + (lr - min_lr) * 0.5 * (1 + math.cos(math.pi * progress))


class AdamW:
    """optimizer.hpp's AdamW on fp32 master weights (name -> tensor); `decay` names those it decays."""

    def __init__(self, torch, master, decay, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1, clip=1.0):
        self.torch, self.master, self.decay = torch, master, decay
        self.beta1, self.beta2, self.eps, self.weight_decay, self.clip = beta1, beta2, eps, weight_decay, clip
        self.m = {k: torch.zeros_like(v) for k, v in master.items()}
        self.v = {k: torch.zeros_like(v) for k, v in master.items()}
        self.steps = 0

    def step(self, gradients, lr):
        """Updates the master weights; returns the gradient norm before clipping."""
        torch = self.torch
        norm = math.sqrt(sum(float((g.double() ** 2).sum()) for g in gradients.values()))
        scale = self.clip / norm if self.clip > 0 and norm > self.clip else 1.0
        self.steps += 1
        c1 = 1 / (1 - self.beta1 ** self.steps)
        c2 = 1 / (1 - self.beta2 ** self.steps)
        with torch.no_grad():
            for name, w in self.master.items():
                g = gradients[name].float() * scale
                m, v = self.m[name], self.v[name]
                m.mul_(self.beta1).add_((1 - self.beta1) * g)
                v.mul_(self.beta2).add_((1 - self.beta2) * g * g)
                decay = self.weight_decay if name in self.decay else 0.0
                w.sub_(lr * (m * c1 / ((v * c2).sqrt() + self.eps) + decay * w))
        return norm
