#include "nn/detr.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nn/position.h"

// The encoder, the decoder and the heads, in the reference's state_dict order (transformer, heads).
static void create_transformer(DetrModel *m, ParamStore *ps, const DecoderKind *dk, const DecoderModelLayout *lay) {
  const DetrConfig *cfg = &m->cfg;
  int64_t d = cfg->hidden_dim;
  TransformerShape s = {
      .dim = d, .heads = cfg->nheads, .ffn_dim = cfg->ffn_dim, .dropout = cfg->dropout, .pre_norm = cfg->pre_norm};
  char name[112];
  for (int i = 0; i < cfg->enc_layers && !dk->encode; i++) {
    snprintf(name, sizeof name, "transformer.encoder.layers.%d", i);
    m->enc[i] = encoder_layer_create(ps, name, s, cfg->encoder_attn, &m->cfg.attn_settings);
    m->enc[i].index = i;  // a variant may act by layer (swin shifts the odd ones)
  }
  if (cfg->pre_norm && !dk->encode) m->enc_norm = layernorm_create(ps, "transformer.encoder.norm", d);
  m->decoder_state = detr_calloc(1, dk->state_size, "decoder state");
  dk->create(m->decoder_state, ps, lay->prefix,
             &(DecoderShape){.s = s,
                             .layers = cfg->dec_layers,
                             .cross_attn = cfg->decoder_cross_attn,
                             .enc_layers = cfg->enc_layers,
                             .queries = cfg->num_queries,
                             .encoder_attn = detr_encoder_attn(cfg),
                             .attn_settings = &m->cfg.attn_settings});
  m->class_embed = linear_create(ps, lay->class_embed, d, cfg->num_classes + detr_classes(cfg)->extra_columns, true,
                                 PARAM_TRAINABLE, LR_GROUP_MAIN);
  m->bbox_embed = mlp_create(ps, lay->bbox_embed, d, d, 4, 3);
}

DetrModel *detr_model_create(const DetrConfig *cfg, Device dev) {
  char err[256];
  DETR_CHECK(detr_config_validate(cfg, err, sizeof err) == 0, "detr_model_create: %s", err);
  DetrModel *m = detr_calloc(1, sizeof(DetrModel), "a model");
  m->cfg = *cfg;
  if (m->cfg.attn_settings.n == 0) attn_settings_default(&m->cfg.attn_settings);
  device_set_tf32(dev, cfg->tf32);  // process-wide on CUDA: the latest CUDA model's setting holds
  // bf16 where the device runs it at speed (else fp32, warned once): the config records what runs,
  // so a checkpoint says what its run did. The kernels' setting is process-wide: each forward sets
  // its model's (detr_model_forward), so models of both precisions can share a process.
  m->cfg.bf16 = device_set_bf16(dev, cfg->bf16);
  ParamStore *ps = &m->params;
  params_init(ps, dev);
  int64_t d = cfg->hidden_dim;
  const DecoderKind *dk = detr_decoder(cfg);
  const DecoderModelLayout *lay = decoder_layout(dk);
  // Registration order follows the reference state_dict: transformer, class/bbox heads, queries,
  // input_proj, backbone.
  create_transformer(m, ps, dk, lay);
  if (!lay->own_queries)
    m->query_embed = params_add(ps, SHAPE(cfg->num_queries, d), PARAM_TRAINABLE, LR_GROUP_MAIN, "query_embed.weight");
  resnet_create(&m->backbone, ps, lay->backbone, cfg->backbone_depth, cfg->backbone_width, cfg->backbone_layers,
                cfg->dilation, cfg->train_backbone, cfg->frozen_stages);
  m->input_proj =
      conv2d_create(ps, lay->input_proj, m->backbone.out_channels, d, 1, 1, 0, 1, true, PARAM_TRAINABLE, LR_GROUP_MAIN);
  m->input_proj.p.channels_last = true;  // on the backbone's output, whose rows become the tokens
  if (lay->input_norm) m->input_norm = groupnorm_create(ps, lay->input_norm, 32, d);
  return m;
}

void detr_model_init(DetrModel *m, uint64_t seed) {
  Rng rng = rng_make(seed);
  const DecoderKind *dk = detr_decoder(&m->cfg);
  for (int i = 0; i < m->cfg.enc_layers && !dk->encode; i++) encoder_layer_init(&m->enc[i], &rng);
  dk->init(m->decoder_state, &rng);
  init_torch_default(m->class_embed.weight, m->class_embed.bias, &rng);
  for (int i = 0; i < m->bbox_embed.n_layers; i++)
    init_torch_default(m->bbox_embed.layers[i].weight, m->bbox_embed.layers[i].bias, &rng);
  if (dk->init_heads) dk->init_heads(&m->class_embed, &m->bbox_embed);
  if (m->query_embed) init_normal(m->query_embed, &rng, 1.0f);  // nn.Embedding: N(0, 1)
  if (decoder_layout(dk)->input_norm) {  // Anchor DETR: xavier_uniform_(weight), bias 0 (its GroupNorm: 1, 0)
    init_xavier_uniform(m->input_proj.weight, &rng);
    tensor_fill_(m->input_proj.bias, 0.0f);
  } else {
    init_torch_default(m->input_proj.weight, m->input_proj.bias, &rng);
  }
  resnet_init(&m->backbone, &rng);
}

