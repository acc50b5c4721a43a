// Named bundles of the tensors of one attention call, so that a call site reads as what it
// passes instead of a dozen positional views:
//
//   ring_attention_backward(ctx, plan, AttentionInputs{q, k, v}, AttentionOutputs{o, lse}, d_o,
//                           AttentionGradients{dq, dk, dv}, opts);
//
// Each member is a view (any type the function accepts); a bundle holds handles, not copies.
#pragma once

namespace longattn {

// The tensors of one attention call: inputs q [B, Nq, H, D], k and v [B, Nk, H, D]; outputs o
// [B, Nq, H, D] and lse [B, H, Nq]; gradients dq, dk, dv shaped as q, k, v.
template <class Q, class K = Q, class V = Q>
struct AttentionInputs {
  Q q;
  K k;
  V v;
};
template <class Q, class K, class V>
AttentionInputs(Q, K, V) -> AttentionInputs<Q, K, V>;

template <class O, class Lse>
struct AttentionOutputs {
  O o;
  Lse lse;
};
template <class O, class Lse>
AttentionOutputs(O, Lse) -> AttentionOutputs<O, Lse>;

template <class DQ, class DK = DQ, class DV = DQ>
struct AttentionGradients {
  DQ dq;
  DK dk;
  DV dv;
};
template <class DQ, class DK, class DV>
AttentionGradients(DQ, DK, DV) -> AttentionGradients<DQ, DK, DV>;

}  // namespace longattn
