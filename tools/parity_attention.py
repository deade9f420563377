#!/usr/bin/python3
"""Parity of `detr step --set encoder_attn=VARIANT` with the reference DETR whose encoder self-attention
is replaced by a PyTorch module written from the variant's official code (docs/attention_sources.md).

For each variant: the reference DETR (facebookresearch/detr, a checkout given by --detr-repo, imported
at run time as tools/parity_step.py does) is built from a seed, every encoder layer's `self_attn`
is replaced by the variant's module (it takes what TransformerEncoderLayer gives `self_attn`:
q = k = src + pos, value = src, key_padding_mask, [HW, B, d] sequence-first; it keeps DETR's
`in_proj_weight`, `in_proj_bias`, `out_proj.*` and adds the variant's parameters under `self_attn.`),
its state_dict and a random batch are written as safetensors, `detr step --no-dropout --set
encoder_attn=VARIANT` runs, and outputs, matches, loss terms and every parameter gradient are
compared with the parity rule of parity_step.py (1e-4 max-relative or normwise against the float32
reference, or within twice the float32 reference's own normwise distance to float64).

  /usr/bin/python3 tools/parity_attention.py --detr-repo DIR --preset tiny --variant focused [--padding]
                   [--both] [--detr build/detr] [--sra-ratio R] [--enact-sigma S] [--focused-z mean|sum]
                   [--swin-window W] [--swin-no-shift]
                   [--set k=v ...] [--size HxW] [--seed N] [--keep DIR]
  /usr/bin/python3 tools/parity_attention.py --self-test [--official-root DIR]

`--variant all` runs every variant; `--both` runs each without and with padding and prints a table.

The modules (efficient, hydra, focused, sra, enact, swin; dense is DETR's own nn.MultiheadAttention):
  efficient  cmsflash/efficient-attention EfficientAttention: per head softmax over the head's channels
             of each query, softmax over the valid positions of each key channel, rho_q(q) (rho_k(k)^T v).
  hydra      the paper's listing: phi = L2 normalisation over all d channels (no eps); sum over valid t
             of phi(k_t) * v_t; out = phi(q) * kv.
  focused    FLatten FocusedLinearAttention (flatten_pvt.py, sr_ratio 1, focusing factor 3, DWC kernel 5),
             the official mean form z = 1 / (q . mean_t k + 1e-6), kv = k^T v / n with n = the image's
             valid keys (--focused-z sum: z = 1 / (q . sum_t k + 1e-6), kv = k^T v); padded key rows and
             padded pixels of the DWC input zeroed; no learnt positional_encoding.
  sra        PVT Attention: K from LayerNorm(Conv_RxR/R(k_in)), V from the same conv + norm of v_in
             (padded pixels zeroed, map zero-padded bottom/right to a multiple of R; a reduced cell with
             no valid pixel is a masked key); LayerNorm eps 1e-5; with R = 1 no sr/norm (dense).
  enact      docs/enact.md: W_prob, H = -p log2(p + 1e-8), Gaussian smoothing (sigma 3, 2-D), clustering
             weights softmax(Hsm) per region, MHA over each image's clusters. The regions are read from
             detr-c's output (enact.{l}.region_starts/lengths); the smoothed maps enact.{l}.entropy are
             compared too, and regions computed from the reference's own maps are reported.
  swin       microsoft/Swin-Transformer WindowAttention + SwinTransformerBlock (roll by -W/2 on odd layers,
             window_partition, the -100 attn_mask, window_reverse), the map zero-padded bottom/right to a
             multiple of W as torchvision's shifted_window_attention; DETR and window padding masked as keys.
Extra parameters are initialised away from their official init so that they are exercised: focused
`scale` ~ N(0, 0.3) (official 0), sra `norm` weight 1 + N(0, 0.1), bias N(0, 0.1) (official 1, 0), swin
`relative_position_bias_table` N(0, 0.5) (official trunc_normal std .02).

--self-test checks the modules alone in float64 (no detr binary needed): sra with R = 1 equals
nn.MultiheadAttention, values at padded pixels do not change outputs at valid pixels, gradcheck of
every module; swin against torchvision 0.14's shifted_window_attention (outputs and the gradients of the
input, in_proj, out_proj and the bias table, maps that are and are not multiples of the window), and an image
alone against the same image in a batch that pads it; with --official-root DIR (holding efficient-attention/,
FLatten-Transformer/, PVT/ and optionally Swin-Transformer/ checkouts) each module also equals the official
class on an unpadded input with q = k = v inputs.
Needs Debian's python3-torch, python3-torchvision, python3-scipy.
"""
import argparse
import math
import os
import sys
import tempfile
import types
import warnings

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import parity_step  # noqa: E402  (write/read safetensors, the reference model, the batch, the comparison)

warnings.filterwarnings("ignore", message="scatter_reduce")
VARIANTS = ["dense", "efficient", "hydra", "focused", "sra", "enact", "swin"]


# ----------------------------------------------------------------------------------------------------
# The encoder self-attention modules.


class EncoderAttention(parity_step.InProjAttention):
    """What TransformerEncoderLayer calls as self_attn(q, k, value=src, attn_mask, key_padding_mask).

    Carries DETR's parameter names (parity_step.InProjAttention). Subclasses implement attend(q_in, k_in,
    v_in, valid) on batch-first [B, N, d] inputs, valid [B, N] bool, and return the heads' concatenation
    [B, N, d] before out_proj. The feature map's (H, W) is set in `hw` by a pre-hook on the transformer."""

    def __init__(self, d, nhead):
        super().__init__(d, nhead)
        self.hw = None

    def forward(self, query, key, value, attn_mask=None, key_padding_mask=None, need_weights=False):
        assert attn_mask is None, "the encoder has no attention mask"
        q_in, k_in, v_in = (t.transpose(0, 1) for t in (query, key, value))  # [B, N, d]
        B, N, _ = q_in.shape
        if key_padding_mask is None:
            valid = torch.ones(B, N, dtype=torch.bool, device=q_in.device)
        else:
            valid = ~key_padding_mask
        assert self.hw is not None and self.hw[0] * self.hw[1] == N, "feature map size not set"
        out = self.out_proj(self.attend(q_in, k_in, v_in, valid))
        return out.transpose(0, 1), None


