// DETR's padding mask at feature resolution and its sine positional encoding
// (models/position_encoding.py, PositionEmbeddingSine with normalize=True). Host computations:
// they depend only on the mask, have no parameters and take no gradient.
#pragma once
#include <stdint.h>

// mask [B, H, W] (1 = padding) -> out [B, h, w] by nearest interpolation as F.interpolate:
// source index floor(dst * (in / out)) computed in float32.
void mask_downsample_nearest(const uint8_t *mask, int64_t B, int64_t H, int64_t W, int64_t h, int64_t w, uint8_t *out);

// pos [B, h*w, 2*npf] (batch-first, pixels row-major): channels [0, npf) encode y, [npf, 2npf)
// encode x; within each half sin and cos interleave over dim_t = temperature^(2 floor(i/2) / npf),
// of the cumulative count of valid pixels normalised by the row/column total (+1e-6) times 2 pi.
void position_sine(const uint8_t *mask, int64_t B, int64_t h, int64_t w, int64_t npf, float temperature, float *pos);
