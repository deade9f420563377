#!/usr/bin/python3
"""Parity of `detr step --set decoder_cross_attn=kmeans` with the reference DETR (facebookresearch/detr)
whose decoder cross-attention is replaced by a PyTorch k-means cross-attention written from kMaX-DeepLab.

The cited code: bytedance/kmax-deeplab (commit f8e1d04),
kmax_deeplab/modeling/transformer_decoder/kmax_transformer_decoder.py, kMaXTransformerLayer.forward:

    with torch.no_grad():
        clustering_result = prediction_result['mask_logits'].flatten(2).detach()  # N L HW
        index = clustering_result.max(1, keepdim=True)[1]
        clustering_result = torch.zeros_like(clustering_result).scatter_(1, index, 1.0)
    kmeans_update = torch.einsum('blm,bdm->bdl', clustering_result.float(), pixel_value.float())

KMeansCrossAttention below does exactly that per head, with DETR's own projections as the cluster
logits (q k^T / sqrt(hd), clusters = the object queries, pixels = the memory) and values, and the two
changes docs/kmeans_cross_attention.md argues for: padded pixels are assigned to no cluster, and the
sum is divided by the cluster's pixel count (DETR has no batch norm after the update). Every decoder
layer's `multihead_attn` is replaced (its weights kept), the rest is the reference's own code
(imported at run time by tools/parity_step.py). The comparison - outputs, matches, every loss term,
every gradient - is parity_step.compare (the parity rule of tools/parity_step.py).

Because the argmax is not differentiable, a pixel whose two best queries are within rounding of each
other could be assigned differently by two float32 implementations; the script prints the smallest
top-1/top-2 logit gap over the unpadded pixels and whether float32 and float64 assign identically.

  /usr/bin/python3 tools/parity_kmeans.py --detr-repo /tmp/detr-ref [--detr build/detr] [--preset tiny]

Runs without and with padding; exit status 0 when both pass.
"""
import argparse
import os
import sys
import tempfile

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import parity_step  # noqa: E402


class KMeansCrossAttention(parity_step.InProjAttention):
    """What TransformerDecoderLayer calls as multihead_attn(query, key, value, attn_mask, key_padding_mask)
    (sequence-first [L, B, d]); DETR's parameter names (parity_step.InProjAttention)."""

    def __init__(self, d, nhead):
        super().__init__(d, nhead)
        self.last_index, self.last_gap = None, None

    def forward(self, query, key, value, attn_mask=None, key_padding_mask=None, need_weights=False):
        assert attn_mask is None
        q_in, k_in, v_in = (t.transpose(0, 1) for t in (query, key, value))  # [B, L, d]
        B, Lq, d = q_in.shape
        Lk, h, hd = k_in.shape[1], self.num_heads, self.head_dim

        def heads(t):
            return t.reshape(B, -1, h, hd).transpose(1, 2)  # [B, h, L, hd]

        q, k, v = heads(self.proj(q_in, 0) * hd ** -0.5), heads(self.proj(k_in, 1)), heads(self.proj(v_in, 2))
        # k-means assignment (kMaXTransformerLayer.forward): a one-hot of the argmax over the clusters
        # (here the queries, dim 2) for every pixel, under no_grad.
        with torch.no_grad():
            clustering_result = torch.einsum('bhqc,bhkc->bhqk', q, k).detach()  # [B, h, Lq, Lk]
            top2 = clustering_result.topk(2, dim=2).values if Lq > 1 else None
            index = clustering_result.max(2, keepdim=True)[1]
            clustering_result = torch.zeros_like(clustering_result).scatter_(2, index, 1.0)
            valid = torch.ones(B, Lk, dtype=torch.bool) if key_padding_mask is None else ~key_padding_mask
            clustering_result = clustering_result * valid[:, None, None, :].to(clustering_result.dtype)  # padded: no cluster
            # detr-c's normalisation: the mean over the cluster's pixels (kMaX: the sum, then batch norm).
            clustering_result = clustering_result / clustering_result.sum(-1, keepdim=True).clamp(min=1.0)
            self.last_index = torch.where(valid[:, None, :], index[:, :, 0, :], torch.full_like(index[:, :, 0, :], -1))
            if top2 is not None:
                gap = (top2[:, :, 0] - top2[:, :, 1]).masked_fill(~valid[:, None, :], float("inf"))
                self.last_gap = float(gap.min())
        # k-means update: einsum('blm,bdm->bdl', clustering_result, pixel_value), per head.
        kmeans_update = torch.einsum('bhqk,bhkc->bhqc', clustering_result, v)
        out = self.out_proj(kmeans_update.transpose(1, 2).reshape(B, Lq, d))
        return out.transpose(0, 1), None


def install(model, p):
    mods = []
    for layer in model.transformer.decoder.layers:
        m = KMeansCrossAttention(p["hidden"], p["heads"])
        m.load_state_dict(layer.multihead_attn.state_dict())
        layer.multihead_attn = m
        mods.append(m)
    return mods


def run(args, padding, size):
    p = parity_step.PRESETS[args.preset]
    model, criterion, weight_dict = parity_step.build_reference(args.detr_repo, p, args.seed)
    mods = install(model, p)
    images, mask, targets = parity_step.make_batch(p, padding, args.seed, size)
    model.eval()
    work = os.path.join(args.keep, "pad" if padding else "nopad") if args.keep else tempfile.mkdtemp(prefix="detr-kmeans-")
    wpath, bpath, opath = parity_step.write_inputs(work, model.state_dict(), images, mask, targets)
    ours = parity_step.run_step(args.detr, args.preset, wpath, bpath, opath, ["decoder_cross_attn=kmeans"])
    ref32, indices = parity_step.reference_run(model, criterion, weight_dict, images, mask, targets, torch.float32)
    idx32, gaps = [m.last_index.clone() for m in mods], [m.last_gap for m in mods]
    ref64, _ = parity_step.reference_run(model, criterion, weight_dict, images, mask, targets, torch.float64)
    same = all(bool((a == m.last_index).all()) for a, m in zip(idx32, mods))
    title = (f"parity decoder_cross_attn=kmeans {args.preset} {size[0]}x{size[1]} padding={padding} "
             f"(torch {torch.__version__}; files in {work})")
    ok, groups = parity_step.compare(ours, ref32, ref64, indices, args.tol, title)
    padded = sum(int((i < 0).sum()) for i in idx32)
    print(f"  assignment: smallest top-1/top-2 logit gap per layer {['%.2e' % g for g in gaps]}; float32 and float64 "
          f"references assign identically: {same}; padded (head, pixel) pairs assigned to none: {padded}")
    return ok


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--detr-repo", required=True)
    ap.add_argument("--preset", default="tiny", choices=sorted(parity_step.PRESETS))
    ap.add_argument("--detr", default="build/detr")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--size", default="96x128")
    ap.add_argument("--tol", type=float, default=1e-4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--keep", default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    size = tuple(int(v) for v in args.size.split("x"))
    results = [run(args, padding, size) for padding in (False, True)]
    print("\nsummary: no padding", "PASS" if results[0] else "FAIL", "| padding", "PASS" if results[1] else "FAIL")
    sys.exit(0 if all(results) else 1)


if __name__ == "__main__":
    main()
