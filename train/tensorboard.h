// TensorBoard event files: what `detr train` writes beside metrics.jsonl (docs/ecosystem.md).
// A file of TFRecords - the length (uint64), the masked crc32c of those 8 bytes, a serialized
// tensorboard.Event (TensorBoard's own event.proto, third_party/tensorboard, encoded by
// protobuf-c), the masked crc32c of the data; integers little-endian - named
// events.out.tfevents.<unix time>.<host>.<pid> as TensorBoard's writers name theirs.
//
// A write that fails (a full disk) is said once on stderr, naming the file and the call; the
// writer then writes nothing more and every later call returns -1 at once: the run goes on, its
// metrics.jsonl and checkpoints are not this file's business.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "datasets/image.h"

typedef struct TbWriter TbWriter;

// Whether this build writes event files (protobuf-c found at build time: DETR_TENSORBOARD).
bool tb_available(void);

// Opens a new event file in dir and writes its first records: file_version "brain.Event:2" (with
// source_metadata.writer TB_WRITER_NAME, how tb_cut knows the files it may cut) and a SessionLog
// START at start_step + 1, after which TensorBoard's reader drops any event of an earlier file
// with a step >= start_step + 1 (a run resumed at start_step logs those steps again). The name's
// time sorts after every event file already in dir, so a reader meets this file last. Returns
// NULL with err set (naming the file and the call).
#define TB_WRITER_NAME "detr-c"
TbWriter *tb_open(const char *dir, int64_t start_step, char *err, size_t err_cap);
const char *tb_path(const TbWriter *w);
// A scalar summary (TensorBoard stores it as float32), and an RGB image summary (PNG encoded).
// Returns 0, or -1 once the writer has failed.
int tb_scalar(TbWriter *w, int64_t step, const char *tag, double value);
int tb_image(TbWriter *w, int64_t step, const char *tag, const Image *img);
// Pushes what was written to the file (after each metrics.jsonl row, as that file is flushed).
int tb_flush(TbWriter *w);
// Closes the file and frees w (NULL: nothing). Returns 0, or -1 if the file failed at any point.
int tb_close(TbWriter *w);

// The resumed run's side of "each step once": every event file in dir that this tool wrote
// (file_version and source_metadata.writer checked; other files are left alone) is truncated
// before its first record of a step > step, and before a record cut off mid-write (length short,
// either crc wrong). Says on stderr what it dropped. Returns 0, or -1 with err set.
int tb_cut(const char *dir, int64_t step, char *err, size_t err_cap);

// CRC-32C (Castagnoli) of data, and TFRecord's mask of it: ((crc >> 15) | (crc << 17)) + 0xa282ead8.
uint32_t tb_crc32c(const void *data, size_t n);
uint32_t tb_masked_crc32c(const void *data, size_t n);