def masked_mha(q, k, v, key_valid, nhead):
    """Scaled dot-product attention per head, q [B, N, d], k, v [B, M, d] (projected), key_valid [B, M]."""
    B, N, d = q.shape
    M, hd = k.shape[1], d // nhead
    q = q.reshape(B, N, nhead, hd).transpose(1, 2)
    k = k.reshape(B, M, nhead, hd).transpose(1, 2)
    v = v.reshape(B, M, nhead, hd).transpose(1, 2)
    attn = (q * hd ** -0.5) @ k.transpose(-2, -1)  # as nn.MultiheadAttention: q scaled first
    attn = attn.masked_fill(~key_valid[:, None, None, :], float("-inf")).softmax(dim=-1)
    return (attn @ v).transpose(1, 2).reshape(B, N, d)


class DenseAttention(EncoderAttention):
    """DETR's own attention (for the self-test: the same as nn.MultiheadAttention)."""

    def attend(self, q_in, k_in, v_in, valid):
        return masked_mha(self.proj(q_in, 0), self.proj(k_in, 1), self.proj(v_in, 2), valid, self.num_heads)


class EfficientAttention(EncoderAttention):
    """cmsflash/efficient-attention EfficientAttention.forward, channels-first per head as there."""

    def attend(self, q_in, k_in, v_in, valid):
        B, N, d = q_in.shape
        hk = self.head_dim
        queries = self.proj(q_in, 0).transpose(1, 2)  # [B, d, N]
        keys = self.proj(k_in, 1).transpose(1, 2).masked_fill(~valid[:, None, :], float("-inf"))
        values = self.proj(v_in, 2).transpose(1, 2)
        attended = []
        for i in range(self.num_heads):
            key = F.softmax(keys[:, i * hk:(i + 1) * hk, :], dim=2)  # over (valid) positions
            query = F.softmax(queries[:, i * hk:(i + 1) * hk, :], dim=1)  # over the head's channels
            value = values[:, i * hk:(i + 1) * hk, :]
            context = key @ value.transpose(1, 2)  # [B, hk, hv]
            attended.append(context.transpose(1, 2) @ query)  # [B, hv, N]
        return torch.cat(attended, dim=1).transpose(1, 2)  # [B, N, d]; no residual (the layer adds it)


class HydraAttention(EncoderAttention):
    """The Hydra paper's listing: h = d heads of one channel; nhead is ignored."""

    def attend(self, q_in, k_in, v_in, valid):
        q, k, v = self.proj(q_in, 0), self.proj(k_in, 1), self.proj(v_in, 2)
        q = q / q.norm(dim=-1, keepdim=True)
        k = k / k.norm(dim=-1, keepdim=True)
        k = k * valid[..., None].to(k.dtype)  # padded tokens contribute nothing
        kv = (k * v).sum(dim=-2, keepdim=True)
        return q * kv


