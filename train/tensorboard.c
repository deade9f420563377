// TensorBoard event files (train/tensorboard.h): TFRecord framing, protobuf-c encoding of
// TensorBoard's own Event messages, and cutting a resumed run's files back to its checkpoint.
#define _DEFAULT_SOURCE  // gethostname, truncate, lstat, O_CLOEXEC
#include "train/tensorboard.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "core/error.h"

// CRC-32C, reflected polynomial 0x82F63B78, bit by bit: Debian 12 packages no C library of it
// (no libcrc32c-dev; google/crc32c is not packaged), and the files are small (a step's scalars
// are a few hundred bytes, an evaluation's pictures a few hundred KB: well under a millisecond).
uint32_t tb_crc32c(const void *data, size_t n) {
  const uint8_t *p = data;
  uint32_t crc = 0xffffffffu;
  for (size_t i = 0; i < n; i++) {
    crc ^= p[i];
    for (int k = 0; k < 8; k++) crc = (crc >> 1) ^ (0x82f63b78u & (0u - (crc & 1u)));
  }
  return ~crc;
}

// TFRecord masks its crcs: a crc of data that holds crcs would otherwise be degenerate.
uint32_t tb_masked_crc32c(const void *data, size_t n) {
  uint32_t crc = tb_crc32c(data, n);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

#if DETR_HAVE_TENSORBOARD

#include <tensorboard/compat/proto/event.pb-c.h>

#define STBI_WRITE_NO_STDIO
#include <stb/stb_image_write.h>  // compiled once, in datasets/stb_impl.c

#define EVENT_FILE_PREFIX "events.out.tfevents."
#define MAX_RECORD (1u << 30)  // a longer length field is a damaged record, not one of ours

struct TbWriter {
  FILE *f;
  char path[4352];
  bool failed;  // a write failed (said once): nothing more is written
};

bool tb_available(void) { return true; }
const char *tb_path(const TbWriter *w) { return w ? w->path : ""; }

static void put_le(uint8_t *out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; i++) out[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t get_le(const uint8_t *in, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; i++) v |= (uint64_t)in[i] << (8 * i);
  return v;
}

static double wall_time(void) {
  struct timeval tv;
  gettimeofday(&tv, NULL);
  return (double)tv.tv_sec + 1e-6 * (double)tv.tv_usec;
}

// The first failure, said once with what it means for the run; every later call is a no-op.
static int fail(TbWriter *w, const char *call, int errnum) {
  if (!w->failed)
    fprintf(stderr,
            "detr train: TensorBoard: %s: %s failed: %s; no more events are written to it (the run goes on: "
            "metrics.jsonl and the checkpoints hold every step)\n",
            w->path, call, strerror(errnum));
  w->failed = true;
  return -1;
}

// One record: length [8], masked crc of the length [4], the event [len], masked crc of the event [4].
static int write_event(TbWriter *w, const Tensorboard__Event *ev) {
  if (!w || w->failed) return -1;
  size_t n = tensorboard__event__get_packed_size(ev);
  uint8_t *rec = detr_malloc(n + 16, "tensorboard record");
  put_le(rec, n, 8);
  put_le(rec + 8, tb_masked_crc32c(rec, 8), 4);
  size_t packed = tensorboard__event__pack(ev, rec + 12);
  DETR_CHECK(packed == n, "tensorboard: packed %zu bytes of %zu", packed, n);
  put_le(rec + 12 + n, tb_masked_crc32c(rec + 12, n), 4);
  errno = 0;
  int rc = fwrite(rec, 1, n + 16, w->f) == n + 16 ? 0 : fail(w, "fwrite", errno ? errno : EIO);
  free(rec);
  return rc;
}

static Tensorboard__Event event_at(int64_t step) {
  Tensorboard__Event ev = TENSORBOARD__EVENT__INIT;
  ev.wall_time = wall_time();
  ev.step = step;
  return ev;
}

static int write_value(TbWriter *w, int64_t step, Tensorboard__Summary__Value *v) {
  Tensorboard__Summary s = TENSORBOARD__SUMMARY__INIT;
  s.n_value = 1;
  s.value = &v;
  Tensorboard__Event ev = event_at(step);
  ev.what_case = TENSORBOARD__EVENT__WHAT_SUMMARY;
  ev.summary = &s;
  return write_event(w, &ev);
}

int tb_scalar(TbWriter *w, int64_t step, const char *tag, double value) {
  Tensorboard__Summary__Value v = TENSORBOARD__SUMMARY__VALUE__INIT;
  v.tag = (char *)tag;
  v.value_case = TENSORBOARD__SUMMARY__VALUE__VALUE_SIMPLE_VALUE;
  v.simple_value = (float)value;
  return write_value(w, step, &v);
}

typedef struct {
  uint8_t *data;
  size_t n, cap;
} Bytes;

static void append_bytes(void *ctx, void *data, int n) {
  Bytes *b = ctx;
  if (b->n + (size_t)n > b->cap) {
    b->cap = 2 * (b->n + (size_t)n);
    b->data = detr_realloc(b->data, b->cap, "tensorboard png");
  }
  memcpy(b->data + b->n, data, (size_t)n);
  b->n += (size_t)n;
}

int tb_image(TbWriter *w, int64_t step, const char *tag, const Image *img) {
  if (!w || w->failed) return -1;
  Bytes png = {0};
  if (!stbi_write_png_to_func(append_bytes, &png, img->w, img->h, 3, img->data, 3 * img->w)) {
    free(png.data);
    return fail(w, "stbi_write_png_to_func (the picture's PNG)", EINVAL);
  }
  Tensorboard__Summary__Image im = TENSORBOARD__SUMMARY__IMAGE__INIT;
  im.height = img->h;
  im.width = img->w;
  im.colorspace = 3;  // RGB
  im.encoded_image_string = (ProtobufCBinaryData){.len = png.n, .data = png.data};
  Tensorboard__Summary__Value v = TENSORBOARD__SUMMARY__VALUE__INIT;
  v.tag = (char *)tag;
  v.value_case = TENSORBOARD__SUMMARY__VALUE__VALUE_IMAGE;
  v.image = &im;
  int rc = write_value(w, step, &v);
  free(png.data);
  return rc;
}

int tb_flush(TbWriter *w) {
  if (!w || w->failed) return -1;
  return fflush(w->f) ? fail(w, "fflush", errno) : 0;
}

int tb_close(TbWriter *w) {
  if (!w) return 0;
  int rc = w->failed ? -1 : 0;
  if (fclose(w->f) && !w->failed) rc = fail(w, "fclose", errno);
  free(w);
  return rc;
}

// The <unix time> of an event file's name (events.out.tfevents.<time>.<host>...), -1 for another name.
static long long name_time(const char *name) {
  size_t prefix = strlen(EVENT_FILE_PREFIX);
  if (strncmp(name, EVENT_FILE_PREFIX, prefix)) return -1;
  char *end;
  long long t = strtoll(name + prefix, &end, 10);
  return end == name + prefix || *end != '.' ? -1 : t;
}

// Now, or one second past the newest event file of dir: TensorBoard reads a directory's event
// files in name order, and the START record must come after the events it retires.
static long long file_time(const char *dir) {
  long long t = (long long)time(NULL);
  DIR *d = opendir(dir);
  if (!d) return t;
  for (struct dirent *e; (e = readdir(d));) {
    long long other = name_time(e->d_name);
    if (other >= t) t = other + 1;
  }
  closedir(d);
  return t;
}

// The first records: the file's version with this writer's name, then the START of this session.
static int write_header(TbWriter *w, int64_t start_step) {
  Tensorboard__SourceMetadata source = TENSORBOARD__SOURCE_METADATA__INIT;
  source.writer = TB_WRITER_NAME;
  Tensorboard__Event ev = event_at(0);
  ev.what_case = TENSORBOARD__EVENT__WHAT_FILE_VERSION;
  ev.file_version = "brain.Event:2";
  ev.source_metadata = &source;
  char msg[96];
  snprintf(msg, sizeof msg, "detr train from step %lld", (long long)start_step);
  Tensorboard__SessionLog start = TENSORBOARD__SESSION_LOG__INIT;
  start.status = TENSORBOARD__SESSION_LOG__SESSION_STATUS__START;
  start.msg = msg;
  Tensorboard__Event session = event_at(start_step + 1);
  session.what_case = TENSORBOARD__EVENT__WHAT_SESSION_LOG;
  session.session_log = &start;
  if (write_event(w, &ev) || write_event(w, &session)) return -1;
  return tb_flush(w);
}

TbWriter *tb_open(const char *dir, int64_t start_step, char *err, size_t err_cap) {
  char host[256] = "localhost";
  if (gethostname(host, sizeof host - 1)) snprintf(host, sizeof host, "localhost");
  host[sizeof host - 1] = 0;
  for (char *c = host; *c; c++)
    if (*c == '/') *c = '_';
  TbWriter *w = detr_calloc(1, sizeof *w, "tensorboard writer");
  snprintf(w->path, sizeof w->path, "%s/" EVENT_FILE_PREFIX "%010lld.%s.%ld", dir, file_time(dir), host,
           (long)getpid());
  // O_EXCL: a new file, never one that is there (the user's, another run's).
  int fd = open(w->path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0 || !(w->f = fdopen(fd, "wb"))) {
    snprintf(err, err_cap, "%s: %s: %s", w->path, fd < 0 ? "open" : "fdopen", strerror(errno));
    if (fd >= 0) close(fd);
    free(w);
    return NULL;
  }
  if (write_header(w, start_step)) {  // a file without its version is no event file: it goes (this call made it)
    snprintf(err, err_cap, "%s: cannot write its first records (see above); removed", w->path);
    unlink(w->path);
    tb_close(w);
    return NULL;
  }
  return w;
}

// --- reading back, for tb_cut ---

// The next record of f: 1 with its event in *ev (free with tensorboard__event__free_unpacked), 0 at
// the end of the file, -1 for a record cut off mid-write or damaged (a crc, the decoding).
static int read_event(FILE *f, Tensorboard__Event **ev) {
  uint8_t head[12], tail[4];
  size_t got = fread(head, 1, sizeof head, f);
  if (got == 0 && feof(f)) return 0;
  if (got < sizeof head || get_le(head + 8, 4) != tb_masked_crc32c(head, 8)) return -1;
  uint64_t n = get_le(head, 8);
  if (n > MAX_RECORD) return -1;
  uint8_t *data = detr_malloc(n ? n : 1, "tensorboard record read");
  bool whole = fread(data, 1, n, f) == n && fread(tail, 1, 4, f) == 4 && get_le(tail, 4) == tb_masked_crc32c(data, n);
  *ev = whole ? tensorboard__event__unpack(NULL, n, data) : NULL;
  free(data);
  return *ev ? 1 : -1;
}

// Whether the file's first record is this tool's file_version record.
static bool written_here(FILE *f) {
  Tensorboard__Event *ev = NULL;
  bool ours = read_event(f, &ev) == 1 && ev->what_case == TENSORBOARD__EVENT__WHAT_FILE_VERSION &&
              !strncmp(ev->file_version, "brain.Event:", 12) && ev->source_metadata &&
              !strcmp(ev->source_metadata->writer, TB_WRITER_NAME);
  if (ev) tensorboard__event__free_unpacked(ev, NULL);
  return ours;
}

// Where path's records past step begin (or its torn last record): the offset to cut at, -1 for
// none; the records dropped in *dropped, whether the last was torn in *torn.
static long cut_offset(FILE *f, int64_t step, long *dropped, bool *torn) {
  long at = -1;
  for (;;) {
    long here = ftell(f);
    Tensorboard__Event *ev = NULL;
    int rc = read_event(f, &ev);
    if (rc == 0) break;
    if (rc < 0) {
      *torn = true;
      if (at < 0) at = here;
      break;
    }
    // A SessionLog START of a resumed file precedes the evaluation that run owed at its first step:
    // the first summary past step decides (summaries come in step order; START at most one ahead).
    if (ev->step > step && at < 0 && ev->what_case != TENSORBOARD__EVENT__WHAT_SESSION_LOG) at = here;
    *dropped += at >= 0;
    tensorboard__event__free_unpacked(ev, NULL);
  }
  return at;
}

static int cut_file(const char *path, int64_t step, char *err, size_t err_cap) {
  FILE *f = fopen(path, "rb");
  if (!f) return 0;  // gone meanwhile, or not ours to read: nothing to cut
  long dropped = 0, at = -1;
  bool torn = false;
  if (written_here(f)) at = cut_offset(f, step, &dropped, &torn);
  fclose(f);
  if (at < 0) return 0;
  if (truncate(path, at)) {
    snprintf(err, err_cap, "%s: truncate to its events up to step %lld: %s", path, (long long)step, strerror(errno));
    return -1;
  }
  fprintf(stderr, "detr train: %s: dropped %ld event%s past step %lld (logged again now)%s\n", path, dropped,
          dropped == 1 ? "" : "s", (long long)step, torn ? ", the last one cut off mid-write" : "");
  return 0;
}

int tb_cut(const char *dir, int64_t step, char *err, size_t err_cap) {
  DIR *d = opendir(dir);
  if (!d) return 0;  // a new directory: no event file yet
  int rc = 0;
  for (struct dirent *e; rc == 0 && (e = readdir(d));) {
    if (name_time(e->d_name) < 0) continue;
    char path[4352];
    struct stat st;
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    if (lstat(path, &st) == 0 && S_ISREG(st.st_mode)) rc = cut_file(path, step, err, err_cap);
  }
  closedir(d);
  return rc;
}

#else  // built without protobuf-c: no event files, said where a run would open one

struct TbWriter {
  int unused;
};

bool tb_available(void) { return false; }
const char *tb_path(const TbWriter *w) { return ""; }
int tb_scalar(TbWriter *w, int64_t step, const char *tag, double value) { return -1; }
int tb_image(TbWriter *w, int64_t step, const char *tag, const Image *img) { return -1; }
int tb_flush(TbWriter *w) { return -1; }
int tb_close(TbWriter *w) { return 0; }
int tb_cut(const char *dir, int64_t step, char *err, size_t err_cap) { return 0; }

TbWriter *tb_open(const char *dir, int64_t start_step, char *err, size_t err_cap) {
  snprintf(err, err_cap,
           "this build writes no event files (protobuf-c was not found at build time: bash tools/setup.sh installs "
           "libprotobuf-c-dev and protobuf-c-compiler, then rebuild)");
  return NULL;
}

#endif
