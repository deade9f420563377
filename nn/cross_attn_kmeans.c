// k-means cross-attention for DETR's decoder (issue #17; docs/kmeans_cross_attention.md), after
// kMaX-DeepLab's k-means cross-attention: bytedance/kmax-deeplab (commit f8e1d04),
// kmax_deeplab/modeling/transformer_decoder/kmax_transformer_decoder.py, kMaXTransformerLayer.forward
// (the PyTorch port of google-research/deeplab2 model/layers/dual_path_transformer.py):
//
//   with torch.no_grad():
//       clustering_result = mask_logits.flatten(2).detach()        # N L HW
//       index = clustering_result.max(1, keepdim=True)[1]           # argmax over the clusters
//       clustering_result = zeros_like(...).scatter_(1, index, 1.0)  # one-hot per pixel
//   kmeans_update = einsum('blm,bdm->bdl', clustering_result, pixel_value)   # sum per cluster
//   kmeans_update = batch_norm(kmeans_update); conv3_bn(...); query += drop_path(...)
//
// Here, with DETR's cross-attention parameters (multihead_attn.in_proj_*, out_proj) so DETR weights
// load, per head h:  logits = q_h k_h^T / sqrt(hd) [Lq, Lk] (the softmax path's logits);
// A[q, l] = [q = argmax_q' logits[q', l]] / n_q for unpadded pixels l (0 for padded ones), with
// n_q the pixels assigned to q (the mean: DETR has no batch norm after the update, see the doc);
// out = merge_h(A v_h) W_o^T + b_o. The assignment is a constant, as in kMaX: gradients reach v
// (in_proj's value rows and bias, the memory) and out_proj, never q or k (in kMaX those are trained
// by the mask losses on mask_logits, which box detection does not have).
#include <math.h>

#include "nn/layers.h"

Tensor *kmeans_cross_attention_assign(const MultiheadAttention *a, Tensor *query, Tensor *key, Tensor *key_padding_mask,
                                      Tensor **winners) {
  int64_t h = a->heads, hd = a->dim / h;
  bool was = autograd_set_grad_enabled(false);  // kMaX: `with torch.no_grad()`; nothing is taped
  Tensor *q = op_mul_scalar(mha_project(a, query, 0), 1.0f / sqrtf((float)hd));
  Tensor *logits = op_bmm(mha_split_heads(q, h), mha_split_heads(mha_project(a, key, 1), h), false, true);
  // The mask row of image b serves its h heads.
  Tensor *assign = op_cluster_argmax(logits, key_padding_mask, true, winners);  // [B*h, Lq, Lk]
  autograd_set_grad_enabled(was);
  return assign;
}

Tensor *kmeans_cross_attention_update(const MultiheadAttention *a, Tensor *assign, Tensor *value) {
  int64_t B = value->shape.d[0];
  Tensor *vh = mha_split_heads(mha_project(a, value, 2), a->heads);  // [B*h, Lk, hd]
  Tensor *out = op_bmm(assign, vh, false, false);                    // [B*h, Lq, hd]
  return linear_forward(&a->out_proj, mha_merge_heads(out, B));
}

Tensor *kmeans_cross_attention(const MultiheadAttention *a, const NnCtx *ctx, Tensor *query, Tensor *key, Tensor *value,
                               Tensor *key_padding_mask, Tensor **weights) {
  (void)ctx;  // no dropout on the assignment (kMaX drops the whole update: drop_path)
  Tensor *assign = kmeans_cross_attention_assign(a, query, key, key_padding_mask, NULL);
  if (weights) *weights = attention_head_mean(assign, value->shape.d[0]);
  return kmeans_cross_attention_update(a, assign, value);
}