void detr_model_prepare_inference(DetrModel *m) {
  // What an earlier preparation derived goes: the weights may have been loaded since.
  resnet_unfold_bn(&m->backbone);
  const DecoderKind *dk = detr_decoder(&m->cfg);
  if (dk->release_inference) dk->release_inference(m->decoder_state);
  tensor_owner_clear(&m->params.derived);
  resnet_fold_bn(&m->backbone, &m->params.derived);
  // bf16 mode's linear layers read their weights kept in bf16 instead of rounding them every forward
  // (op_linear; the matrices of the parameters: the linear layers' weights, and a few embeddings).
  // Before the decoder's terms below, so that those are the forward's floats.
  if (m->cfg.bf16 && m->params.device == DEVICE_CPU)
    for (int i = 0; i < m->params.count; i++)
      if (m->params.items[i].tensor->shape.ndim == 2) tensor_keep_bf16(m->params.items[i].tensor);
  if (dk->prepare_inference) {
    DETR_CHECK(dk->release_inference, "detr_model_prepare_inference: decoder %s prepares but has no release_inference",
               dk->name);
    device_set_bf16(m->params.device, m->cfg.bf16);  // the model's precision, as its forward sets it
    dk->prepare_inference(m->decoder_state, m->query_embed, &m->params.derived);
  }
  m->prepared_for_inference = true;
}

void detr_model_free(DetrModel *m) {
  if (!m) return;
  resnet_unfold_bn(&m->backbone);
  const DecoderKind *dk = detr_decoder(&m->cfg);
  if (dk->release_inference) dk->release_inference(m->decoder_state);
  for (int i = 0; i < m->cfg.enc_layers && !dk->encode; i++) encoder_layer_free(&m->enc[i]);
  free(m->decoder_state);
  params_free(&m->params);
  free(m);
}

void detr_output_free(DetrOutput *out) {
  for (int i = 0; i < out->n_attn; i++) attn_trace_free(&out->attn[i]);
  out->n_attn = 0;
}

// One encoder layer (tensor_run_layers): the memory in carry->t[0], then the attention traces'
// exported and pending tensors of this layer and every earlier one (DetrOutput.attn keeps them).
typedef struct {
  const DetrModel *m;
  const NnCtx *ctx;
  Tensor *pos;
  const FeatureGeometry *g;
  DetrOutput *out;
  char *err;
  size_t err_cap;
} EncodeStep;

static void encode_step(void *state, int i, TensorCarry *carry) {
  EncodeStep *e = state;
  if (!carry->t[0]) return;  // an earlier layer failed (e->err says why)
  AttnTrace *t = &e->out->attn[e->out->n_attn++];
  carry->t[0] = encoder_layer_forward(&e->m->enc[i], e->ctx, carry->t[0], e->pos, e->g, t, e->err, e->err_cap);
  for (int k = 0; k < t->n_exports + 2; k++) {
    Tensor *keep = k < t->n_exports ? t->exports[k].f32 : t->pending[k - t->n_exports];
    DETR_CHECK(carry->n < TENSOR_CARRY_MAX, "detr encoder: more attention traces than a carry holds");
    if (keep) carry->t[carry->n++] = keep;
  }
}

// DETR's encoder: the sine positions into *pos, each layer's self-attention through its variant.
// Returns the memory [B, N, d], or NULL with err set.
static Tensor *detr_encode(const DetrModel *m, const NnCtx *ctx, Tensor *src, const FeatureGeometry *g, Tensor **pos,
                           DetrOutput *out, char *err, size_t err_cap) {
  const DetrConfig *c = &m->cfg;
  int64_t B = g->B, h = g->Hp, w = g->Wp, N = h * w, d = c->hidden_dim;
  float *host = detr_malloc((size_t)(B * N * d) * sizeof(float), "detr_model_forward host");  // [B, N, d]
  position_sine(g->mask, B, h, w, d / 2, 10000.0f, host);
  *pos = op_constant(src->device, SHAPE(B, N, d), host);
  free(host);
  EncodeStep e = {.m = m, .ctx = ctx, .pos = *pos, .g = g, .out = out, .err = err, .err_cap = err_cap};
  TensorCarry carry = {.t = {src}, .n = 1};
  tensor_run_layers((int)c->enc_layers, encode_step, &e, &carry);
  Tensor *memory = carry.t[0];
  if (memory && c->pre_norm) memory = layernorm_forward(&m->enc_norm, memory);
  return memory;
}

// The heads on decoder layer first + i's output (tensor_run_layers): its logits and boxes join the
// carry, with every earlier layer's.
typedef struct {
  const DetrModel *m;
  const DecoderOutput *dec;
  DetrOutput *out;
  int first;
} HeadStep;