class FocusedAttention(EncoderAttention):
    """LeapLabTHU/FLatten-Transformer FocusedLinearAttention.forward (flatten_pvt.py, sr_ratio 1)."""

    def __init__(self, d, nhead, focusing_factor=3, kernel_size=5, z_form="mean"):
        super().__init__(d, nhead)
        hd = d // nhead
        self.focusing_factor, self.z_form = focusing_factor, z_form
        self.dwc = nn.Conv2d(hd, hd, kernel_size=kernel_size, groups=hd, padding=kernel_size // 2)
        self.scale = nn.Parameter(torch.zeros(size=(1, 1, d)))

    def attend(self, q_in, k_in, v_in, valid):
        B, N, C = q_in.shape
        H, W = self.hw
        q, k, v = self.proj(q_in, 0), self.proj(k_in, 1), self.proj(v_in, 2)
        scale = F.softplus(self.scale)
        q = F.relu(q) + 1e-6
        k = F.relu(k) + 1e-6
        q = q / scale
        k = k / scale
        q_norm = q.norm(dim=-1, keepdim=True)
        k_norm = k.norm(dim=-1, keepdim=True)
        q = q ** self.focusing_factor
        k = k ** self.focusing_factor
        q = (q / q.norm(dim=-1, keepdim=True)) * q_norm
        k = (k / k.norm(dim=-1, keepdim=True)) * k_norm
        vmask = valid[..., None].to(q.dtype)
        k = k * vmask  # padded key rows zeroed
        v = v * vmask  # padded pixels of the values (and so of the DWC input) zeroed

        q = q.reshape(B, N, self.num_heads, -1).permute(0, 2, 1, 3)
        k = k.reshape(B, N, self.num_heads, -1).permute(0, 2, 1, 3)
        v = v.reshape(B, N, self.num_heads, -1).permute(0, 2, 1, 3)
        if self.z_form == "mean":  # official: mean over the (valid) keys, kv carries 1/n
            n = valid.sum(dim=1).to(q.dtype).reshape(B, 1, 1, 1)
            z = 1 / (q @ (k.sum(dim=-2, keepdim=True) / n).transpose(-2, -1) + 1e-6)
            kv = (k.transpose(-2, -1) * n ** -0.5) @ (v * n ** -0.5)
        else:  # the design's sum form
            z = 1 / (q @ k.sum(dim=-2, keepdim=True).transpose(-2, -1) + 1e-6)
            kv = k.transpose(-2, -1) @ v
        x = q @ kv * z

        x = x.transpose(1, 2).reshape(B, N, C)
        v = v.reshape(B * self.num_heads, H, W, -1).permute(0, 3, 1, 2)
        return x + self.dwc(v).reshape(B, C, N).permute(0, 2, 1)


class SRAttention(EncoderAttention):
    """whai362/PVT classification/pvt.py Attention with sr_ratio R, K and V reduced separately."""

    def __init__(self, d, nhead, sr_ratio=2):
        super().__init__(d, nhead)
        self.sr_ratio = sr_ratio
        if sr_ratio > 1:
            self.sr = nn.Conv2d(d, d, kernel_size=sr_ratio, stride=sr_ratio)
            self.norm = nn.LayerNorm(d)  # eps 1e-5, as PVT's Attention

    def reduce(self, x, valid):
        """SR(x): [B, N, d] -> [B, Hr*Wr, d]; and which reduced cells hold a valid pixel."""
        B, N, C = x.shape
        H, W, R = self.hw[0], self.hw[1], self.sr_ratio
        ph, pw = -H % R, -W % R
        x_ = (x * valid[..., None].to(x.dtype)).permute(0, 2, 1).reshape(B, C, H, W)
        x_ = F.pad(x_, (0, pw, 0, ph))
        x_ = self.sr(x_).reshape(B, C, -1).permute(0, 2, 1)
        cells = F.max_pool2d(F.pad(valid.reshape(B, 1, H, W).to(x.dtype), (0, pw, 0, ph)), R, R)
        return self.norm(x_), cells.reshape(B, -1) > 0

    def attend(self, q_in, k_in, v_in, valid):
        if self.sr_ratio > 1:
            k_in, key_valid = self.reduce(k_in, valid)
            v_in, _ = self.reduce(v_in, valid)
        else:
            key_valid = valid
        return masked_mha(self.proj(q_in, 0), self.proj(k_in, 1), self.proj(v_in, 2), key_valid, self.num_heads)


def window_partition(x, ws):
    """microsoft/Swin-Transformer window_partition: [B, H, W, C] -> [B*nW, ws, ws, C]."""
    B, H, W, C = x.shape
    x = x.view(B, H // ws, ws, W // ws, ws, C)
    return x.permute(0, 1, 3, 2, 4, 5).contiguous().view(-1, ws, ws, C)


def window_reverse(windows, ws, H, W):
    """microsoft/Swin-Transformer window_reverse: [B*nW, ws, ws, C] -> [B, H, W, C]."""
    B = int(windows.shape[0] / (H * W / ws / ws))
    x = windows.view(B, H // ws, W // ws, ws, ws, -1)
    return x.permute(0, 1, 3, 2, 4, 5).contiguous().view(B, H, W, -1)


def relative_position_index(ws):
    """WindowAttention's relative_position_index [ws^2, ws^2]."""
    coords = torch.stack(torch.meshgrid([torch.arange(ws), torch.arange(ws)], indexing="ij"))
    flat = torch.flatten(coords, 1)
    rel = (flat[:, :, None] - flat[:, None, :]).permute(1, 2, 0).contiguous()
    rel[:, :, 0] += ws - 1
    rel[:, :, 1] += ws - 1
    rel[:, :, 0] *= 2 * ws - 1
    return rel.sum(-1)


def swin_shift_mask(Hp, Wp, ws, shift):
    """SwinTransformerBlock's attn_mask [nW, ws^2, ws^2] for the (padded) map Hp x Wp: 0 / -100."""
    img_mask = torch.zeros((1, Hp, Wp, 1))
    slices = (slice(0, -ws), slice(-ws, -shift), slice(-shift, None))
    cnt = 0
    for h in slices:
        for w in slices:
            img_mask[:, h, w, :] = cnt
            cnt += 1
    mask_windows = window_partition(img_mask, ws).view(-1, ws * ws)
    attn_mask = mask_windows.unsqueeze(1) - mask_windows.unsqueeze(2)
    return attn_mask.masked_fill(attn_mask != 0, float(-100.0)).masked_fill(attn_mask == 0, float(0.0))


class SwinAttention(EncoderAttention):
    """microsoft/Swin-Transformer models/swin_transformer.py: SwinTransformerBlock's roll, window_partition,
    window_reverse and attn_mask around WindowAttention.forward (relative position bias, -100 shift mask), on
    DETR's inputs (q = k from src + pos, v from src). The map is zero-padded bottom/right to a multiple of the
    window as torchvision's shifted_window_attention does; added: keys that are DETR or window padding are
    masked (-inf), and a window with no valid key gives zero attention output. shift: ws // 2 on odd layers."""

    def __init__(self, d, nhead, window=7, shift=0):
        super().__init__(d, nhead)
        self.window, self.shift = window, shift
        self.relative_position_bias_table = nn.Parameter(torch.zeros((2 * window - 1) ** 2, nhead))
        nn.init.trunc_normal_(self.relative_position_bias_table, std=.02)
        self.index = relative_position_index(window)  # not a buffer: not in the state_dict

    def windows(self, x, Hp, Wp):
        """[B, N, C] -> padded, rolled, partitioned [B*nW, ws^2, C]."""
        B, _, C = x.shape
        H, W = self.hw
        x = F.pad(x.reshape(B, H, W, C), (0, 0, 0, Wp - W, 0, Hp - H))
        if self.shift:
            x = torch.roll(x, shifts=(-self.shift, -self.shift), dims=(1, 2))
        return window_partition(x, self.window).view(-1, self.window ** 2, C)

    def attend(self, q_in, k_in, v_in, valid):
        B, N, d = q_in.shape
        H, W = self.hw
        ws, T, nh = self.window, self.window ** 2, self.num_heads
        Hp, Wp = -(-H // ws) * ws, -(-W // ws) * ws
        q, k = self.proj(self.windows(q_in, Hp, Wp), 0), self.proj(self.windows(k_in, Hp, Wp), 1)
        v = self.proj(self.windows(v_in, Hp, Wp), 2)
        key_ok = self.windows(valid[..., None].to(q_in.dtype), Hp, Wp)[..., 0] > 0.5  # [B*nW, T]
        B_ = q.shape[0]
        q, k, v = (t.reshape(B_, T, nh, d // nh).permute(0, 2, 1, 3) for t in (q, k, v))
        attn = (q * self.head_dim ** -0.5) @ k.transpose(-2, -1)
        bias = self.relative_position_bias_table[self.index.view(-1)].view(T, T, -1).permute(2, 0, 1)
        attn = attn + bias.unsqueeze(0)
        if self.shift:
            mask = swin_shift_mask(Hp, Wp, ws, self.shift).to(attn.dtype)
            nW = mask.shape[0]
            attn = (attn.view(B_ // nW, nW, nh, T, T) + mask.unsqueeze(1).unsqueeze(0)).view(-1, nh, T, T)
        any_ok = key_ok.any(dim=-1, keepdim=True)  # a window of padding only: no mask there, output zeroed
        attn = attn.masked_fill(~(key_ok | ~any_ok)[:, None, None, :], float("-inf")).softmax(dim=-1)
        attn = attn * any_ok[:, None, :, None].to(attn.dtype)
        x = (attn @ v).transpose(1, 2).reshape(B_, T, d)
        x = window_reverse(x.view(-1, ws, ws, d), ws, Hp, Wp)
        if self.shift:
            x = torch.roll(x, shifts=(self.shift, self.shift), dims=(1, 2))
        return x[:, :H, :W, :].reshape(B, N, d)


def gaussian_taps(sigma, dtype):
    r = max(int(math.floor(3 * sigma - 1)), 0)
    x = torch.arange(-r, r + 1, dtype=torch.float64)
    return (torch.exp(-x * x / (2 * sigma * sigma)) / (sigma * math.sqrt(2 * math.pi))).to(dtype)


def curvature_regions(hsm, valid_hw, Hp, Wp):
    """detr-c's 2-D curvature sign and regions from smoothed maps [B, N] (numpy), as docs/enact.md."""
    B, N = hsm.shape
    s = np.zeros((B, Hp, Wp))
    k = np.array([[1, -2, 1], [2, -4, 2], [1, -2, 1]], np.float64)
    k = k + k.T
    for b in range(B):
        h, w = valid_hw[b]
        m = np.zeros((h + 2, w + 2))
        m[1:-1, 1:-1] = hsm[b].reshape(Hp, Wp)[:h, :w]
        c = -sum(k[dy, dx] * m[dy:dy + h, dx:dx + w] for dy in range(3) for dx in range(3))
        s[b, :h, :w] = np.where(c > 0, 1.0, -1.0)
    s = s.reshape(-1)
    starts, lengths = [], []
    for i in range(B * N):
        if s[i] == 0:
            continue
        if i % N and s[i - 1] == s[i] and lengths:
            lengths[-1] += 1
        else:
            starts.append(i)
            lengths.append(1)
    return np.array(starts, np.int64), np.array(lengths, np.int64)


class EnactAttention(EncoderAttention):
    """docs/enact.md (SPEC section 6) with detr-c's regions fed in `regions` = (starts, lengths)."""

    def __init__(self, d, nhead, sigma=3.0):
        super().__init__(d, nhead)
        self.W_prob = nn.Linear(d, 1)
        self.sigma = sigma
        self.regions = None
        self.last_entropy = None  # Hsm [B, N] of the latest forward
        self.own_regions = None

    def attend(self, q_in, k_in, v_in, valid):
        B, N, d = k_in.shape
        H, W = self.hw
        fvalid = valid.to(k_in.dtype)
        logit = self.W_prob(k_in).squeeze(-1).masked_fill(~valid, float("-inf"))
        p = logit.softmax(dim=1)
        Hmap = -p * torch.log2(p + 1e-8) * fvalid
        taps = gaussian_taps(self.sigma, k_in.dtype)
        r = taps.numel() // 2
        m = Hmap.reshape(B, 1, H, W)
        m = F.conv2d(m, taps.reshape(1, 1, 1, -1), padding=(0, r))  # along rows
        m = F.conv2d(m, taps.reshape(1, 1, -1, 1), padding=(r, 0))  # then columns
        hsm = m.reshape(B, N) * fvalid
        self.last_entropy = hsm.detach().clone()
        valid_hw = [(int(valid[b].reshape(H, W)[:, 0].sum()), int(valid[b].reshape(H, W)[0].sum())) for b in range(B)]
        self.own_regions = curvature_regions(hsm.detach().double().numpy(), valid_hw, H, W)
        starts, lengths = self.regions if self.regions is not None else self.own_regions
        L = len(starts)
        seg = torch.full((B * N,), L, dtype=torch.long)  # index L: no region (padding)
        for j, (s, n) in enumerate(zip(starts, lengths)):
            seg[s:s + n] = j
        h = hsm.reshape(-1)
        segmax = torch.full((L + 1,), -float("inf"), dtype=h.dtype).scatter_reduce(0, seg, h.detach(), "amax")
        inside = seg < L
        e = torch.where(inside, torch.exp(h - torch.where(inside, segmax[seg], torch.zeros_like(h))), torch.zeros_like(h))
        w = e / torch.where(inside, torch.zeros(L + 1, dtype=h.dtype).index_add(0, seg, e)[seg], torch.ones_like(h))
        kc = torch.zeros(L + 1, d, dtype=h.dtype).index_add(0, seg, w[:, None] * k_in.reshape(B * N, d))[:L]
        vc = torch.zeros(L + 1, d, dtype=h.dtype).index_add(0, seg, w[:, None] * v_in.reshape(B * N, d))[:L]
        image = torch.as_tensor(np.asarray(starts) // N)
        counts = torch.bincount(image, minlength=B)
        lmax = int(counts.max())
        first = torch.cumsum(counts, 0) - counts
        slot = torch.arange(L) - first[image]
        kpad = torch.zeros(B, lmax, d, dtype=h.dtype).index_put((image, slot), kc)
        vpad = torch.zeros(B, lmax, d, dtype=h.dtype).index_put((image, slot), vc)
        key_valid = torch.zeros(B, lmax, dtype=torch.bool).index_put((image, slot), torch.ones(L, dtype=torch.bool))
        return masked_mha(self.proj(q_in, 0), self.proj(kpad, 1), self.proj(vpad, 2), key_valid, self.num_heads)


def make_module(variant, d, nhead, args, gen, layer=0):
    if variant == "swin":
        ws = args.swin_window or 7
        m = SwinAttention(d, nhead, ws, ws // 2 if layer % 2 == 1 and not args.swin_no_shift else 0)
        with torch.no_grad():  # larger than the official std .02, so that the bias matters
            m.relative_position_bias_table.copy_(0.5 * torch.randn(m.relative_position_bias_table.shape, generator=gen))
        return m
    if variant == "efficient":
        return EfficientAttention(d, nhead)
    if variant == "hydra":
        return HydraAttention(d, nhead)
    if variant == "focused":
        m = FocusedAttention(d, nhead, z_form=args.focused_z)
        with torch.no_grad():
            m.scale.copy_(torch.randn(m.scale.shape, generator=gen) * 0.3)
        return m
    if variant == "sra":
        m = SRAttention(d, nhead, args.sra_ratio or 2)
        if m.sr_ratio > 1:
            with torch.no_grad():
                m.norm.weight.copy_(1 + 0.1 * torch.randn(d, generator=gen))
                m.norm.bias.copy_(0.1 * torch.randn(d, generator=gen))
        return m
    if variant == "enact":
        return EnactAttention(d, nhead, args.enact_sigma or 3.0)
    if variant == "dense":
        return DenseAttention(d, nhead)
    raise ValueError(variant)


def install(model, variant, p, args, seed):
    """Replaces every encoder layer's self_attn (DETR's weights kept); returns the new modules."""
    if variant == "dense":
        return []
    torch.manual_seed(seed + 10)
    gen = torch.Generator().manual_seed(seed + 11)
    mods = []
    for i, layer in enumerate(model.transformer.encoder.layers):
        m = make_module(variant, p["hidden"], p["heads"], args, gen, i)
        old = layer.self_attn.state_dict()
        missing, unexpected = m.load_state_dict(old, strict=False)
        assert not unexpected and all(k not in old for k in missing), (missing, unexpected)
        layer.self_attn = m
        mods.append(m)

    def set_hw(_module, inputs):
        for m in mods:
            m.hw = tuple(inputs[0].shape[-2:])

    model.transformer.register_forward_pre_hook(set_hw)
    return mods


# ----------------------------------------------------------------------------------------------------
# The parity run.


def run_variant(args, variant, padding, size):
    p = parity_step.PRESETS[args.preset]
    decoder = args.decoder or p.get("decoder", "detr")
    model, criterion, weight_dict = parity_step.build_reference(args.detr_repo, p, args.seed, decoder)
    mods = install(model, variant, p, args, args.seed)
    images, mask, targets = parity_step.make_batch(p, padding, args.seed, size)
    model.eval()
    work = os.path.join(args.keep, f"{variant}-{'pad' if padding else 'nopad'}") if args.keep else \
        tempfile.mkdtemp(prefix=f"detr-parity-{variant}-")
    wpath, bpath, opath = parity_step.write_inputs(work, model.state_dict(), images, mask, targets)
    sets = [f"encoder_attn={variant}", f"decoder={decoder}"] + list(args.set or [])
    if variant == "sra" and args.sra_ratio:
        sets.append(f"sra_ratio={args.sra_ratio}")
    if variant == "enact" and args.enact_sigma:
        sets.append(f"enact_sigma={args.enact_sigma:.9g}")
    if variant == "swin" and args.swin_window:
        sets.append(f"swin_window={args.swin_window}")
    if variant == "swin" and args.swin_no_shift:
        sets.append("swin_shift=false")
    ours = parity_step.run_step(args.detr, args.preset, wpath, bpath, opath, sets)

    notes = []
    if variant == "enact":
        for l, m in enumerate(mods):
            m.regions = (ours[f"enact.{l}.region_starts"].astype(np.int64), ours[f"enact.{l}.region_lengths"].astype(np.int64))
    ref32, indices = parity_step.reference_run(model, criterion, weight_dict, images, mask, targets, torch.float32)
    if variant == "enact":
        for l, m in enumerate(mods):
            ref32[f"enact.{l}.entropy"] = m.last_entropy.double().numpy()
            s, n = m.own_regions
            cs, cn = m.regions
            same = len(s) == len(cs) and bool((s == cs).all() and (n == cn).all())
            notes.append(f"  enact layer {l}: {len(cs)} regions from detr-c; the reference's own regions "
                         f"{'identical' if same else f'differ ({len(s)} regions)'}")
    ref64, _ = parity_step.reference_run(model, criterion, weight_dict, images, mask, targets, torch.float64)
    if variant == "enact":
        for l, m in enumerate(mods):
            ref64[f"enact.{l}.entropy"] = m.last_entropy.double().numpy()
    notes += parity_step.drop_zero_gradients(ours, ref32, ref64, args.tol)
    title = (f"parity encoder_attn={variant} decoder={decoder} {args.preset} {size[0]}x{size[1]} padding={padding} "
             f"(torch {torch.__version__}, {args.threads} threads; files in {work})")
    ok, groups = parity_step.compare(ours, ref32, ref64, indices, args.tol, title,
                                     lambda: parity_step.reference_spread(model, criterion, weight_dict, images, mask,
                                                                          targets, ref32, indices))
    for line in notes:
        print(line)
    return ok, groups


def summarise(rows):
    print("\nsummary (max-relative ours/ref32; grads: the worst tensor)")
    print(f"  {'variant':10s} {'padding':8s} {'outputs':>9s} {'losses':>9s} {'grads':>9s}  worst gradient"
          f"{'':28s} result")
    for variant, padding, ok, groups in rows:
        outs = max((g[0] for k, g in groups.items() if "pred_" in k or k.startswith("enact.")), default=float("nan"))
        losses = max((g[0] for k, g in groups.items() if k.startswith("loss.")), default=float("nan"))
        grads = groups.get("grad.*", [float("nan")] * 5)
        print(f"  {variant:10s} {str(padding):8s} {outs:9.2e} {losses:9.2e} {grads[0]:9.2e}  {grads[4][5:]:42s} "
              f"{'PASS' if ok else 'FAIL'}")


# ----------------------------------------------------------------------------------------------------
# Self-tests of the modules (float64, no detr binary).


def _inputs(B, H, W, d, padded, gen):
    N = H * W
    src = torch.randn(B, N, d, generator=gen, dtype=torch.float64)
    pos = torch.randn(B, N, d, generator=gen, dtype=torch.float64)
    valid = torch.ones(B, H, W, dtype=torch.bool)
    if padded:
        valid[1, H - 1:, :] = False
        valid[1, :, W - 2:] = False
    return src, pos, valid.reshape(B, N)


def _call(m, src, pos, valid):
    q = (src + pos).transpose(0, 1)
    return m(q, q, src.transpose(0, 1), key_padding_mask=~valid)[0].transpose(0, 1)


def _module(variant, d, nhead, gen, sra_ratio=2, z_form="mean", swin_window=3, layer=0):
    a = types.SimpleNamespace(focused_z=z_form, sra_ratio=sra_ratio, enact_sigma=None, swin_window=swin_window,
                              swin_no_shift=False)
    m = make_module(variant, d, nhead, a, gen, layer).double()
    with torch.no_grad():
        m.in_proj_weight.copy_(torch.randn(3 * d, d, generator=gen) / math.sqrt(d))
        m.in_proj_bias.copy_(0.1 * torch.randn(3 * d, generator=gen))
    return m


def _set_regions(m, src, pos, valid, H, W):
    """Regions from the module's own map, with the key's gradient of the map ignored (fixed for gradcheck)."""
    m.regions = None
    m.hw = (H, W)
    with torch.no_grad():
        _call(m, src, pos, valid)
    m.regions = m.own_regions


def self_test(args):
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    B, H, W, d, nhead = 2, 5, 7, 8, 2
    failures = []

    def check(name, cond, detail=""):
        print(f"  {'ok  ' if cond else 'FAIL'} {name} {detail}")
        if not cond:
            failures.append(name)

    # sra with R = 1 is dense, and dense is nn.MultiheadAttention.
    for padded in (False, True):
        src, pos, valid = _inputs(B, H, W, d, padded, gen)
        ref = nn.MultiheadAttention(d, nhead).double()
        for name, m in (("sra R=1", _module("sra", d, nhead, gen, sra_ratio=1)), ("dense", _module("dense", d, nhead, gen))):
            m.load_state_dict(ref.state_dict())
            m.hw = (H, W)
            q = (src + pos).transpose(0, 1)
            want = ref(q, q, src.transpose(0, 1), key_padding_mask=~valid)[0].transpose(0, 1)
            err = (_call(m, src, pos, valid) - want).abs().max().item()
            check(f"{name} == nn.MultiheadAttention (padding={padded})", err < 1e-12, f"max diff {err:.1e}")

    variants = ["efficient", "hydra", "focused", "sra", "enact"]
    for variant in variants + ["sra3", "focused-sum"]:
        kind = variant.split("3")[0].split("-")[0]
        m = _module(kind, d, nhead, gen, sra_ratio=3 if variant == "sra3" else 2,
                    z_form="sum" if variant == "focused-sum" else "mean")
        m.hw = (H, W)
        src, pos, valid = _inputs(B, H, W, d, True, gen)
        if kind == "enact":
            _set_regions(m, src, pos, valid, H, W)
        # Values at padded pixels do not reach valid outputs.
        out = _call(m, src, pos, valid)
        src2, pos2 = src.clone(), pos.clone()
        src2[~valid] += 5 * torch.randn(int((~valid).sum()), d, generator=gen, dtype=torch.float64)
        pos2[~valid] -= 3.0
        out2 = _call(m, src2, pos2, valid)
        err = (out - out2)[valid].abs().max().item()
        check(f"{variant}: padded inputs do not change valid outputs", err < 1e-12, f"max diff {err:.1e}")
        # Padding an image more (same valid pixels) changes nothing for sra's cells / focused's DWC borders:
        # the unpadded image 0 must give the same result alone as in the batch.
        if kind != "enact":
            alone = _call(m, src[:1], pos[:1], valid[:1])
            err = (alone - out[:1]).abs().max().item()
            check(f"{variant}: image 0 alone == in the batch", err < 1e-12, f"max diff {err:.1e}")
        # gradcheck on the inputs and every parameter (float64).
        params = list(m.parameters())
        Bs, Hs, Ws = 2, 3, 4
        s, po, va = _inputs(Bs, Hs, Ws, d, True, gen)
        m.hw = (Hs, Ws)
        if kind == "enact":
            _set_regions(m, s, po, va, Hs, Ws)
        s.requires_grad_(True)
        po.requires_grad_(True)
        names = [n for n, _ in m.named_parameters()]

        inputs = (s, po) + tuple(t.detach().clone().requires_grad_(True) for t in params)
        ok = torch.autograd.gradcheck(lambda *x: _functional(m, names, va, *x), inputs, eps=1e-6, atol=1e-6, rtol=1e-5,
                                      raise_exception=False)
        check(f"{variant}: gradcheck (inputs and {', '.join(names)})", ok)

    swin_checks(check, gen)
    if args.official_root:
        official_checks(args.official_root, check, gen)
    print("self-test:", "PASS" if not failures else f"FAIL ({', '.join(failures)})")
    return not failures


def swin_checks(check, gen):
    """swin: padding ignored, an image alone == in a batch that pads it more (both layers), gradcheck, and
    torchvision's shifted_window_attention on q = k = v inputs (pos = 0), outputs and gradients."""
    import torchvision.models.swin_transformer as tvs
    B, d, nhead, ws = 2, 8, 2, 3
    for layer in (0, 1):
        tag = f"swin W={ws} layer {layer} ({'shifted' if layer else 'not shifted'})"
        m = _module("swin", d, nhead, gen, swin_window=ws, layer=layer)
        H, W = 5, 7  # padded to 6 x 9: 6 windows
        m.hw = (H, W)
        src, pos, valid = _inputs(B, H, W, d, True, gen)  # image 1: 4 x 5 valid
        out = _call(m, src, pos, valid)
        src2, pos2 = src.clone(), pos.clone()
        src2[~valid] += 5 * torch.randn(int((~valid).sum()), d, generator=gen, dtype=torch.float64)
        pos2[~valid] -= 3.0
        err = (out - _call(m, src2, pos2, valid))[valid].abs().max().item()
        check(f"{tag}: padded inputs do not change valid outputs", err < 1e-12, f"max diff {err:.1e}")
        m.hw = (4, 5)
        v1 = valid[1].reshape(H, W)
        alone = _call(m, src[1:, v1.reshape(-1)], pos[1:, v1.reshape(-1)], torch.ones(1, 20, dtype=torch.bool))
        err = (alone[0] - out[1, valid[1]]).abs().max().item()
        check(f"{tag}: image 1 alone (4x5) == in the 5x7 batch", err < 1e-12, f"max diff {err:.1e}")
        m.hw = (3, 4)
        s, po, va = _inputs(B, 3, 4, d, True, gen)
        s.requires_grad_(True), po.requires_grad_(True)
        names = [n for n, _ in m.named_parameters()]
        m2 = _module("swin", d, nhead, gen, swin_window=2, layer=layer)
        m2.hw = (3, 4)
        inputs = (s, po) + tuple(t.detach().clone().requires_grad_(True) for t in m2.parameters())
        ok = torch.autograd.gradcheck(lambda *x: _functional(m2, names, va, *x), inputs, eps=1e-6, atol=1e-6,
                                      rtol=1e-5, raise_exception=False)
        check(f"swin W=2 layer {layer}: gradcheck (inputs and {', '.join(names)})", ok)
        for H, W in ((6, 9), (5, 7), (4, 8)):
            m.hw = (H, W)
            x = torch.randn(B, H * W, d, generator=gen, dtype=torch.float64, requires_grad=True)
            ones = torch.ones(B, H * W, dtype=torch.bool)
            ours = _call(m, x, torch.zeros_like(x), ones)
            params = [m.in_proj_weight, m.in_proj_bias, m.out_proj.weight, m.out_proj.bias, m.relative_position_bias_table]
            g = torch.randn(ours.shape, generator=gen, dtype=torch.float64)
            want_grads = torch.autograd.grad((ours * g).sum(), [x] + params)
            tv_out = _torchvision_swin(tvs, m, x, H, W, ws)
            got_grads = torch.autograd.grad((tv_out * g).sum(), [x] + params)
            err = (ours - tv_out).abs().max().item()
            gerr = max(((a - b).abs().max() / b.abs().max()).item() for a, b in zip(want_grads, got_grads))
            check(f"{tag}: == torchvision shifted_window_attention at {H}x{W}", err < 1e-12 and gerr < 1e-12,
                  f"max diff {err:.1e}, gradients (x, in_proj, out_proj, table) max-relative {gerr:.1e}")


def _torchvision_swin(tvs, m, x, H, W, ws):
    """torchvision 0.14's shifted_window_attention on x [B, H*W, d] with m's weights. Where the map is no
    multiple of the window it pads with zero tokens that stay keys; the window-padding keys' -inf mask is
    folded into its relative_position_bias argument (which it adds to every window's logits) so that it
    computes what the swin variant promises."""
    B, N, d = x.shape
    T, nh = ws * ws, m.num_heads
    Hp, Wp = -(-H // ws) * ws, -(-W // ws) * ws
    bias = m.relative_position_bias_table[m.index.view(-1)].view(T, T, -1).permute(2, 0, 1).unsqueeze(0)
    if (Hp, Wp) != (H, W):
        real = F.pad(torch.ones(B, H, W, 1, dtype=x.dtype), (0, 0, 0, Wp - W, 0, Hp - H))
        if m.shift:
            real = torch.roll(real, shifts=(-m.shift, -m.shift), dims=(1, 2))
        key_ok = window_partition(real, ws).reshape(-1, T) > 0.5
        bias = bias + torch.zeros(key_ok.shape, dtype=x.dtype).masked_fill(~key_ok, float("-inf"))[:, None, None, :]
    assert ws < Hp and ws < Wp, "torchvision does not shift a map one window wide; the swin variant does"
    y = tvs.shifted_window_attention(x.reshape(B, H, W, d), m.in_proj_weight, m.out_proj.weight, bias, [ws, ws], nh,
                                     [m.shift, m.shift], qkv_bias=m.in_proj_bias, proj_bias=m.out_proj.bias)
    return y.reshape(B, N, d)


def official_swin(root, check, gen):
    """The swin module == microsoft/Swin-Transformer's SwinTransformerBlock attention path (roll,
    window_partition, WindowAttention with the block's attn_mask, window_reverse, roll back) on a map that
    is a multiple of the window, q = k = v inputs (pos = 0), no padding."""
    sw = _load(os.path.join(root, "Swin-Transformer", "models", "swin_transformer.py"), "official_swin")
    B, d, nhead, ws, H, W = 2, 8, 2, 3, 6, 9
    for layer in (0, 1):
        m = _module("swin", d, nhead, gen, swin_window=ws, layer=layer)
        m.hw = (H, W)
        blk = sw.SwinTransformerBlock(d, (H, W), nhead, window_size=ws, shift_size=m.shift).double()
        with torch.no_grad():
            blk.attn.qkv.weight.copy_(m.in_proj_weight), blk.attn.qkv.bias.copy_(m.in_proj_bias)
            blk.attn.proj.load_state_dict(m.out_proj.state_dict())
            blk.attn.relative_position_bias_table.copy_(m.relative_position_bias_table)
        x = torch.randn(B, H * W, d, generator=gen, dtype=torch.float64)
        xs = x.view(B, H, W, d)
        if blk.shift_size:
            xs = torch.roll(xs, shifts=(-blk.shift_size, -blk.shift_size), dims=(1, 2))
        win = sw.window_partition(xs, ws).view(-1, ws * ws, d)
        out = sw.window_reverse(blk.attn(win, mask=blk.attn_mask).view(-1, ws, ws, d), ws, H, W)
        if blk.shift_size:
            out = torch.roll(out, shifts=(blk.shift_size, blk.shift_size), dims=(1, 2))
        err = (_call(m, x, torch.zeros_like(x), torch.ones(B, H * W, dtype=torch.bool)) - out.reshape(B, -1, d))
        err = err.abs().max().item()
        check(f"swin layer {layer} == official SwinTransformerBlock window attention (shift {blk.shift_size})",
              err < 1e-12, f"max diff {err:.1e}")


def _functional(m, names, valid, s, po, *ps):
    """m's output with its parameters replaced by ps (torch 1.13: torch.func is not there yet)."""
    from torch.nn.utils import stateless
    return stateless.functional_call(m, dict(zip(names, ps)), ((s + po).transpose(0, 1), (s + po).transpose(0, 1),
                                                               s.transpose(0, 1)), {"key_padding_mask": ~valid})[0]


def _stub_timm():
    """The official model files import timm and einops for things the attention classes do not use."""
    for name in ("timm", "timm.models", "timm.models.layers", "timm.models.registry", "timm.models.vision_transformer",
                 "einops"):
        sys.modules.setdefault(name, types.ModuleType(name))
    sys.modules["timm.models.layers"].DropPath = nn.Identity
    sys.modules["timm.models.layers"].to_2tuple = lambda x: (x, x)
    sys.modules["timm.models.layers"].trunc_normal_ = lambda t, std=1.0: t
    sys.modules["timm.models.registry"].register_model = lambda f: f
    sys.modules["timm.models.vision_transformer"]._cfg = lambda **k: k
    sys.modules["einops"].rearrange = None


def _load(path, name):
    import importlib.util
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def official_checks(root, check, gen):
    """Each module against the official class: one input x for q, k, v (pos = 0), no padding."""
    _stub_timm()
    B, H, W, d, nhead = 2, 4, 6, 8, 2
    N = H * W
    x = torch.randn(B, N, d, generator=gen, dtype=torch.float64)
    zero = torch.zeros_like(x)
    valid = torch.ones(B, N, dtype=torch.bool)

    def wq(m):
        return m.in_proj_weight[:d], m.in_proj_bias[:d]

    def wk(m):
        return m.in_proj_weight[d:2 * d], m.in_proj_bias[d:2 * d]

    def wv(m):
        return m.in_proj_weight[2 * d:], m.in_proj_bias[2 * d:]

    ea = _load(os.path.join(root, "efficient-attention", "efficient_attention.py"), "official_efficient")
    m = _module("efficient", d, nhead, gen)
    m.hw = (H, W)
    off = ea.EfficientAttention(d, d, nhead, d).double()
    with torch.no_grad():
        for conv, (w, b) in ((off.queries, wq(m)), (off.keys, wk(m)), (off.values, wv(m)),
                             (off.reprojection, (m.out_proj.weight, m.out_proj.bias))):
            conv.weight.copy_(w.reshape(d, d, 1, 1))
            conv.bias.copy_(b)
    img = x.transpose(1, 2).reshape(B, d, H, W)
    want = (off(img) - img).reshape(B, d, N).transpose(1, 2)
    err = (_call(m, x, zero, valid) - want).abs().max().item()
    check("efficient == official EfficientAttention (minus its residual)", err < 1e-12, f"max diff {err:.1e}")

    m = _module("hydra", d, nhead, gen)
    m.hw = (H, W)
    q, k, v = (F.linear(x, *f(m)) for f in (wq, wk, wv))  # the listing, written out as printed
    q = q / q.norm(dim=-1, keepdim=True)
    k = k / k.norm(dim=-1, keepdim=True)
    want = m.out_proj(q * (k * v).sum(dim=-2, keepdim=True))
    err = (_call(m, x, zero, valid) - want).abs().max().item()
    check("hydra == the paper's listing", err < 1e-12, f"max diff {err:.1e}")

    fl = _load(os.path.join(root, "FLatten-Transformer", "models", "flatten_pvt.py"), "official_flatten")
    m = _module("focused", d, nhead, gen)
    m.hw = (H, W)
    off = fl.FocusedLinearAttention(d, N, num_heads=nhead, qkv_bias=True, sr_ratio=1).double()
    with torch.no_grad():
        off.q.weight.copy_(wq(m)[0]), off.q.bias.copy_(wq(m)[1])
        off.kv.weight.copy_(torch.cat([wk(m)[0], wv(m)[0]])), off.kv.bias.copy_(torch.cat([wk(m)[1], wv(m)[1]]))
        off.proj.load_state_dict(m.out_proj.state_dict())
        off.dwc.load_state_dict(m.dwc.state_dict())
        off.scale.copy_(m.scale)
    err = (_call(m, x, zero, valid) - off(x, H, W)).abs().max().item()
    check("focused == official FocusedLinearAttention (positional_encoding 0)", err < 1e-12, f"max diff {err:.1e}")

    if os.path.isdir(os.path.join(root, "Swin-Transformer")):
        official_swin(root, check, gen)
    pv = _load(os.path.join(root, "PVT", "classification", "pvt.py"), "official_pvt")
    for R in (1, 2):
        m = _module("sra", d, nhead, gen, sra_ratio=R)
        m.hw = (H, W)
        off = pv.Attention(d, num_heads=nhead, qkv_bias=True, sr_ratio=R).double()
        with torch.no_grad():
            off.q.weight.copy_(wq(m)[0]), off.q.bias.copy_(wq(m)[1])
            off.kv.weight.copy_(torch.cat([wk(m)[0], wv(m)[0]])), off.kv.bias.copy_(torch.cat([wk(m)[1], wv(m)[1]]))
            off.proj.load_state_dict(m.out_proj.state_dict())
            if R > 1:
                off.sr.load_state_dict(m.sr.state_dict())
                off.norm.load_state_dict(m.norm.state_dict())
        err = (_call(m, x, zero, valid) - off(x, H, W)).abs().max().item()
        check(f"sra R={R} == official PVT Attention", err < 1e-12, f"max diff {err:.1e}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--detr-repo", help="checkout of facebookresearch/detr (Atten4Vis/ConditionalDETR with "
                    "--decoder conditional or a conditional-* preset)")
    ap.add_argument("--decoder", default=None, choices=["detr", "conditional"], help="default: the preset's")
    ap.add_argument("--preset", default="tiny", choices=sorted(parity_step.PRESETS))
    ap.add_argument("--variant", default="all", choices=VARIANTS + ["all"])
    ap.add_argument("--padding", action="store_true", help="second image padded bottom/right")
    ap.add_argument("--both", action="store_true", help="run each variant without and with padding")
    ap.add_argument("--detr", default="build/detr", help="the detr binary")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--size", default=None,
                    help="HxW of the batch (default 160x224: a 5x7 feature map, 4x5 valid with padding; "
                         "enact 320x448, a 10x14 map, so that images have several clusters; 320x320 for detr-r50)")
    ap.add_argument("--sra-ratio", type=int, default=None, help="R for sra (default 2; passed as --set sra_ratio=R)")
    ap.add_argument("--enact-sigma", type=float, default=None,
                    help="ENACT's Gaussian sigma (default 3; passed as --set enact_sigma=S)")
    ap.add_argument("--swin-window", type=int, default=None,
                    help="swin's window (default 7; passed as --set swin_window=W)")
    ap.add_argument("--swin-no-shift", action="store_true", help="swin without shifted layers (swin_shift=false)")
    ap.add_argument("--focused-z", default="mean", choices=["mean", "sum"],
                    help="focused denominator: official mean form (default) or the sum form")
    ap.add_argument("--set", action="append", help="extra --set key=value for detr step")
    ap.add_argument("--tol", type=float, default=1e-4)
    ap.add_argument("--threads", type=int, default=2, help="torch threads for the reference")
    ap.add_argument("--keep", default=None, help="directory to keep the files in")
    ap.add_argument("--self-test", action="store_true", help="check the modules alone (float64), no detr binary")
    ap.add_argument("--official-root", default=None,
                    help="with --self-test: directory holding efficient-attention/, FLatten-Transformer/, PVT/")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.self_test:
        sys.exit(0 if self_test(args) else 1)
    if not args.detr_repo:
        ap.error("--detr-repo is required")
    variants = VARIANTS if args.variant == "all" else [args.variant]
    paddings = [False, True] if args.both else [args.padding]
    rows = []
    for variant in variants:
        default = "320x320" if args.preset == "detr-r50" else "320x448" if variant == "enact" else "160x224"
        size = tuple(int(v) for v in (args.size or default).split("x"))
        for padding in paddings:
            ok, groups = run_variant(args, variant, padding, size)
            rows.append((variant, padding, ok, groups))
            print()
    if len(rows) > 1:
        summarise(rows)
    sys.exit(0 if all(r[2] for r in rows) else 1)


if __name__ == "__main__":
    main()