static void head_step(void *state, int i, TensorCarry *carry) {
  HeadStep *h = state;
  int layer = h->first + i;
  const DecoderKind *dk = detr_decoder(&h->m->cfg);
  DetrLayerOutput *o = &h->out->layers[layer];
  o->logits = linear_forward(&h->m->class_embed, h->dec->hs[layer]);
  o->boxes = dk->boxes(h->m->decoder_state, mlp_forward(&h->m->bbox_embed, h->dec->hs[layer]), h->dec, layer);
  DETR_CHECK(carry->n + 2 <= TENSOR_CARRY_MAX, "detr heads: more decoder layers than a carry holds");
  carry->t[carry->n++] = o->logits;
  carry->t[carry->n++] = o->boxes;
}

// The decoder and the heads on every layer's output (the earlier ones: auxiliary, not computed under
// NnCtx.inference).
static void decode(const DetrModel *m, const NnCtx *ctx, const DecoderInput *din, DetrOutput *out) {
  const DecoderKind *dk = detr_decoder(&m->cfg);
  DecoderOutput dec = {0};  // a kind fills cross_attn only when asked
  dk->forward(m->decoder_state, ctx, din, &dec);
  out->n_layers = dec.n_layers;
  out->cross_attn = dec.cross_attn;
  // The earlier layers' heads feed only the auxiliary losses: inference computes the last layer's.
  HeadStep h = {.m = m, .dec = &dec, .out = out, .first = ctx->inference ? dec.n_layers - 1 : 0};
  TensorCarry carry = {.n = 0};
  tensor_run_layers(dec.n_layers - h.first, head_step, &h, &carry);
}

int detr_model_forward(const DetrModel *m, const NnCtx *ctx, Tensor *images, const uint8_t *mask, DetrOutput *out,
                       char *err, size_t err_cap) {
  memset(out, 0, sizeof *out);
  // A prepared model run without a tape may compute each layer's function in another order
  // (NnCtx.inference); training, and any forward that records, computes it as the reference.
  NnCtx run = *ctx;
  run.inference = m->prepared_for_inference && !ctx->training && !autograd_grad_enabled();
  ctx = &run;
  device_set_bf16(images->device, m->cfg.bf16);  // this model's precision (its backward's too), resolved at creation
  char sbuf[64];
  DETR_CHECK(images->shape.ndim == 4 && images->shape.d[3] == 3,
             "detr_model_forward: images must be [B, H, W, 3], got %s", shape_str(images->shape, sbuf, sizeof sbuf));
  const DetrConfig *c = &m->cfg;
  const DecoderKind *dk = detr_decoder(c);
  int64_t B = images->shape.d[0], H = images->shape.d[1], W = images->shape.d[2], d = c->hidden_dim;
  Tensor *feat = resnet_forward(&m->backbone, images);  // [B, h, w, C] (channels last)
  int64_t h = feat->shape.d[1], w = feat->shape.d[2], N = h * w;
  Tensor *src = conv2d_forward(&m->input_proj, feat);  // [B, h, w, d]
  src = op_reshape(src, SHAPE(B, N, d));               // [B, N, d]
  if (decoder_layout(dk)->input_norm) src = groupnorm_forward(&m->input_norm, src);

  // The mask at feature resolution (host), then the encoder: DETR's or the decoder kind's own.
  uint8_t *small = detr_malloc((size_t)(B * N), "detr_model_forward small");  // [B, N]
  mask_downsample_nearest(mask, B, H, W, h, w, small);
  FeatureGeometry geom;
  feature_geometry_make(small, B, h, w, images->device, &geom);
  Tensor *pos = NULL;
  Tensor *memory = dk->encode ? dk->encode(m->decoder_state, ctx, src, &geom, &pos)
                              : detr_encode(m, ctx, src, &geom, &pos, out, err, err_cap);
  if (memory) {
    out->feat_h = h;
    out->feat_w = w;
    decode(m, ctx,
           &(DecoderInput){.memory = memory,
                           .pos = pos,
                           .key_mask = geom.key_mask,
                           .query_embed = m->query_embed,
                           .batch = B,
                           .geom = &geom},
           out);
  }
  // The whole forward is queued: the traces' device numbers can come to the host now.
  for (int i = 0; i < out->n_attn; i++) attn_trace_resolve(&out->attn[i]);
  feature_geometry_free(&geom);
  free(small);
  return memory ? 0 : -1;
}

int64_t detr_detections_per_image(const DetrConfig *cfg) {
  const ClassHead *h = detr_classes(cfg);
  return h->detections_per_image(cfg->num_queries, cfg->num_classes + h->extra_columns);
}

void detr_postprocess_output(const DetrModel *m, const DetrOutput *o, const int *orig_w, const int *orig_h,
                             Detection *out) {
  const DetrLayerOutput *last = &o->layers[o->n_layers - 1];
  detr_postprocess(detr_classes(&m->cfg), last->logits, last->boxes, orig_w, orig_h, out);
}
